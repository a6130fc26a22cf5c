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
