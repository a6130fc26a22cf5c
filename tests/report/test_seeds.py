"""The aggregate over seeds: per-seed values, their mean and a Student-t interval across seeds."""

from __future__ import annotations

import math

import pytest

from marsrl.report.seeds import across_seeds, aggregate, format_markdown, t_quantile

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("df", [1, 2, 3, 5, 10, 29, 30])
def test_t_quantile_matches_scipy(df):
    assert t_quantile(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=1e-4)


def test_across_seeds_matches_scipy_interval():
    xs = [1.02, 0.97, 1.10, 1.05]
    got = across_seeds(xs)
    lo, hi = scipy_stats.t.interval(0.95, len(xs) - 1, loc=sum(xs) / 4, scale=scipy_stats.sem(xs))
    assert got["mean"] == pytest.approx(sum(xs) / 4)
    assert (got["low"], got["high"]) == pytest.approx((lo, hi), abs=1e-4)


def test_one_seed_has_no_interval_and_non_finite_values_are_dropped():
    assert across_seeds([0.5])["low"] is None
    assert across_seeds([0.5, math.nan, None])["n"] == 1
    assert across_seeds([])["mean"] is None


def _table(value: float) -> dict:
    return {
        "comparisons": {
            "mars": {"tokens_per_s_ratio": {"label": "rollout tokens/s", "value": value, "null": 1.0}}
        }
    }


def test_aggregate_resolves_only_when_the_seeds_agree():
    agreeing = aggregate({"seed-0": _table(1.20), "seed-1": _table(1.25), "seed-2": _table(1.22)})
    slot = agreeing["comparisons"]["mars"]["tokens_per_s_ratio"]
    assert slot["per_seed"] == {"seed-0": 1.20, "seed-1": 1.25, "seed-2": 1.22}
    assert slot["resolved"] and slot["low"] > 1.0
    noisy = aggregate({"seed-0": _table(0.8), "seed-1": _table(1.3), "seed-2": _table(1.05)})
    assert not noisy["comparisons"]["mars"]["tokens_per_s_ratio"]["resolved"]
    single = aggregate({"seed-0": _table(1.5)})
    assert not single["comparisons"]["mars"]["tokens_per_s_ratio"]["resolved"]
    text = format_markdown(agreeing, "grpo_tiny")
    assert "| rollout tokens/s | 1.2 | 1.25 | 1.22 |" in text and "3 seeds" in text


def _fig(
    value, low=None, high=None, interval="bootstrap over steps, paired by step", extra=None, null=1.0
) -> dict:
    return {"label": "x", "value": value, "low": low, "high": high, "null": null, "interval": interval,
            "n": 8, "extra": extra or {}}  # fmt: skip


def test_one_shared_timing_is_reported_once_with_its_own_interval():
    """The interleaved timing runs once per experiment and every seed's table repeats it: three copies of
    one ratio are not three replicates (a t interval over them would have zero width and read resolved)."""
    from marsrl.report.compare import BY_REPEATS

    timing = _fig(1.30, 1.21, 1.42, BY_REPEATS)
    tables = {f"seed-{i}": {"comparisons": {"mars": {"tokens_per_s_ratio": dict(timing)}}} for i in range(3)}
    slot = aggregate(tables)["comparisons"]["mars"]["tokens_per_s_ratio"]
    assert slot["shared"] and (slot["mean"], slot["low"], slot["high"]) == (1.30, 1.21, 1.42)
    assert slot["resolved"]
    wide = {s: {"comparisons": {"mars": {"t": _fig(1.05, 0.97, 1.12, BY_REPEATS)}}} for s in tables}
    assert not aggregate(wide)["comparisons"]["mars"]["t"]["resolved"]  # its own interval holds 1
    # per-seed timings that differ are replicates again: the t interval across them
    differ = {f"seed-{i}": {"comparisons": {"mars": {"t": _fig(v, v - 0.1, v + 0.1, BY_REPEATS)}}}
              for i, v in enumerate((1.2, 1.25, 1.22))}  # fmt: skip
    slot = aggregate(differ)["comparisons"]["mars"]["t"]
    assert not slot["shared"] and slot["low"] == pytest.approx(_log_t([1.2, 1.25, 1.22])[1])


def test_time_to_a_level_one_arm_never_reached_is_not_averaged():
    """0 and inf stand for "only one arm reached the level": no mean or interval is formed over them."""
    reached = {"arm_s": 50.0, "ref_s": 60.0}
    tables = {
        "seed-0": {"comparisons": {"mars": {"ttt": _fig(50 / 60, extra=reached)}}},
        "seed-1": {
            "comparisons": {"mars": {"ttt": _fig(0.0, 0.0, "inf", extra={"arm_s": 58.0, "ref_s": None})}}
        },
        "seed-2": {
            "comparisons": {"mars": {"ttt": _fig(0.0, 0.0, "inf", extra={"arm_s": 40.0, "ref_s": None})}}
        },
    }
    agg = aggregate(tables)
    slot = agg["comparisons"]["mars"]["ttt"]
    assert slot["mean"] is None and not slot["resolved"] and "seed-1, seed-2" in slot["note"]
    assert "n/a (the level was not reached by both arms at seed-1, seed-2)" in format_markdown(agg, "e")
    tables["seed-1"]["comparisons"]["mars"]["ttt"] = _fig(0.9, extra=reached)
    tables["seed-2"]["comparisons"]["mars"]["ttt"] = _fig(0.8, extra=reached)
    assert aggregate(tables)["comparisons"]["mars"]["ttt"]["mean"] == pytest.approx(
        (50 / 60 * 0.9 * 0.8) ** (1 / 3)  # a ratio's mean across seeds is geometric
    )


def _log_t(xs):
    """Slow reference: geometric mean and the 95% t interval of the mean log (scipy), exponentiated."""
    logs = [math.log(x) for x in xs]
    n = len(logs)
    mean = sum(logs) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1)) / math.sqrt(n)
    half = scipy_stats.t.ppf(0.975, n - 1) * se
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def test_ratios_across_seeds_are_taken_on_the_log_scale():
    """A ratio's interval across seeds is a t interval on the log scale: positive, and it holds 1 where
    three spread-out ratios below 1 do not resolve one (the arithmetic t interval of 0.09, 0.39, 0.09 is
    [-0.24, 0.62]: below zero, and it excludes 1). Differences keep the arithmetic interval."""
    from marsrl.report.seeds import RATIO_NOTE, across_seeds_ratio

    values = [0.094, 0.393, 0.089]
    arithmetic = across_seeds(values)
    assert arithmetic["low"] < 0 < arithmetic["high"] < 1
    got = across_seeds_ratio(values)
    want = _log_t(values)
    assert (got["mean"], got["low"], got["high"]) == pytest.approx(want, rel=1e-4)
    assert 0 < got["low"] < got["mean"] < 1 < got["high"]
    tables = {
        f"seed-{i}": {"comparisons": {"mars": {"ttt": _fig(v, extra={"arm_s": v, "ref_s": 1.0}),
                                               "d": _fig(v - 0.5, null=0.0)}}}
        for i, v in enumerate(values)
    }  # fmt: skip
    agg = aggregate(tables)["comparisons"]["mars"]
    assert not agg["ttt"]["resolved"] and agg["ttt"]["low"] == pytest.approx(want[1], rel=1e-4)
    assert agg["d"]["low"] == pytest.approx(across_seeds([v - 0.5 for v in values])["low"])
    assert across_seeds_ratio([0.5, 0.0, 1.0]) == {**across_seeds([0.5, 0.0, 1.0]), "log": False}
    assert agg["ttt"]["note"] == RATIO_NOTE and agg["d"]["note"] is None and "log" not in agg["ttt"]


def test_learning_is_aggregated_across_seeds():
    """Each seed's held-out gain (after - before) from its verdict metrics; the mean gain's t interval
    across seeds decides "resolved" (strict: +10, +12, +11 pt agree; mars: +8, -6, +2 pt do not)."""

    def table(strict_diff, mars_diff):
        c = lambda d: {"diff": d, "p_two_sided": 0.001 if abs(d) > 0.05 else 0.5}  # noqa: E731
        learned = {"strict": {"t1": c(strict_diff)}, "mars": {"t1": c(mars_diff)}}
        return {"comparisons": {}, "verdict": {"metrics": {"learning": learned}}}

    tables = {"seed-0": table(0.10, 0.08), "seed-1": table(0.12, -0.06), "seed-2": table(0.11, 0.02)}
    agg = aggregate(tables)["learning"]
    strict, mars = agg["strict"]["t1"], agg["mars"]["t1"]
    assert strict["mean"] == pytest.approx(0.11) and strict["resolved"]
    assert strict["low"] == pytest.approx(0.11 - 4.3027 * 0.01 / math.sqrt(3), rel=1e-4)
    assert mars["mean"] == pytest.approx(0.04 / 3) and not mars["resolved"]
    assert strict["p"] == {"seed-0": 0.001, "seed-1": 0.001, "seed-2": 0.001}
    md = format_markdown(aggregate(tables), "exp")
    assert "## Learning: held-out accuracy after training minus before" in md
    assert "| strict, t1 | +10.0 pt (p 0.001) | +12.0 pt (p 0.001) | +11.0 pt (p 0.001) | +11.0 pt [" in md
    # tables without verdict metrics (older reports): no learning section
    assert aggregate({"seed-0": {"comparisons": {}}})["learning"] == {}
