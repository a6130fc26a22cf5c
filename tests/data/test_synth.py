"""The synthetic problem generator: exact arithmetic, determinism, difficulty and measured variety.

Sample sizes: 2,000 problems per preset (seed 0), generated once per module (about 1 s in all).
"""

import collections
import random
import re
import statistics
from fractions import Fraction

import pytest

from marsrl.data import (
    PRESETS,
    SYSTEM_PROMPT,
    Difficulty,
    extract_answer,
    family_names,
    generate_problems,
    prompt_messages,
    render_prompt,
    synth,
)

N = 2000
ANNOTATION = re.compile(r"<<(?P<expr>[^<>=]+)=(?P<value>[^<>]+)>>(?P<shown>\d[\d,]*)")
WORD_NUMBERS = {"twice": 2, "three times": 3, "four times": 4, "half": 2}


@pytest.fixture(scope="module")
def problems() -> dict[str, list[dict]]:
    return {name: generate_problems(N, 0, name) for name in PRESETS}


def evaluate(expr: str) -> Fraction:
    """A tiny evaluator for + - * / over non-negative integers with the usual precedence (no eval)."""
    tokens = re.findall(r"\d+|[-+*/]|\S", expr)
    pos = 0

    def number() -> Fraction:
        nonlocal pos
        if pos >= len(tokens) or not tokens[pos].isdigit():
            raise ValueError(f"expected a number in {expr!r}")
        pos += 1
        return Fraction(int(tokens[pos - 1]))

    def term() -> Fraction:
        nonlocal pos
        value = number()
        while pos < len(tokens) and tokens[pos] in "*/":
            op = tokens[pos]
            pos += 1
            value = value * number() if op == "*" else value / number()
        return value

    value = term()
    while pos < len(tokens) and tokens[pos] in "+-":
        op = tokens[pos]
        pos += 1
        value = value + term() if op == "+" else value - term()
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r} in {expr!r}")
    return value


def test_evaluator_itself():
    assert evaluate("16-3-4") == 9
    assert evaluate("2+3*4") == 14
    assert evaluate("20/4/5") == 1
    assert evaluate("7/2") == Fraction(7, 2)
    with pytest.raises(ValueError):
        evaluate("2+")


def test_same_seed_same_list_other_seed_other_list():
    a, b, c = generate_problems(200, 5), generate_problems(200, 5), generate_problems(200, 6)
    assert a == b
    assert [p["answer"] for p in a] != [p["answer"] for p in c]
    assert generate_problems(50, 5) == a[:50]  # a prefix: n does not change earlier problems


def test_global_rng_untouched():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    generate_problems(20, 1, "hard")
    assert random.random() == expected


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_answers_recompute_from_steps(problems, preset):
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    for p in problems[preset]:
        assert set(p) >= {"question", "answer", "gold", "steps"}
        values = []
        for s in p["steps"]:
            a, b, value = s["a"], s["b"], s["value"]
            assert all(isinstance(x, int) and x >= 2 for x in (a, b, value)), s
            if s["op"] == "/":
                assert a % b == 0 and a // b == value, s
            else:
                assert ops[s["op"]](a, b) == value, s
            values.append(value)
        assert str(values[-1]) == p["gold"]
        assert extract_answer(p["answer"]) == p["gold"]
        assert p["answer"].endswith(f"\n#### {p['gold']}")
        assert p["answer"].count("####") == 1
        n_lines = len(p["answer"].split("\n")) - 1
        assert n_lines == len(p["steps"])


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_step_operands_come_from_the_question_or_earlier_steps(problems, preset):
    """Each operation uses numbers stated in the question (digits or "twice"/"half") or computed before."""
    for p in problems[preset]:
        q = p["question"]
        known = {int(x.replace(",", "")) for x in re.findall(r"\d[\d,]*", q)}
        known |= {v for w, v in WORD_NUMBERS.items() if w in q.lower()}
        for s in p["steps"]:
            assert s["a"] in known and s["b"] in known, (q, s)
            known.add(s["value"])


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_calculator_annotations_are_right(problems, preset):
    for p in problems[preset]:
        found = list(ANNOTATION.finditer(p["answer"]))
        assert len(found) == len(p["steps"]), p["answer"]
        for m, s in zip(found, p["steps"], strict=True):
            value = evaluate(m["expr"])
            assert value == int(m["value"]) == s["value"], m.group(0)
            assert int(m["shown"].replace(",", "")) == s["value"], m.group(0)
            assert m["expr"] == f"{s['a']}{s['op']}{s['b']}"


def test_limits_of_each_preset(problems):
    for name, d in PRESETS.items():
        for p in problems[name]:
            n_lines = len(p["steps"])
            assert d.min_steps <= n_lines <= d.max_steps
            assert all(s["value"] <= d.max_value for s in p["steps"])
            ops = {s["op"] for s in p["steps"]}
            assert d.allow_multiplication or "*" not in ops
            assert d.allow_division or "/" not in ops


def test_harder_presets_have_more_steps_and_larger_numbers(problems):
    steps = {k: statistics.mean(len(p["steps"]) for p in v) for k, v in problems.items()}
    golds = {k: statistics.median(int(p["gold"]) for p in v) for k, v in problems.items()}
    assert steps["easy"] < steps["default"] < steps["hard"], steps
    assert golds["easy"] < golds["default"] < golds["hard"], golds
    assert steps["hard"] > 2 * steps["easy"] and golds["hard"] > 10 * golds["easy"]


def test_every_family_and_operation_occurs(problems):
    default = problems["default"]
    assert {p["family"] for p in default} == set(family_names())
    assert {s["op"] for p in default for s in p["steps"]} == {"+", "-", "*", "/"}
    assert {s["op"] for p in problems["easy"] for s in p["steps"]} == {"+", "-", "*"}


@pytest.mark.parametrize("preset", ["default", "hard"])
def test_phrasing_variety_per_step_type(problems, preset):
    """Every (family, step type) slot seen >= 30 times uses >= 3 sentence shapes, every step type
    >= 3 connectives, and shape x connective gives >= 6 ways per slot."""
    shapes, combos, connectives = (collections.defaultdict(set) for _ in range(3))
    seen = collections.Counter()
    for p in problems[preset]:
        for s in p["steps"]:
            slot = (p["family"], s["kind"])
            shapes[slot].add(s["phrasing"])
            combos[slot].add((s["phrasing"], s["connective"]))
            seen[slot] += 1
            connectives[s["kind"]].add(s["connective"])
    busy = [slot for slot in shapes if seen[slot] >= 30]
    assert len(busy) >= 40
    assert all(len(shapes[slot]) >= 3 for slot in busy), {s: len(shapes[s]) for s in busy}
    assert all(len(combos[slot]) >= 6 for slot in busy), {s: len(combos[s]) for s in busy}
    assert all(len(c) >= 3 for c in connectives.values()), {k: len(c) for k, c in connectives.items()}


def test_formatting_variants_all_occur(problems):
    answers = [p["answer"] for p in problems["default"]]
    money = [p for p in problems["default"] if p["family"] == "shopping"]
    assert sum("Step 1:" in a for a in answers) > 0.3 * N
    assert sum(a.startswith("Step 1:") for a in answers) < 0.7 * N
    assert any(" + " in a for a in answers) and any(re.search(r"\d\+\d", a) for a in answers)
    assert any(" x " in a for a in answers) and any(" * " in a for a in answers)
    assert any("$" in p["question"] for p in money) and any(" dollars" in p["question"] for p in money)
    hard = [p["answer"] for p in problems["hard"]]
    assert any(re.search(r">>\d{1,3},\d{3}", a) for a in hard)  # "1,200" shown, 1200 computed


def test_one_plan_written_many_ways():
    """The same numbers rendered with 200 different word draws: many distinct texts, one answer."""
    d = PRESETS["default"]
    plan_rng = random.Random(3)
    for family in family_names():
        start, events = synth._plan(plan_rng, synth._kinds_of(family), d)
        texts, values = set(), set()
        for seed in range(200):
            rng = random.Random(seed)
            _, answer, steps = synth._render(rng, family, start, events, synth._Style.draw(rng))
            texts.add(answer)
            values.add(tuple(s["value"] for s in steps))
        assert len(values) == 1
        assert len(texts) >= 150, (family, len(texts))


def test_vocabulary_is_modest(problems):
    words = {
        w.lower()
        for v in problems.values()
        for p in v
        for w in re.findall(r"[A-Za-z]+", p["question"] + p["answer"])
    }
    assert 150 <= len(words) <= 450, len(words)


def test_difficulty_checks_name_the_field():
    for field, bad in [("min_steps", 0), ("max_number", 5), ("max_factor", 1), ("max_value", 150)]:
        with pytest.raises(ValueError, match=field):
            Difficulty(**{field: bad})
    with pytest.raises(ValueError, match="max_steps"):
        Difficulty(min_steps=3, max_steps=2)
    with pytest.raises(ValueError, match="difficulty"):
        generate_problems(1, 0, "impossible")
    with pytest.raises(ValueError, match="seed"):
        generate_problems(1, "0")
    with pytest.raises(ValueError, match="n must"):
        generate_problems(-1, 0)
    assert Difficulty.preset("default") == Difficulty() == PRESETS["default"]


def test_custom_difficulty_without_multiplication_or_division():
    d = Difficulty(min_steps=3, max_steps=3, max_number=50, allow_multiplication=False, allow_division=False)
    ps = generate_problems(300, 1, d)
    assert all(len(p["steps"]) == 3 for p in ps)
    assert {s["op"] for p in ps for s in p["steps"]} == {"+", "-"}


def test_prompt_layout():
    q = "Tom has 3 apples. How many?"
    assert render_prompt(q) == f"Question: {q}\nAnswer:\n"
    assert prompt_messages(q) == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": q},
    ]
    assert "####" in SYSTEM_PROMPT
    with pytest.raises(ValueError, match="question"):
        render_prompt("  ")


def test_rows_fit_a_datasets_table():
    import datasets

    ds = datasets.Dataset.from_list(generate_problems(50, 2, "hard"))
    assert ds.column_names == ["question", "answer", "gold", "family", "steps"]
    assert ds[0]["steps"][0]["value"] == generate_problems(1, 2, "hard")[0]["steps"][0]["value"]
