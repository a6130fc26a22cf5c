"""The report's statistics: pure functions over plain sequences (numpy inside), each returning a plain
value or ``(value, metrics)``.  Nothing here reads files or formats text.

What each interval resamples (all 95%, percentile bootstrap unless said otherwise):
    over steps, paired      ``paired_bootstrap``: the steps both arms logged are drawn with replacement,
                            the same draw for both arms (step k of one arm goes with step k of the
                            other: same prompts, and neighbours in time when the arms are interleaved).
                            Steps are treated as exchangeable; a trend inside a run is not modelled.
    over problems, paired   ``paired_accuracy_difference``: the held-out problems are drawn with
                            replacement, the same draw for both arms; with the exact McNemar test
                            (a two-sided sign test on the discordant problems) beside it.
    curve, residuals        ``time_to_target_interval``: each arm's smoothed reward curve plus its
                            resampled raw-minus-smoothed residuals (and its resampled step durations),
                            smoothed again; the first passage of the target is read from each draw.
    unpaired accuracies     ``newcombe_difference``: Newcombe's hybrid score interval from two Wilson
                            intervals, for eval results without per-problem correctness.

Smoothing of the training-reward curve is an exponential moving average, debiased (``ema``): the
weights of the steps seen so far sum to one, so the first smoothed value is the first raw value rather
than a fraction of it.

Departures a reader should know: the bootstrap is i.i.d. over steps (no block bootstrap), and the
intervals are each 95% on their own, not adjusted for the number of figures compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist

import numpy as np

from ..algo.intervals import wilson_interval

LEVEL = 0.95
N_BOOT = 2000
SEED = 0
EMA_ALPHA = 0.1
"""Weight of the newest step in the smoothed reward (a memory of about 1 / alpha = 10 steps)."""
EMA_WARMUP = math.ceil(1 / EMA_ALPHA)
"""Steps the smoothed reward must have averaged before a time to a level counts a passage: earlier, the
debiased average rests on a few noisy steps (one step's batch reaching the level is not the curve)."""


# ---- smoothing ---------------------------------------------------------------------------------------


def ema(xs: Sequence[float | None], alpha: float = EMA_ALPHA) -> list[float | None]:
    """Debiased exponential moving average of a series; ``None`` (a step without a value) stays ``None``
    and does not move the average.

    s_t = m_t / (1 - (1 - alpha)^n_t), m_t = (1 - alpha) m_{t-1} + alpha x_t, n_t the values seen so far.
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    out: list[float | None] = []
    m, decay = 0.0, 1.0
    for x in xs:
        if x is None or not math.isfinite(x):
            out.append(None)
            continue
        m = (1 - alpha) * m + alpha * float(x)
        decay *= 1 - alpha
        out.append(m / (1 - decay))
    return out


def _ema_rows(x: np.ndarray, alpha: float) -> np.ndarray:
    """``ema`` along the last axis of a float array without gaps; shape kept ([R, T] -> [R, T])."""
    out = np.empty_like(x, dtype=float)
    m = np.zeros(x.shape[:-1])
    decay = 1.0
    for t in range(x.shape[-1]):
        m = (1 - alpha) * m + alpha * x[..., t]
        decay *= 1 - alpha
        out[..., t] = m / (1 - decay)
    return out


# ---- intervals ---------------------------------------------------------------------------------------


def percentile_interval(draws: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap draws: numpy's default (linear) quantile,
    except that a quantile next to an infinite draw is that infinity (so an interval may be open above).
    NaN draws are dropped; (nan, nan) when none is left."""
    d = np.sort(np.asarray(draws, dtype=float).ravel())
    d = d[~np.isnan(d)]
    if d.size == 0:
        return math.nan, math.nan
    tail = (1 - level) / 2
    out = []
    for q in (tail, 1 - tail):
        pos = (d.size - 1) * q
        i, j = math.floor(pos), math.ceil(pos)
        a, b = float(d[i]), float(d[j])
        if i == j or a == b:
            out.append(a)
        elif math.isinf(a) or math.isinf(b):
            out.append(b if math.isinf(b) else a)
        else:
            out.append(a + (b - a) * (pos - i))
    return out[0], out[1]


def bootstrap_indices(n: int, n_boot: int = N_BOOT, seed: int = SEED) -> np.ndarray:
    """[n_boot, n] indices drawn with replacement from range(n), from ``np.random.default_rng(seed)``."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def paired_bootstrap(
    stat: Callable[..., np.ndarray],
    columns: Sequence[Sequence[float]],
    n_boot: int = N_BOOT,
    seed: int = SEED,
    level: float = LEVEL,
) -> tuple[float, dict]:
    """``stat`` of the columns and its percentile interval, resampling their rows together.

    ``columns``: equal-length sequences [n], row i of each belonging together (one step, one problem).
    ``stat(*arrays)`` maps arrays [..., n] to [...] (a reduction over the last axis), so the resamples
    are evaluated at once as [n_boot, n].  Metrics: ``low``, ``high``, ``n``, ``n_boot``, ``level``.
    """
    cols = [np.asarray(c, dtype=float) for c in columns]
    n = len(cols[0])
    if any(len(c) != n for c in cols):
        raise ValueError(f"columns of unequal length: {[len(c) for c in cols]}")
    if n == 0:
        return math.nan, {"low": math.nan, "high": math.nan, "n": 0, "n_boot": n_boot, "level": level}
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(stat(*cols))
        idx = bootstrap_indices(n, n_boot, seed)
        draws = stat(*(c[idx] for c in cols))
    lo, hi = percentile_interval(draws, level)
    return value, {"low": lo, "high": hi, "n": n, "n_boot": n_boot, "level": level}


def ratio_of_means(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """mean(a) / mean(b) over the last axis."""
    return a.mean(axis=-1) / b.mean(axis=-1)


def difference_of_means(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """mean(a) - mean(b) over the last axis."""
    return a.mean(axis=-1) - b.mean(axis=-1)


def resolved(low: float, high: float, null: float) -> bool:
    """Whether an interval excludes the value of no difference (1 for a ratio, 0 for a difference).
    An interval with an unknown end resolves nothing."""
    if math.isnan(low) or math.isnan(high):
        return False
    return low > null or high < null


# ---- held-out accuracy ---------------------------------------------------------------------------------


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exact (integer arithmetic, then one division)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def mcnemar_exact(a: Sequence[int], b: Sequence[int]) -> tuple[float, dict]:
    """Two-sided exact McNemar test of paired 0/1 outcomes: a sign test on the discordant pairs,
    p = min(1, 2 P(X <= min(n10, n01))), X ~ Binomial(n10 + n01, 1/2); p = 1 without discordant pairs.
    (By symmetry P(X <= min) = P(X >= max), the form computed.)  marsrl's one implementation:
    ``marsrl.experiment.evaluate.mcnemar_exact`` (before / after, with the one-sided p) calls it.

    Metrics: ``a_only`` (n10: a right, b wrong), ``b_only`` (n01), ``n``.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes of unequal length: {len(a)} vs {len(b)}")
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    m = a_only + b_only
    p = min(1.0, 2 * binomial_tail(max(a_only, b_only), m)) if m else 1.0
    return p, {"a_only": a_only, "b_only": b_only, "n": len(a)}


def paired_accuracy_difference(
    a: Sequence[int], b: Sequence[int], n_boot: int = N_BOOT, seed: int = SEED, level: float = LEVEL
) -> tuple[float, dict]:
    """acc(a) - acc(b) over the same problems (0/1 per problem, same order), its interval by the paired
    bootstrap over problems, and the exact McNemar p-value (``p_value``) beside it."""
    value, m = paired_bootstrap(difference_of_means, [a, b], n_boot, seed, level)
    p, counts = mcnemar_exact(a, b)
    return value, {**m, "p_value": p, **counts}


def newcombe_difference(k1: int, n1: int, k2: int, n2: int, level: float = LEVEL) -> tuple[float, dict]:
    """k1/n1 - k2/n2 with Newcombe's hybrid score interval (method 10 of Newcombe 1998) for independent
    samples: conservative for paired problems, used only when per-problem outcomes are missing."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, z)
    l2, u2 = wilson_interval(k2, n2, z)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return d, {"low": low, "high": high, "n": min(n1, n2), "level": level}


# ---- time to a reward level --------------------------------------------------------------------------


def first_passage(curve: Sequence[float | None], target: float, start: int = 0) -> int | None:
    """Index of the first value of ``curve`` at or above ``target`` from index ``start`` on; None if it
    never gets there."""
    for i, v in enumerate(curve):
        if i >= start and v is not None and v >= target:
            return i
    return None


def time_to_target(
    rewards: Sequence[float],
    durations: Sequence[float],
    target: float,
    alpha: float = EMA_ALPHA,
    warmup: int = 0,
) -> tuple[float | None, dict]:
    """Seconds until the smoothed (``ema``) reward first reaches ``target``, counting only from the
    ``warmup``-th step on (``EMA_WARMUP`` in the report): the summed durations of the steps up to and
    including that step.  Metrics: ``step_index`` (None when never reached)."""
    i = first_passage(ema(rewards, alpha), target, start=max(0, warmup - 1))
    return (None if i is None else float(sum(durations[: i + 1]))), {"step_index": i}


def _passage_times(
    rewards: np.ndarray, durations: np.ndarray, target: float, alpha: float, warmup: int = 0
) -> np.ndarray:
    """First-passage time of each row ([R, T] -> [R]) from the ``warmup``-th step on; +inf where a row
    never reaches ``target`` there."""
    hit = _ema_rows(rewards, alpha) >= target
    hit[..., : max(0, warmup - 1)] = False
    first = hit.argmax(axis=-1)
    times = np.cumsum(durations, axis=-1)[np.arange(len(first)), first]
    return np.where(hit.any(axis=-1), times, np.inf)


def _resampled_curves(rewards, durations, alpha, n_boot, rng) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(rewards, dtype=float)
    smooth = np.asarray(ema(list(x), alpha), dtype=float)
    resid = x - smooth
    n = len(x)
    r = smooth + resid[rng.integers(0, n, size=(n_boot, n))]
    d = np.asarray(durations, dtype=float)[rng.integers(0, n, size=(n_boot, n))]
    return r, d


def time_to_target_interval(
    arm: tuple[Sequence[float], Sequence[float]],
    ref: tuple[Sequence[float], Sequence[float]],
    target: float,
    alpha: float = EMA_ALPHA,
    n_boot: int = N_BOOT,
    seed: int = SEED,
    level: float = LEVEL,
    warmup: int = 0,
) -> tuple[float, dict]:
    """Ratio of the arm's time to ``target`` over the reference's (each ``(rewards [T], durations [T])``,
    every step with both), with a residual-bootstrap interval (see the module docstring; the arms are
    resampled independently); passages count from the ``warmup``-th step on (``time_to_target``).  A
    draw in which the arm never reaches the target counts as an infinite
    ratio, one in which only the reference never does as zero; neither reaching is left out.

    Value: by the same convention (0 when only the arm reaches the target on its own curve, inf when only
    the reference does, NaN when neither does).  Metrics: ``low``, ``high``,
    ``arm_s``, ``ref_s`` (seconds, None if never reached), ``arm_reached`` / ``ref_reached`` (share of
    draws that reached it), ``n_boot``, ``level``.
    """
    t_arm, _ = time_to_target(*arm, target, alpha, warmup)
    t_ref, _ = time_to_target(*ref, target, alpha, warmup)
    rng = np.random.default_rng(seed)
    ta = _passage_times(*_resampled_curves(*arm, alpha, n_boot, rng), target, alpha, warmup)
    tr = _passage_times(*_resampled_curves(*ref, alpha, n_boot, rng), target, alpha, warmup)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isinf(ta) & np.isinf(tr), np.nan, ta / tr)
    ratio = np.where(np.isinf(ta) & ~np.isinf(tr), np.inf, ratio)
    ratio = np.where(~np.isinf(ta) & np.isinf(tr), 0.0, ratio)
    lo, hi = percentile_interval(ratio, level)
    if t_arm is not None and t_ref:
        value = t_arm / t_ref
    else:  # the draws' convention: only the arm got there 0, only the reference inf, neither NaN
        value = {(True, False): 0.0, (False, True): math.inf}.get(
            (t_arm is not None, t_ref is not None), math.nan
        )
    return value, {
        "low": lo,
        "high": hi,
        "arm_s": t_arm,
        "ref_s": t_ref,
        "arm_reached": float(np.mean(~np.isinf(ta))),
        "ref_reached": float(np.mean(~np.isinf(tr))),
        "n_boot": n_boot,
        "level": level,
    }


# ---- projection ----------------------------------------------------------------------------------------


def amdahl(share: float, speedup: float) -> float:
    """Step-time speed-up when a part taking ``share`` of a step gets ``speedup`` times faster:
    1 / (1 - s + s / r)."""
    return 1.0 / (1.0 - share + share / speedup)
