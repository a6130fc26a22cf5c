"""The report's timings from the interleaved A/B (timing.json): ratios over repeats paired by repeat,
the step-time estimate, and the A/A control that must read 1.00 within its interval."""

from __future__ import annotations

import numpy as np
import pytest

from marsrl.report.compare import aa_check, interleaved_figures, step_cost


def _timing(rng, slow: float = 1.0, mars: float = 0.8, repeats: int = 12) -> dict:
    load = 1.0 + 0.5 * rng.random(repeats)  # machine load shared by the arms within a repeat
    noise = lambda: 1.0 + 0.03 * rng.standard_normal(repeats)  # noqa: E731
    arms = {
        "strict": 2.0 * load * noise(),
        "strict (A/A)": 2.0 * slow * load * noise(),
        "mars": 2.0 * mars * load * noise(),
    }
    return {
        "repeats": repeats,
        "train_seconds": 3.0,
        "arms": {n: {"seconds": list(s), "tokens": [1000] * repeats} for n, s in arms.items()},
    }


def test_aa_reads_one_and_a_real_difference_resolves():
    """Seed 0, 200 synthetic jobs of 12 repeats with load shared within a repeat (what interleaving
    buys): the A/A control resolves in at most 15% of them (nominal 5%; a percentile bootstrap over 12
    values covers short of 95%, ~11% observed), a 20% faster arm in all."""
    rng = np.random.default_rng(0)
    aa_resolved = mars_resolved = 0
    for _ in range(200):
        t = _timing(rng)
        aa = aa_check(t, "strict", n_boot=400)
        assert aa.low <= aa.value <= aa.high
        aa_resolved += aa.resolved
        mars_resolved += interleaved_figures(t, "mars", "strict", 400, 0)["rollout_time_ratio"].resolved
    assert aa_resolved <= 30 and mars_resolved == 200


def test_a_slower_copy_fails_the_aa_control():
    t = _timing(np.random.default_rng(1), slow=1.15)
    assert aa_check(t, "strict").resolved


def test_a_failed_aa_control_voids_the_timing_figures_in_the_verdict():
    """When the A/A copy reads a resolved difference, no timing ratio is reported as a finding: each is
    listed as not resolved, with the reason; figures from other data keep their reading."""
    from marsrl.report.compare import (
        BY_CURVES,
        BY_STEPS,
        TIMED_AXIS,
        UNFAIR_TIMING,
        Figure,
        void_unfair_timing,
    )
    from marsrl.report.verdict import arm_paragraph

    t = _timing(np.random.default_rng(1), slow=1.15)
    figs = dict(interleaved_figures(t, "mars", "strict", 400, 0))
    figs["top1_excess_diff"] = Figure("top-1 excess", 0.02, 0.01, 0.03, 0.0, BY_STEPS, 25)
    # a time to a reward level on the timing's per-step costs falls with the timing; on wall-clock it stays
    figs["ttt_timed"] = Figure("time to", 0.2, 0.1, 0.5, 1.0, BY_CURVES, 25, {"time_axis": TIMED_AXIS})
    figs["ttt_wall"] = Figure("time to", 0.2, 0.1, 0.5, 1.0, BY_CURVES, 25, {"time_axis": "wall-clock"})
    assert figs["rollout_time_ratio"].resolved  # mars at 0.8 of strict's time: resolved on its own
    fair = void_unfair_timing(
        {"mars": figs}, aa_check(_timing(np.random.default_rng(0)), "strict", n_boot=400)
    )
    assert fair["mars"]["rollout_time_ratio"].resolved
    voided = void_unfair_timing({"mars": figs}, aa_check(t, "strict"))["mars"]
    assert not any(voided[k].resolved for k in ("rollout_time_ratio", "tokens_per_s_ratio", "ttt_timed"))
    assert fair["mars"]["ttt_timed"].resolved and voided["ttt_wall"].resolved
    assert (
        voided["top1_excess_diff"].resolved
        and voided["rollout_time_ratio"].as_dict()["void"] == UNFAIR_TIMING
    )
    text = arm_paragraph("mars", "strict", voided, [])
    resolved_part, rest = text.split("Not resolved at this size:")
    assert "top-1 excess" in resolved_part and "rollout seconds per step" not in resolved_part
    assert "rollout seconds per step (interleaved) 0." in rest and UNFAIR_TIMING in rest
    # the Amdahl projection takes its speed-up from the same timing: it says so
    from marsrl.report.compare import _projection_interleaved
    from marsrl.report.verdict import projection_sentence

    t["train_seconds"] = 4.0
    p = _projection_interleaved(t, "mars", "strict", 400, 0)
    assert UNFAIR_TIMING not in projection_sentence("mars", "strict", p, None)
    assert projection_sentence("mars", "strict", {**p, "void": UNFAIR_TIMING}, None).endswith(
        f"Its speed-up is no finding: {UNFAIR_TIMING}."
    )


def test_step_time_and_tokens_per_s_from_the_timing():
    t = {
        "train_seconds": 3.0,
        "arms": {
            "strict": {"seconds": [2.0, 2.0], "tokens": [100, 100]},
            "mars": {"seconds": [1.0, 1.0], "tokens": [100, 100]},
        },
    }
    figs = interleaved_figures(t, "mars", "strict", 100, 0)
    assert figs["step_time_ratio"].value == pytest.approx(4.0 / 5.0)
    assert figs["tokens_per_s_ratio"].value == pytest.approx(2.0)
    assert figs["rollout_time_ratio"].value == pytest.approx(0.5)
    assert step_cost(t, "mars") == pytest.approx(4.0) and step_cost(t, "nope") is None
    assert aa_check(t, "strict") is None  # no A/A copy in this timing
