"""The report's statistics against slow references: the smoothing against its closed-form weighted sum,
the vectorised bootstrap against a loop over the same draws and against scipy's bootstrap, its coverage
on data with a known mean, the exact McNemar test against enumerating every sign assignment, Newcombe's
interval against the published worked examples, and the vectorised first-passage times against a loop."""

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binomtest, bootstrap

from marsrl.report import stats
from marsrl.report.stats import (
    amdahl,
    difference_of_means,
    ema,
    mcnemar_exact,
    newcombe_difference,
    paired_accuracy_difference,
    paired_bootstrap,
    ratio_of_means,
    resolved,
    time_to_target,
    time_to_target_interval,
)


def _ema_closed_form(xs, alpha):
    """s_t = sum_i w_i x_i / sum_i w_i over the values seen so far, w_i = alpha (1 - alpha)^(age of i)."""
    out, seen = [], []
    for x in xs:
        if x is None:
            out.append(None)
            continue
        seen.append(x)
        w = [alpha * (1 - alpha) ** (len(seen) - 1 - i) for i in range(len(seen))]
        out.append(sum(wi * v for wi, v in zip(w, seen, strict=True)) / sum(w))
    return out


@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0])
def test_ema_is_the_normalised_weighted_sum(alpha):
    xs = [0.2, None, 0.5, 0.1, float("nan"), 0.9, 0.3, 0.3, 0.7]
    got = ema(xs, alpha)
    want = _ema_closed_form([None if x is None or math.isnan(x) else x for x in xs], alpha)
    assert [g is None for g in got] == [w is None for w in want]
    assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None], abs=1e-12)
    assert got[0] == pytest.approx(0.2, abs=1e-15)  # debiased: the first raw value, not alpha times it
    rows = stats._ema_rows(np.array([[0.2, 0.5, 0.1], [1.0, 0.0, 1.0]]), alpha)
    assert rows[1].tolist() == pytest.approx(ema([1.0, 0.0, 1.0], alpha), abs=1e-12)
    with pytest.raises(ValueError, match="alpha"):
        ema(xs, 0.0)


def test_bootstrap_equals_a_loop_over_the_same_draws():
    rng = np.random.default_rng(3)
    a, b = rng.gamma(2.0, size=30), rng.gamma(3.0, size=30)
    value, m = paired_bootstrap(ratio_of_means, [a, b], n_boot=500, seed=11)
    assert value == pytest.approx(a.mean() / b.mean())
    idx = stats.bootstrap_indices(30, 500, 11)
    loop = sorted(sum(a[i] for i in row) / sum(b[i] for i in row) for row in idx.tolist())
    # numpy's default quantile is linear interpolation between order statistics at (n - 1) q
    for q, got in ((0.025, m["low"]), (0.975, m["high"])):
        pos = (len(loop) - 1) * q
        lo = loop[math.floor(pos)]
        want = lo + (loop[math.ceil(pos)] - lo) * (pos - math.floor(pos))
        assert got == pytest.approx(want, rel=1e-12)
    assert m["n"] == 30 and m["n_boot"] == 500


def test_bootstrap_agrees_with_scipy():
    """Seed 5, n = 60, 20,000 draws on each side: the percentile ends agree to 5% of the interval width
    (the two use different random draws; Monte Carlo error of a 2.5% quantile is about 1% of it)."""
    x = np.random.default_rng(5).exponential(size=60)
    _, m = paired_bootstrap(lambda v: v.mean(axis=-1), [x], n_boot=20_000, seed=1)
    ref = bootstrap((x,), np.mean, method="percentile", n_resamples=20_000, random_state=2)
    width = ref.confidence_interval.high - ref.confidence_interval.low
    assert abs(m["low"] - ref.confidence_interval.low) < 0.05 * width
    assert abs(m["high"] - ref.confidence_interval.high) < 0.05 * width


def test_bootstrap_covers_a_known_difference():
    """Seed 0, 400 experiments of 50 paired normal steps (true difference 0.3): the 95% interval holds the
    truth in 91-98% of them (binomial SD of the rate about 1.1 points; an interval of +-1 SE, 68%, fails)."""
    rng = np.random.default_rng(0)
    hits = 0
    for k in range(400):
        common = rng.normal(size=50)
        a, b = 0.3 + common + rng.normal(size=50), common + rng.normal(size=50)
        _, m = paired_bootstrap(difference_of_means, [a, b], n_boot=1000, seed=k)
        hits += m["low"] <= 0.3 <= m["high"]
    assert 0.91 <= hits / 400 <= 0.98


def _sign_test_by_enumeration(a_only, b_only):
    """P(|X - Y| >= observed) over every assignment of the discordant pairs, each side equally likely."""
    m = a_only + b_only
    far = sum(abs(2 * sum(s) - m) >= abs(a_only - b_only) for s in itertools.product((0, 1), repeat=m))
    return far / 2**m


@pytest.mark.parametrize(
    ("a_only", "b_only", "same"), [(0, 0, 5), (3, 0, 2), (7, 2, 11), (5, 5, 0), (1, 9, 3)]
)
def test_mcnemar_exact_against_enumeration(a_only, b_only, same):
    a = [1] * a_only + [0] * b_only + [1] * same + [0] * 4
    b = [0] * a_only + [1] * b_only + [1] * same + [0] * 4
    p, m = mcnemar_exact(a, b)
    assert (m["a_only"], m["b_only"], m["n"]) == (a_only, b_only, len(a))
    assert p == pytest.approx(_sign_test_by_enumeration(a_only, b_only), abs=1e-12)
    if a_only + b_only:
        assert p == pytest.approx(binomtest(a_only, a_only + b_only, 0.5).pvalue, abs=1e-12)


def test_paired_accuracy_difference():
    rng = np.random.default_rng(2)
    a = (rng.random(300) < 0.6).astype(int).tolist()
    value, m = paired_accuracy_difference(a, a)
    assert value == 0.0 and (m["low"], m["high"], m["p_value"]) == (0.0, 0.0, 1.0)  # A/A: nothing resolved
    assert not resolved(m["low"], m["high"], 0.0)
    b = [1 if x or rng.random() < 0.5 else 0 for x in a]  # b right wherever a is, and on half the rest
    value, m = paired_accuracy_difference(b, a, seed=4)
    assert value == pytest.approx((sum(b) - sum(a)) / 300)
    assert m["b_only"] == 0 and m["p_value"] < 1e-10 and m["low"] > 0 and resolved(m["low"], m["high"], 0.0)


@pytest.mark.parametrize(
    ("counts", "published"),
    # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10 (score, no continuity correction)
    [((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090))],
)
def test_newcombe_matches_the_published_examples(counts, published):
    d, m = newcombe_difference(*counts)
    assert d == pytest.approx(counts[0] / counts[1] - counts[2] / counts[3])
    assert (m["low"], m["high"]) == pytest.approx(published, abs=5e-5)


def _first_passage_time_loop(rewards, durations, target, alpha, warmup=0):
    smooth = ema(rewards, alpha)
    elapsed = 0.0
    for step, (s, d) in enumerate(zip(smooth, durations, strict=True), start=1):
        elapsed += d
        if step >= warmup and s >= target:
            return elapsed
    return math.inf


@pytest.mark.parametrize("warmup", [3, 10])
def test_passage_times_with_a_warmup_equal_a_loop(warmup):
    """Seed 11, 40 curves of 25 steps: the vectorised passage times with a warm-up equal the loop's, and
    the warm-up moves some passages later (the noisy early steps no longer count)."""
    rng = np.random.default_rng(11)
    rewards = np.clip(np.linspace(0.1, 0.6, 25) + rng.normal(0, 0.15, size=(40, 25)), 0, 1)
    durations = rng.uniform(1, 3, size=(40, 25))
    got = stats._passage_times(rewards.copy(), durations, 0.4, 0.1, warmup)
    want = [
        _first_passage_time_loop(r.tolist(), d.tolist(), 0.4, 0.1, warmup)
        for r, d in zip(rewards, durations, strict=True)
    ]
    assert got.tolist() == pytest.approx(want)
    early = stats._passage_times(rewards.copy(), durations, 0.4, 0.1)
    assert (got >= early).all() and (got > early).any()


def test_an_early_noisy_crossing_does_not_count_after_the_warmup():
    # one lucky first batch: the debiased average starts at 0.9 and crosses 0.5 at once
    rewards, dt = [0.9] + [0.2] * 11 + [0.8] * 8, [1.0] * 20
    assert time_to_target(rewards, dt, 0.5)[1]["step_index"] == 0
    i = time_to_target(rewards, dt, 0.5, warmup=stats.EMA_WARMUP)[1]["step_index"]
    assert i is not None and i >= 12  # the rise after step 12, not the first step
    assert stats.EMA_WARMUP == 10  # about the average's memory at alpha 0.1


def test_passage_times_equal_a_loop():
    rng = np.random.default_rng(7)
    rewards = np.clip(np.linspace(0.1, 0.6, 25) + rng.normal(0, 0.1, size=(40, 25)), 0, 1)
    durations = rng.uniform(1, 3, size=(40, 25))
    got = stats._passage_times(rewards, durations, 0.5, 0.2)
    want = [
        _first_passage_time_loop(r.tolist(), d.tolist(), 0.5, 0.2)
        for r, d in zip(rewards, durations, strict=True)
    ]
    assert got.tolist() == pytest.approx(want)
    assert any(math.isinf(w) for w in want) and not all(math.isinf(w) for w in want)  # both kinds of row
    assert time_to_target([0.1, 0.2, 0.9, 0.9], [1.0, 1.0, 1.0, 1.0], 0.5, alpha=1.0) == (
        3.0,
        {"step_index": 2},
    )
    assert time_to_target([0.1, 0.2], [1.0, 1.0], 0.5) == (None, {"step_index": None})


def test_time_to_target_ratio():
    """Seed 0, 30 steps: an arm that gets to 0.5 in half the steps at the same step time reads about 0.5
    and resolves; the same curve against itself (A/A) holds 1 inside its interval."""
    rng = np.random.default_rng(0)
    steps = np.arange(30)
    slow = (0.2 + 0.6 * np.minimum(steps / 29, 1) + rng.normal(0, 0.05, 30)).tolist()
    fast = (0.2 + 0.6 * np.minimum(steps / 14.5, 1) + rng.normal(0, 0.05, 30)).tolist()
    dt = [2.0] * 30
    value, m = time_to_target_interval((fast, dt), (slow, dt), 0.5, n_boot=1000)
    assert 0.3 < value < 0.7 and m["high"] < 1 and resolved(m["low"], m["high"], 1.0)
    value, m = time_to_target_interval((slow, dt), (slow, dt), 0.5, n_boot=1000)
    assert value == 1.0 and m["low"] <= 1.0 <= m["high"] and not resolved(m["low"], m["high"], 1.0)
    value, m = time_to_target_interval((fast, dt), (slow, dt), 0.75, n_boot=1000)  # only fast gets there
    assert m["ref_s"] is None and value == 0.0 and m["high"] < 1 and resolved(m["low"], m["high"], 1.0)
    value, m = time_to_target_interval((slow, dt), (slow, dt), 5.0, n_boot=100)  # nobody gets there
    assert math.isnan(value) and m["arm_reached"] == 0.0 and not resolved(m["low"], m["high"], 1.0)


def test_percentile_interval_with_infinite_draws():
    draws = np.array([0.5] * 90 + [np.inf] * 10 + [np.nan] * 7)  # NaN draws are left out
    assert stats.percentile_interval(draws) == (0.5, np.inf)
    assert stats.percentile_interval(np.array([1.0, 2.0, 3.0]), 0.5) == (1.5, 2.5)
    assert all(math.isnan(x) for x in stats.percentile_interval(np.array([np.nan])))


def test_amdahl():
    # a 10 s step of which 7 s roll out; rollouts 2x faster: 3 s + 3.5 s
    assert amdahl(0.7, 2.0) == pytest.approx(10 / 6.5)
    assert amdahl(0.0, 5.0) == 1.0 and amdahl(1.0, 5.0) == pytest.approx(5.0)


def test_resolved():
    assert resolved(1.01, 1.2, 1.0) and resolved(-0.3, -0.1, 0.0) and resolved(0.0, 0.5, -0.1)
    assert not resolved(1.0, 1.0, 1.0) and not resolved(0.9, 1.1, 1.0)
    assert not resolved(math.nan, 2.0, 1.0) and resolved(1.2, math.inf, 1.0)
