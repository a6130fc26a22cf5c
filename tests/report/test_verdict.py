"""The verdict's numbers: when an arm reaches the reference's final reward, how long that took, and
whether the accuracy intervals overlap."""

from pathlib import Path

import pytest

from marsrl.report.verdict import intervals_overlap, time_to_reach

from .helpers import MARS_REWARDS, STRICT_REWARDS


def _rows(rewards, dt):
    return [{"step": s, "wall_s": (s + 1) * dt, "train/reward": r} for s, r in enumerate(rewards)]


def test_time_to_reach():
    target = (STRICT_REWARDS[-2] + STRICT_REWARDS[-1]) / 2
    # strict reaches its own final reward exactly at its last step
    assert time_to_reach(_rows(STRICT_REWARDS, 10.0), target, 2) == (
        100.0,
        {"reached": True, "step": 9, "best": pytest.approx(target)},
    )
    # mars: 2-step means 0.15 .25 .35 .425 .475 .525 -> step 6, wall 7 * 6 s
    t, m = time_to_reach(_rows(MARS_REWARDS, 6.0), target, 2)
    assert t == 42.0 and m["step"] == 6
    t, m = time_to_reach(_rows([0.1, 0.9, 0.1, 0.1], 1.0), 0.6, 2)  # one lucky step is not enough
    assert t is None and not m["reached"] and m["best"] == pytest.approx(0.5)


def test_intervals_overlap():
    assert intervals_overlap((0.1, 0.3), (0.3, 0.5)) is True
    assert intervals_overlap((0.1, 0.2), (0.3, 0.5)) is False
    assert intervals_overlap((None, 0.2), (0.3, 0.5)) is None


def test_verdict_paragraph(built):
    out, report = built
    text = (out / "report" / "verdict.txt").read_text().strip()
    assert text == report.verdict and "\n" not in text
    assert (
        "mars reached strict's final reward (0.525) at step 6 after 42 s, 42% of strict's wall-clock (100 s)"
        in text
    )
    assert (
        "mars_code did not reach strict's final reward (0.525) within its run "
        "(best 2-step mean 0.270 over 50 s)" in text
    )
    s = report.summaries["mars"]
    assert f"top-2 excess {100 * s['top2_excess']:+.2f} ± {100 * s['top2_excess_se']:.2f} pt" in text
    assert "0.630 [0.561, 0.694] vs strict 0.600 [0.531, 0.665] (intervals overlap)" in text
    assert "vs strict 0.600 [0.531, 0.665] (intervals do not overlap)" in text  # mars_code, 0.300
    m = report.verdict_metrics
    assert m["mars"]["time_frac"] == pytest.approx(0.42) and m["mars_code"]["reached"] is False
    assert m["mars"]["tokens_per_s_ratio"] == pytest.approx(184.5 / 104.5)


def test_no_strict_arm_and_single_arm():
    from marsrl.report.load import Arm
    from marsrl.report.table import summarize_arm
    from marsrl.report.verdict import verdict

    a = Arm("a", Path("a"), {"arm": {"rule": "mars"}}, _rows(MARS_REWARDS, 6.0))
    b = Arm("b", Path("b"), {"arm": {"rule": "mars_code"}}, _rows(STRICT_REWARDS, 1.0))
    text, m = verdict([a, b], {x.name: summarize_arm(x) for x in (a, b)})
    assert text.startswith("No strict arm; comparing with a. b did not reach a's final reward (0.610)")
    assert "no held-out accuracy to compare" in text and m["b"]["reached"] is False
    assert verdict([a], {"a": summarize_arm(a)}) == (
        "Only one arm (a, final reward 0.610); nothing to compare.",
        {},
    )
