"""The main job end to end on the micro world: strict and mars rollouts through the pool, the table's
figures, and every trajectory in the JSONL file."""

import json

from marsrl.commands.compare import CompareConfig, format_report, run_compare
from marsrl.verify import Provenance


def test_rollouts_compare_on_micro(ray_cluster, tmp_path):
    out = tmp_path / "rollouts.jsonl"
    cfg = CompareConfig(preset="micro", num_prompts=3, group_size=2, out=str(out), theta=0.5)
    report = run_compare(cfg, progress=False)
    strict, mars = report["rules"]["strict"], report["rules"]["mars"]
    assert strict["relaxed_frac"] == 0
    assert abs(strict["is_ratio_mean"] - 1) < 1e-3 and abs(strict["kl_behavior"]) < 1e-4  # lossless
    assert mars["relaxed_frac"] > 0  # theta = 0.5 relaxes on the micro target
    for fig in (strict, mars):
        assert fig["completions"] == 6 and fig["tau"] >= 1 and 0 <= fig["mean_reward"] <= 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and {r["rule"] for r in rows} == {"strict", "mars"}
    for r in rows:
        n = len(r["completion_ids"])
        assert all(len(r[k]) == n for k in ("provenance", "behavior_logprobs", "target_logprobs", "is_top2"))
        assert r["policy_version"] is not None
    assert any(p == Provenance.RELAXED for r in rows if r["rule"] == "mars" for p in r["provenance"])
    assert "top-2 excess" in format_report(report)
