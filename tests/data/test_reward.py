"""Answer extraction and the TRL-style rewards on hand-written cases."""

import inspect

import pytest

from marsrl.data import (
    canonical_number,
    extract_answer,
    extract_last_number,
    format_reward,
    generate_problems,
    gsm8k_reward,
    score,
)

GOLD_TEXT = "She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("So she has 7.\n#### 7", "7"),
        ("#### 1,234", "1234"),
        ("#### 1,450,000", "1450000"),
        ("#### -3", "-3"),
        ("#### -$5", "-5"),
        ("#### $12.50.", "12.5"),
        ("#### 12.0", "12"),
        ("#### 1000.00", "1000"),
        ("#### 0.0", "0"),
        ("#### 18 apples", "18"),
        ("####18", "18"),
        ("#### 5\n#### 6", "6"),  # the LAST marker counts
        ("#### 6 then #### oops", None),
        ("no marker, 42", None),
        ("####", None),
        ("#### \n12", None),  # the number must be on the marker's line
        ("#### none", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_equal_numbers_compare_equal():
    forms = ["1,000", "1000.0", "1000", "$1000.", "1000.000"]
    assert {canonical_number(f) for f in forms} == {"1000"}
    assert {extract_answer(f"#### {f}") for f in forms} == {"1000"}
    assert canonical_number("-0") == "0"
    assert canonical_number("12 apples") is None


def test_extract_last_number_is_lenient():
    assert extract_last_number("She has 3 + 4 = 7 apples.") == "7"
    assert extract_last_number("It costs $1,200.50 in all.") == "1200.5"
    assert extract_last_number("so 10 - 5") == "5"  # a detached minus is subtraction
    assert extract_last_number("it is -5") == "-5"
    assert extract_last_number("<<16-3-4=9>>9 eggs") == "9"
    assert extract_last_number("no digits") is None


def test_gsm8k_reward_cases():
    completions = [
        "9 * 2 = 18\n#### 18",  # correct
        "#### 19",  # wrong
        "the answer is 18",  # no marker
        "#### ",  # marker, no number
        "",  # empty
        "#### 18.0",  # decimal form of the same number
        "#### $18.",  # $ and final period
    ]
    got = gsm8k_reward(prompts=["p"] * 7, completions=completions, answer=[GOLD_TEXT] * 7)
    assert got == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_gold_as_bare_number_or_full_text():
    assert gsm8k_reward(completions=["#### 1,234"], answer=["1234"]) == [1.0]
    assert gsm8k_reward(completions=["#### 1234"], answer=["1,234"]) == [1.0]
    assert gsm8k_reward(completions=["#### 1234"], answer=["x\n#### 1,234"]) == [1.0]
    assert gsm8k_reward(completions=["#### -7"], answer=["-7"]) == [1.0]
    assert gsm8k_reward(completions=["#### 7"], answer=["-7"]) == [0.0]
    assert gsm8k_reward(completions=["#### 12"], answer=["12.0"]) == [1.0]
    assert gsm8k_reward(completions=["#### 12.5"], answer=["12"]) == [0.0]
    assert gsm8k_reward(completions=["#### 12", "#### 13"], answer="12") == [1.0, 0.0]  # one gold for all
    assert gsm8k_reward(completions=["#### 12"], gold=["12"]) == [1.0]  # the 'gold' column instead


def test_chat_message_completions():
    chat = [
        [{"role": "assistant", "content": "So 18.\n#### 18"}],
        [{"role": "assistant", "content": "#### 2"}],
    ]
    assert gsm8k_reward(
        prompts=[[{"role": "user", "content": "q"}]] * 2, completions=chat, answer=["18", "3"]
    ) == [
        1.0,
        0.0,
    ]
    assert format_reward(completions=chat) == [1.0, 1.0]


def test_trl_call_convention():
    """TRL passes prompts, completions, completion_ids and every dataset column as keywords."""
    got = gsm8k_reward(
        prompts=["q"],
        completions=["#### 3"],
        completion_ids=[[1, 2]],
        answer=["#### 3"],
        question=["q"],
        trainer_state=None,
    )
    assert got == [1.0]
    assert format_reward(prompts=["q"], completions=["#### 3"], completion_ids=[[1]], answer=["3"]) == [1.0]
    assert gsm8k_reward.__name__ == "gsm8k_reward" and format_reward.__name__ == "format_reward"
    assert "kwargs" in inspect.signature(gsm8k_reward).parameters


def test_format_reward_cases():
    completions = [
        "Step 1: 3 + 4 = 7.\n#### 7",
        "#### 7\n",  # trailing newline is fine
        "#### 1,234",
        "#### -2.5",
        "#### 7 apples",  # words after the number
        "#### $7",
        "#### 7\nThanks!",  # not the last line
        "The answer is 7",
        "####",
        "",
    ]
    assert format_reward(completions=completions) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_score_and_generated_problems_agree():
    for p in generate_problems(300, 11, "hard"):
        assert score(p["answer"], p["gold"]) == 1.0
        assert score(p["answer"], str(int(p["gold"]) + 1)) == 0.0
    problems = generate_problems(50, 12)
    assert (
        gsm8k_reward(completions=[p["answer"] for p in problems], answer=[p["answer"] for p in problems])
        == [1.0] * 50
    )
    assert format_reward(completions=[p["answer"] for p in problems]) == [1.0] * 50


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="answer"):
        gsm8k_reward(completions=["#### 1"])
    with pytest.raises(ValueError, match="answer"):
        gsm8k_reward(completions=["#### 1", "#### 2"], answer=["1"])
    with pytest.raises(ValueError, match="answer"):
        gsm8k_reward(completions=["#### 1"], answer=["no number here"])
    with pytest.raises(ValueError, match="completions"):
        gsm8k_reward(completions=[42], answer=["1"])
    with pytest.raises(ValueError, match="completions"):
        format_reward()
