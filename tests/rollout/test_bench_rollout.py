"""bench.rollout runs on the session's Ray cluster at tiny sizes and reports every figure it
documents (timings are not asserted, only that they exist and the 1-actor pool equals in-process)."""

import importlib

import pytest


@pytest.mark.usefixtures("ray_cluster")
def test_rollout_bench_reports_side_by_side(capsys):
    module = importlib.import_module("bench.rollout")
    args = ["--layers", "2", "--hidden", "64", "--vocab", "256", "--prompts", "4", "--prompt-len", "8"]
    args += ["--n", "2", "--new-tokens", "8", "--repeats", "1", "--cpus-per-actor", "0.5", "--no-probe"]
    out = module.main([*args, "--update-mb", "0"])  # the large update: same code, a larger model
    assert out["pool_1"]["equals_in_process"] is True
    for key in ("in_process", "pool_1", "pool_2"):
        assert out[key]["seconds"] > 0 and out[key]["tokens_per_s"] > 0
    assert out["ray_hop_ratio"] > 0 and out["speedup_2_actors"] > 0
    update = out["weight_update"]
    assert update["mb"] > 0 and update["ratio_old_over_new"] > 0
    for path in ("old", "new"):
        assert update[path]["seconds"] > 0 and len(update[path]["times"]) == 1
    assert update["new"]["sent_mb"] == update["old"]["sent_mb"] == update["mb"]  # fp32 both, nothing tied
    assert "weight_update_large" not in out
    assert "cpu_probe" not in out  # --no-probe; the probe itself is a plain Ray task
    assert '"ray_hop_ratio"' in capsys.readouterr().out
