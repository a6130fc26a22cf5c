"""`marsrl train` end to end on the micro world (configs/grpo_micro.yaml: 3 arms x 4 steps, an in-process
rollout worker, wandb offline), then `marsrl report` on what it wrote; resume after a kill equals an
uninterrupted run. One experiment is trained once per test session and shared by the checks."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marsrl.cli import main
from marsrl.report import read_wandb_run

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "grpo_micro.yaml")
TIMING = ("wall_s", "_runtime", "_timestamp")  # wall-clock keys differ between any two runs


def _is_timing(key: str) -> bool:
    return (
        key in TIMING
        or "seconds" in key
        or "tokens_per_s" in key
        or "share_of_step" in key
        or key.endswith(("step_time", "_per_second", "runtime"))
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs")
    code = main(
        [
            "train",
            "--config",
            CONFIG,
            "--set",
            f"output_dir={out}",
            "--set",
            "wandb.mode=offline",
            "--no-progress",
        ]
    )
    assert code == 0
    return out / "grpo_micro"


ARMS = ("strict", "mars", "mars_l0.9")


def test_every_arm_writes_its_folder(experiment):
    for arm in ARMS:
        folder = experiment / arm
        rows = _rows(folder / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2, 3, 4]
        for key in (
            "train/reward",
            "train/loss",
            "train/bias/top2_excess",
            "train/rollout/tau",
            "train/bias/unsupported_mass",
            "train/draft/refreshes",
            "train/policy/version",
        ):
            assert all(key in r for r in rows), (arm, key)
        evals = json.loads((folder / "eval.json").read_text())
        for when in ("before", "after"):
            for name in ("t1", "greedy"):  # the rollout temperature and greedy
                e = evals[when][name]
                assert e["n"] == 50 and e["ci_low"] <= e["accuracy"] <= e["ci_high"]  # the micro n_eval
                assert len(e["correct"]) == 50 and sum(e["correct"]) == e["k"]
        assert evals["after_step"] == 4 and set(evals["comparison"]) >= {"t1", "greedy"}
        curve = _rows(folder / "eval_curve.jsonl")
        assert [r["step"] for r in curve] == [0, 2, 4]  # before, then every eval.every steps
        assert curve[-1]["results"]["t1"]["correct"] == evals["after"]["t1"]["correct"]
        assert [r["step"] for r in rows if "eval/t1_accuracy" in r] == [2, 4]
        assert evals["tau"] >= 1.0
        samples = _rows(folder / "samples.jsonl")
        assert len(samples) == 2 * 4 and all(len(s["tokens"]) == len(s["provenance"]) for s in samples)
        assert (folder / "config.yaml").is_file()
        assert any((folder / "checkpoints").glob("checkpoint-*/marsrl_complete.json"))
        assert [r["train/policy/version"] for r in rows] == [0, 1, 2, 3]
        assert rows[-1]["train/draft/refreshes"] == 2  # refreshed at steps 0 and 2


def test_the_interleaved_timing_covers_every_arm_and_an_a_a_copy(experiment):
    timing = json.loads((experiment / "timing.json").read_text())
    assert set(timing["arms"]) == {*ARMS, "strict (A/A)"} and timing["reference"] == "strict"
    for name, t in timing["arms"].items():
        assert len(t["seconds"]) == timing["repeats"] == 4 and all(s > 0 for s in t["seconds"]), name
        assert len(set(t["tokens"])) == 1, name  # the same prompts and seed: the same work every repeat
    assert timing["arms"]["strict"]["tokens"] == timing["arms"]["strict (A/A)"]["tokens"]
    assert timing["train_seconds"] > 0


def test_bias_figures_per_arm(experiment):
    strict = _rows(experiment / "strict" / "metrics.jsonl")
    for r in strict:
        assert abs(r["train/bias/top2_excess"]) <= 3 * r["train/bias/top2_excess_se"]
        assert abs(r["train/bias/is_ratio_mean"] - 1) <= 1e-4
        assert r["train/bias/unsupported_mass"] == 0
    for arm in ("mars", "mars_l0.9"):
        rows = _rows(experiment / arm / "metrics.jsonl")
        assert sum(r["train/rollout/relaxed_frac"] for r in rows) > 0, arm
        relaxed = [
            r["train/bias/is_ratio_mean_relaxed"] for r in rows if r.get("train/bias/is_ratio_mean_relaxed")
        ]
        assert relaxed and sum(relaxed) / len(relaxed) < 1, arm
    assert all(r["train/bias/unsupported_mass"] > 0 for r in _rows(experiment / "mars" / "metrics.jsonl"))
    assert all(
        r["train/bias/unsupported_mass"] == 0 for r in _rows(experiment / "mars_l0.9" / "metrics.jsonl")
    )


def test_wandb_runs_match_the_metrics_files(experiment):
    for arm in ARMS:
        folder = experiment / arm
        run = read_wandb_run(Path((folder / "wandb_run").read_text().strip()), wait_s=5)
        assert run.group == "grpo_micro" and run.job_type == arm
        assert run.name == f"grpo_micro-{arm}"
        assert "rule:" + ("strict" if arm == "strict" else "mars") in run.tags
        assert run.config["arm"]["name"] == arm
        rows = {r["step"]: r for r in _rows(folder / "metrics.jsonl")}
        history = [h for h in run.history if "train/loss" in h]
        assert len(history) == len(rows)
        for h in history:
            mine = rows[h["train/global_step"]]
            for key, value in h.items():
                if key.startswith("_") or _is_timing(key):
                    continue
                assert key in mine, (arm, key)
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    assert mine[key] is None, (arm, key)
                elif isinstance(value, str):
                    assert mine[key] == value, (arm, key)
                else:
                    assert mine[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (arm, key)


def test_report_reads_back_the_metrics(experiment):
    assert main(["report", str(experiment)]) == 0
    report = experiment / "report"
    assert (report / "completions.html").read_text().count("relaxed") > 0
    assert (report / "verdict.txt").read_text().strip()
    table = json.loads((report / "table.json").read_text())
    assert set(ARMS) <= set(json.dumps(table).replace('"', " ").split())
    for png in report.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import csv

    with open(report / "reward_step.csv") as f:
        drawn = [r for r in csv.DictReader(f) if r["arm"] == "mars"]
    rows = _rows(experiment / "mars" / "metrics.jsonl")
    assert [float(r["y"]) for r in drawn] == pytest.approx([r["train/reward"] for r in rows])


def test_existing_folder_is_refused_without_resume(experiment, capsys):
    code = main(["train", "--config", CONFIG, "--set", f"output_dir={experiment.parent}", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume" in err[0] and "Traceback" not in err[0]


def _numbers_equal(a: dict, b: dict, where) -> None:
    for key, value in a.items():
        if _is_timing(key) or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        assert b[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (where, key)


def test_resume_after_a_kill_equals_an_uninterrupted_run(experiment, tmp_path):
    """One arm killed (SIGKILL) at every point a run can stop, then resumed, until it finishes; every
    resume picks up exactly where the last whole state was, and the outcome equals the shared
    uninterrupted experiment's mars_l0.9 arm on every non-timing value (to 1e-6 relative: CPU,
    deterministic; the killed runs are fresh processes with one arm and wandb off, which the training rows
    and the evaluation do not depend on). The kills, in order:

    1. after the checkpoint of step 2 (a mid-run save);
    2. after the LAST step's metrics row, before its checkpoint: the resume retrains steps 3-4 from step 2;
    3. after the final checkpoint (step 4), then that checkpoint's weights are cut to half: the resume
       says so in one line, falls back to step 2 and trains 3-4 again;
    4. during the final evaluation: the resume loads step 4 and trains nothing;
    5. during the report: every arm is finished and kept, only the report is written.
    """
    arm = "arms=[{name: mars_l0.9, rule: mars, relax_prob: 0.9}]"
    out = tmp_path / "b"
    common = [sys.executable, "-m", "marsrl", "train", "--config", CONFIG, "--set", arm]
    common += ["--set", "wandb.mode=disabled", "--set", f"output_dir={out}", "--no-progress"]
    folder = out / "grpo_micro" / "mars_l0.9"

    def run(*extra, kill: dict | None = None, code: int = -9):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MARSRL_KILL")}
        done = subprocess.run([*common, *extra], env={**env, **(kill or {})}, capture_output=True, text=True)
        assert done.returncode == code, (kill, done.stderr[-3000:])
        return done

    run("--no-report", kill={"MARSRL_KILL_AFTER_STEP": "2"})
    assert [r["step"] for r in _rows(folder / "metrics.jsonl")] == [1, 2]
    run("--no-report", "--resume", kill={"MARSRL_KILL_AT": "log:4"})
    assert [r["step"] for r in _rows(folder / "metrics.jsonl")] == [1, 2, 3, 4]
    assert not (folder / "checkpoints" / "checkpoint-4").exists()
    run("--no-report", "--resume", kill={"MARSRL_KILL_AFTER_STEP": "4"})
    weights = folder / "checkpoints" / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    damaged = run("--no-report", "--resume", kill={"MARSRL_KILL_AT": "eval_after"})
    said = [line for line in damaged.stderr.splitlines() if "not resuming from checkpoint-4" in line]
    assert len(said) == 1 and "model.safetensors" in said[0], damaged.stderr[-3000:]
    evaluating = run("--resume", kill={"MARSRL_KILL_AT": "report"}, code=-9)
    assert "not resuming" not in evaluating.stderr
    assert "after" in json.loads((folder / "eval.json").read_text())
    run("--resume", code=0)

    a = _rows(experiment / "mars_l0.9" / "metrics.jsonl")
    b = _rows(folder / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        _numbers_equal(ra, rb, ra["step"])
    sa, sb = _rows(experiment / "mars_l0.9" / "samples.jsonl"), _rows(folder / "samples.jsonl")
    assert [s["step"] for s in sb] == [s["step"] for s in sa]
    for x, y in zip(sa, sb, strict=True):
        assert x["token_ids"] == y["token_ids"] and x["provenance"] == y["provenance"]
    ea = json.loads((experiment / "mars_l0.9" / "eval.json").read_text())
    eb = json.loads((folder / "eval.json").read_text())
    for when in ("before", "after"):
        for name in ("t1", "greedy"):
            _numbers_equal(ea[when][name], eb[when][name], (when, name))
            assert ea[when][name]["correct"] == eb[when][name]["correct"], (when, name)
    curve = _rows(folder / "eval_curve.jsonl")
    assert [r["step"] for r in curve] == [0, 2, 4]  # every evaluation once
    assert eb["tau"] == pytest.approx(ea["tau"], rel=1e-6)
    steps = sorted(int(p.name.split("-")[1]) for p in (folder / "checkpoints").glob("checkpoint-*"))
    assert steps and max(steps) == 4
    assert (out / "grpo_micro" / "report" / "verdict.txt").is_file()


def test_ctrl_c_stops_with_one_line_and_a_whole_checkpoint(tmp_path):
    """SIGINT while training, a step past a complete checkpoint: exit 130, the last stderr line says where
    it stopped and how to go on, and the newest complete checkpoint still matches its manifest. (Any
    complete checkpoint, not only step 2's: on a loaded machine the test may look only after the rotation
    removed it.)"""
    from marsrl.trainer.checkpoint import check_manifest

    out = tmp_path / "c"
    cmd = [sys.executable, "-m", "marsrl", "train", "--config", CONFIG, "--set", f"output_dir={out}"]
    cmd += ["--set", "arms=[{name: strict}]", "--set", "wandb.mode=disabled", "--set", "data.n_eval=8"]
    cmd += ["--set", "trainer.max_steps=200", "--no-progress", "--no-report"]
    folder = out / "grpo_micro" / "strict" / "checkpoints"
    rows = out / "grpo_micro" / "strict" / "metrics.jsonl"

    def training_past_a_checkpoint() -> bool:  # a complete checkpoint, and a later step logged
        done = [int(m.parent.name[11:]) for m in folder.glob("checkpoint-*/marsrl_complete.json")]
        steps = (
            [json.loads(x).get("step", 0) for x in rows.read_text().splitlines()] if rows.is_file() else []
        )
        return bool(done) and max(steps, default=0) > min(done)

    # SIGINT at its default in the child, as a terminal's foreground job has it: a test run started in
    # the background (``pytest &``, a CI runner's non-interactive shell) passes SIGINT down *ignored*,
    # and a Python started that way never raises KeyboardInterrupt
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
    )
    deadline = time.monotonic() + 600
    while not training_past_a_checkpoint() and proc.poll() is None:
        assert time.monotonic() < deadline, "no step past a complete checkpoint within 10 minutes"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    last = err.strip().splitlines()[-1]
    said = r"marsrl train: interrupted at arm strict, step \d+; continue with --resume"
    assert re.fullmatch(said, last), last
    assert "Traceback" not in err
    complete = sorted(folder.glob("checkpoint-*/marsrl_complete.json"), key=lambda m: int(m.parent.name[11:]))
    assert complete and check_manifest(complete[-1].parent) is None


def test_seeds_run_every_arm_per_seed_and_the_report_aggregates(tmp_path):
    """seeds: [0, 1] with one short arm: a folder per seed, each with its report, and the aggregate over
    the seeds; the two seeds train differently (their rewards differ) from the same data."""
    out = tmp_path / "s"
    settings = [
        f"output_dir={out}",
        "seeds=[0, 1]",
        "arms=[{name: strict}, {name: mars_l0.9, rule: mars, relax_prob: 0.9}]",
        "trainer.max_steps=2",
        "data.n_eval=8",
        "timing_repeats=0",
        "wandb.mode=disabled",
    ]
    code = main(["train", "--config", CONFIG, *(x for s in settings for x in ("--set", s)), "--no-progress"])
    assert code == 0
    root = out / "grpo_micro"
    for seed in (0, 1):
        folder = root / f"seed-{seed}"
        assert [r["step"] for r in _rows(folder / "strict" / "metrics.jsonl")] == [1, 2]
        assert (folder / "report" / "table.json").is_file()
        assert "seed: 1" in (folder / "strict" / "config.yaml").read_text() or seed == 0
    r0 = [r["train/reward"] for r in _rows(root / "seed-0" / "strict" / "metrics.jsonl")]
    s0 = _rows(root / "seed-0" / "strict" / "samples.jsonl")
    s1 = _rows(root / "seed-1" / "strict" / "samples.jsonl")
    assert r0 and [s["token_ids"] for s in s0] != [s["token_ids"] for s in s1]  # other seed, other draws
    agg = json.loads((root / "report" / "seeds.json").read_text())
    assert agg["seeds"] == ["seed-0", "seed-1"]
    slot = agg["comparisons"]["mars_l0.9"]["top2_excess_diff"]
    assert set(slot["per_seed"]) == {"seed-0", "seed-1"} and slot["n"] == 2
    assert "## mars_l0.9 vs the reference" in (root / "report" / "seeds.md").read_text()
    # each arm's held-out gain per seed, read from the seeds' own eval.json comparisons
    gain = agg["learning"]["strict"]["t1"]
    for seed in (0, 1):
        ev = json.loads((root / f"seed-{seed}" / "strict" / "eval.json").read_text())
        assert gain["per_seed"][f"seed-{seed}"] == pytest.approx(ev["comparison"]["t1"]["diff"])
    assert (
        "## Learning: held-out accuracy after training minus before"
        in (root / "report" / "seeds.md").read_text()
    )
