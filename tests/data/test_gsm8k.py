"""Loading GSM8K-format data: the real test set from ../shared (skipped when absent), small local files
in every accepted format, and a hub name failing fast and clearly offline."""

import json
import time
from pathlib import Path

import pytest

from marsrl.data import extract_answer, format_reward, gsm8k_reward, load_gsm8k

GSM8K_TEST = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"
ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {
        "question": "A house costs $1,000 twice. Total?",
        "answer": "2 * 1000 = <<2*1000=2000>>2,000\n#### 2,000",
    },
]


@pytest.fixture(scope="module")
def real_rows() -> list[dict]:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"the real GSM8K test set is not at {GSM8K_TEST} (shared/ is absent)")
    return [json.loads(line) for line in GSM8K_TEST.read_text().splitlines() if line.strip()]


def test_real_gold_answers_all_extract(real_rows):
    assert len(real_rows) == 1319
    golds = [extract_answer(r["answer"]) for r in real_rows]
    assert all(g is not None for g in golds)
    assert all(g.lstrip("-").isdigit() for g in golds)  # GSM8K's answers are integers
    assert sum("," in r["answer"].rsplit("####", 1)[1] for r in real_rows) > 0  # commas are exercised


def test_real_answers_score_one_against_themselves(real_rows):
    answers = [r["answer"] for r in real_rows]
    assert gsm8k_reward(prompts=[r["question"] for r in real_rows], completions=answers, answer=answers) == [
        1.0
    ] * len(answers)
    assert format_reward(completions=answers) == [1.0] * len(answers)
    shifted = answers[1:] + answers[:1]  # someone else's answer is (almost always) wrong
    assert sum(gsm8k_reward(completions=shifted, answer=answers)) < 0.05 * len(answers)


def test_load_real_file(real_rows):
    ds = load_gsm8k(str(GSM8K_TEST))
    assert ds.num_rows == 1319
    assert ds.column_names == ["question", "answer", "gold"]
    assert ds[0]["question"] == real_rows[0]["question"]
    assert ds["gold"] == [extract_answer(r["answer"]) for r in real_rows]
    assert ds[0]["gold"] == "18"


def _write(path: Path, fmt: str, rows: list[dict]) -> Path:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_local_formats(tmp_path, fmt):
    extra = [dict(r, id=i) for i, r in enumerate(ROWS)]  # other columns are dropped
    ds = load_gsm8k(str(_write(tmp_path / f"rows.{fmt}", fmt, extra)), split="ignored")
    assert ds.column_names == ["question", "answer", "gold"]
    assert ds["gold"] == ["7", "2000"]


def test_missing_column_names_file_and_column(tmp_path):
    path = _write(tmp_path / "bad.jsonl", "jsonl", [{"question": "q", "solution": "#### 1"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl.*'answer'"):
        load_gsm8k(str(path))


def test_answer_without_marker_is_reported(tmp_path):
    path = _write(tmp_path / "nomark.jsonl", "jsonl", [ROWS[0], {"question": "q", "answer": "just 5"}])
    with pytest.raises(ValueError, match=r"nomark\.jsonl.*line 2"):  # the file's line, 1-based
        load_gsm8k(str(path))


def test_missing_or_unreadable_file(tmp_path):
    with pytest.raises(ValueError, match=r"missing\.jsonl.*no such file"):
        load_gsm8k(str(tmp_path / "missing.jsonl"))
    (tmp_path / "broken.jsonl").write_text('{"question": "q", "answer": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl"):
        load_gsm8k(str(tmp_path / "broken.jsonl"))
    with pytest.raises(ValueError, match=r"expected a \.jsonl"):
        load_gsm8k(str(tmp_path))


def test_hub_name_fails_fast_offline(monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"openai/gsm8k.*local \.jsonl"):
        load_gsm8k("openai/gsm8k", split="test", config="main")
    assert time.monotonic() - start < 10
