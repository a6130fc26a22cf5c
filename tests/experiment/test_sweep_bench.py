"""bench/sweep.py runs a configuration through ``marsrl train``'s own arm code (``run.run_arm``) and
records the paired before / after comparison, the evaluation curve and the per-step reward; a second
run reuses the first one's evaluation before training."""

import json


def test_sweep_runs_the_main_jobs_arm_and_reuses_the_before_evaluation(tmp_path, monkeypatch):
    from bench import sweep
    from marsrl.experiment import evaluate

    calls = []
    real = evaluate.evaluate_policy

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate_policy", counted)

    out = tmp_path / "sweep.json"
    sets = ["trainer.max_steps=2", "eval.every=1", "data.n_eval=16"]
    argv = ["--config", "configs/grpo_micro.yaml", "--runs", "base", "lr1e-4", "--out", str(out)]
    for s in sets:
        argv += ["--set", s]
    assert sweep.main(argv) == 0
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"base", "lr1e-4"}
    for run in runs.values():
        assert run["steps"] == 2 and len(run["reward_per_step"]) == 2
        assert [c["step"] for c in run["curve"]] == [0, 1, 2]
        for name in ("t1", "greedy"):
            assert run["before"][name]["n"] == 16
            paired = run["paired"][name]
            assert paired["before"] == run["before"][name]["accuracy"]
            assert paired["after"] == run["after"][name]["accuracy"]
            assert paired["gains"] + paired["losses"] <= 16
    # the policy before training is the same: evaluated once (then steps 1 and 2 of each run)
    assert len(calls) == 1 + 2 + 2
    assert runs["base"]["before"] == runs["lr1e-4"]["before"]
    assert "trainer.learning_rate=1.0e-4" in runs["lr1e-4"]["overrides"]
