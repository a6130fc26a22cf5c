"""bench/train.py's fused comparison and refresh summary without training: ``run`` replaced by fixed
per-step rows. The configurations interleave (the order rotated each repeat), the first step of each run
is left out, and the fused / two-forward ratio is the ratio of their step seconds with an interval that
holds it; the refresh summary reads tau, reward and the refresh's cost per run."""

from __future__ import annotations

import argparse
import importlib

import pytest


def _bench():
    return importlib.import_module("bench.train")


def test_fused_vs_two_forward_by_hand(monkeypatch):
    bench = _bench()
    calls = []

    def fake_run(preset, arm, steps, out, drafter, overrides):
        fused = "trainer.fuse_policy_forward=true" in overrides
        calls.append("fused" if fused else "two_forward")
        rep = sum(c == calls[-1] for c in calls)  # 1, 2, ...: a slower machine each repeat
        base = (1.7 if fused else 2.0) * rep
        rows = [{"train/step_seconds": 100.0, "train/timing/policy_forward_seconds": 0.0}]  # warm-up
        for i in range(steps - 1):
            refresh = {"train/draft/seconds": 0.1} if i % 2 == 0 else {}
            forward = 0.0 if fused else 0.3 * rep
            rows.append(
                {
                    "train/step_seconds": base + 0.01 * i,
                    "train/timing/policy_forward_seconds": forward,
                    **refresh,
                }
            )
        return rows

    monkeypatch.setattr(bench, "run", fake_run)
    args = argparse.Namespace(preset="micro", steps=5, rounds=3, set=None)
    out = bench.fused(args)
    assert calls == ["fused", "two_forward", "two_forward", "fused", "fused", "two_forward"]
    assert out["fused"]["steps_measured"] == out["two_forward"]["steps_measured"] == 12
    r = out["fused_over_two_forward"]
    assert r["n"] == 12 and r["value"] == pytest.approx(0.85, abs=0.01)
    assert r["ci"][0] <= r["value"] <= r["ci"][1]
    assert out["fused_over_two_forward_no_refresh_steps"]["n"] == 6
    assert out["fused"]["policy_forward_share"] == 0.0 and out["two_forward"]["policy_forward_share"] > 0.1


def test_refresh_summary_by_hand(monkeypatch):
    bench = _bench()
    seen = []

    def fake_run(preset, arm, steps, out, drafter, overrides):
        seen.append(list(overrides))
        every = int(next(o for o in overrides if o.startswith("trainer.draft_refresh_every=")).split("=")[1])
        taus = [4.0, 4.0, 4.0, 3.9, 3.9, 3.9] if every else [4.0, 4.0, 4.0, 3.0, 3.0, 3.0]
        rows = []
        for tau in taus:
            row = {"train/rollout/tau": tau, "train/reward": 0.5, "train/step_seconds": 2.0}
            if every:
                row.update(
                    {"train/draft/seconds": 0.1, "train/draft/share_of_step": 0.05, "train/draft/loss": 3.0}
                )
            rows.append(row)
        return rows

    monkeypatch.setattr(bench, "run", fake_run)
    args = argparse.Namespace(preset="micro", steps=6, lr=None, every=1, set=None)
    out = bench.refresh(args)
    assert not any(o.startswith("trainer.learning_rate") for o in seen[0])  # the config's own rate
    assert "trainer.draft_refresh_every=1" in seen[0] and "trainer.draft_refresh_every=0" in seen[1]
    assert out["refresh"]["end_over_start"] == pytest.approx(3.9 / 4.0)
    assert out["refresh_tau_last3_over_no_refresh"] == pytest.approx(1.3)
    assert out["refresh"]["refreshes"] == 6 and out["no_refresh"]["refreshes"] == 0
    assert out["refresh"]["refresh_share_of_its_step"]["median"] == 0.05
