"""`marsrl train` refuses bad input before any work: exit code 2, at most two lines on stderr, no traceback,
the file or field at fault named, and no output folder made. Every case runs in-process (no model is ever
loaded for them); one case runs as a subprocess to see what a user's terminal sees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from marsrl.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "grpo_micro.yaml")
GOOD_ROW = {"question": "Tom has 2 apples and buys 3. How many now?", "answer": "2 + 3 = 5\n#### 5"}


def _data_files(folder: Path) -> dict[str, Path]:
    """Broken data files, each with what its error must name."""
    rows = [json.dumps(GOOD_ROW)] * 3
    files = {
        "empty.jsonl": "",
        "badjson.jsonl": "\n".join([*rows[:2], '{"question": "no closing brace"', rows[2]]) + "\n",
        "noanswer.jsonl": "\n".join([rows[0], json.dumps({"question": "where is the answer?"})]) + "\n",
        "nohashes.jsonl": "\n".join([rows[0], json.dumps({"question": "q", "answer": "five"})]) + "\n",
        "notobject.jsonl": "[1, 2, 3]\n",
        "empty.json": "",
    }
    out = {}
    for name, text in files.items():
        (folder / name).write_text(text)
        out[name] = folder / name
    return out


# (what is set, what stderr must name)
CASES = [
    ("trainer.learning_rate=-0.001", "trainer.learning_rate"),
    ("trainer.learning_rate=0", "trainer.learning_rate"),
    ("trainer.learning_rate=fast", "trainer.learning_rate"),
    ("trainer.num_generations=1", "trainer.num_generations"),
    ("trainer.num_generations=5", "trainer.num_generations"),  # 16 completions per step
    ("trainer.max_steps=0", "trainer.max_steps"),
    ("trainer.max_steps=-3", "trainer.max_steps"),
    ("trainer.beta=-0.1", "trainer.beta"),
    ("trainer.temperature=0", "trainer.temperature"),
    ("trainer.per_device_train_batch_size=0", "trainer.per_device_train_batch_size"),
    ("trainer.max_completion_length=0", "trainer.max_completion_length"),
    ("trainer.loss_type=ppo", "trainer.loss_type"),
    ("trainer.no_such_field=1", "no_such_field"),
    ("rewards=[gsm8k, nope]", "rewards"),
    ("model=tinyworld:nope", "model"),
    ("data.n_eval=0", "n_eval"),
    ("arms=[{name: a, rule: nope}]", "rule"),
    ("pool.num_actors=0", "num_actors"),
    ("torch_threads=0", "torch_threads"),
    ("data.source={missing}", "missing.jsonl"),
    ("data.source={empty.jsonl}", "empty.jsonl"),
    ("data.source={badjson.jsonl}", "line 3"),
    ("data.source={noanswer.jsonl}", "line 2"),
    ("data.source={nohashes.jsonl}", "line 2"),
    ("data.source={notobject.jsonl}", "line 1"),
    ("data.source={empty.json}", "empty.json"),
]


@pytest.mark.parametrize(("setting", "named"), CASES, ids=[c[0].split("=")[0] + ":" + c[1] for c in CASES])
def test_bad_input_is_one_line_before_any_work(setting, named, tmp_path, capsys):
    files = _data_files(tmp_path)
    setting = setting.replace("{missing}", str(tmp_path / "missing.jsonl"))
    for name, path in files.items():
        setting = setting.replace("{" + name + "}", str(path))
    out = tmp_path / "outputs"
    code = main(
        ["train", "--config", CONFIG, "--set", f"output_dir={out}", "--set", setting, "--no-progress"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert 1 <= len(err) <= 2 and "Traceback" not in "\n".join(err), err
    assert named in err[-1], err
    assert not out.exists()


def test_a_missing_config_file_is_named(tmp_path, capsys):
    code = main(["train", "--config", str(tmp_path / "nope.yaml"), "--set", f"output_dir={tmp_path}/o"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "nope.yaml" in err[0]
    assert not (tmp_path / "o").exists()


def test_the_terminal_sees_one_line(tmp_path):
    """As a user's shell runs it: exit 2, one stderr line naming the field, nothing on stdout."""
    out = tmp_path / "outputs"
    cmd = [sys.executable, "-m", "marsrl", "train", "--config", CONFIG, "--set", f"output_dir={out}"]
    run = subprocess.run(
        [*cmd, "--set", "trainer.learning_rate=-0.001"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "trainer.learning_rate" in lines[0], run.stderr
    assert not out.exists()
