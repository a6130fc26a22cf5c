"""Every arm against the reference (strict) arm: each figure with its 95% interval and whether the
interval resolves a difference, plus the step-time projection of the rollout speed-up (Amdahl).  Pure
functions over the loaded arms; the statistics are ``stats``'s, the words are ``verdict``'s.

One comparison is ``{key: Figure}`` (``Figure.as_dict`` is what ``table.json`` carries):
    tokens_per_s_ratio     mean rollout tokens/s, arm / reference        bootstrap over steps, paired
    step_time_ratio        mean seconds per step, arm / reference         bootstrap over steps, paired
    time_to_target_ratio   seconds until the smoothed reward reaches the target, arm / reference
                                                                          residual bootstrap of the curves
    heldout_<name>_diff    held-out accuracy after training, arm - ref   bootstrap over problems, paired
                           (Newcombe's interval, unpaired, where eval.json has no per-problem outcomes)
    top1_excess_diff, top2_excess_diff, unsupported_mass_diff, is_ess_diff
                           mean over steps, arm - reference               bootstrap over steps, paired

With ``timing.json`` (the job's interleaved A/B of every arm's rollout, see ``marsrl.experiment.timing``)
the timings come from it instead of the arms' sequential wall-clock:
    tokens_per_s_ratio     rollout tokens/s, arm / reference              bootstrap over repeats, paired
    rollout_time_ratio     rollout seconds of one step, arm / reference   bootstrap over repeats, paired
    step_time_ratio        (T + rollout seconds) / (T + reference's), T the reference's median
                           non-rollout seconds per training step         bootstrap over repeats, paired
    time_to_target_ratio   the curves' steps at the interleaved per-step cost
and ``aa_check`` reads the reference's A/A copy against it (1.00 within its interval when the timing is
fair).

Steps are paired by step number (both arms see the same prompts at the same step); only the steps both
arms logged a value at enter.  The per-step seconds are ``train/step_seconds``, else the increments of
``wall_s``.  The reward level of ``time_to_target_ratio`` must be fixed before the run (``--target-reward``
or ``report.target_reward`` in the experiment config); none is derived from the run's own rewards.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from . import stats
from .base import finite
from .load import Arm

PUBLISHED_SHARES = (0.91, 0.98)
PUBLISHED_SOURCE = (
    "FastGRPO (arXiv 2509.21792) reports generation at 91-98% of GRPO training time at 8B scale"
)

BY_STEPS = "bootstrap over steps, paired by step"
BY_REPEATS = "bootstrap over the interleaved timing repeats, paired by repeat"
AA_SUFFIX = " (A/A)"
BY_PROBLEMS = "bootstrap over problems, paired by problem"
BY_CURVES = "residual bootstrap of each arm's EMA-smoothed reward curve and step times"
NEWCOMBE = "Newcombe's hybrid score interval, unpaired (eval.json has no per-problem outcomes)"
MIN_RESAMPLED = 8
"""A bootstrap over fewer steps (or problems) than this resolves nothing: with a handful of values the
percentile interval is far too narrow (two steps give at most three distinct means)."""


@dataclass
class Figure:
    """One compared figure: ``value`` with its interval [low, high] against ``null`` (1 for a ratio,
    0 for a difference); ``interval`` says what was resampled; ``extra`` the figure's own numbers."""

    label: str
    value: float | None
    low: float | None
    high: float | None
    null: float
    interval: str
    n: int = 0
    extra: dict = field(default_factory=dict)
    void: str = ""  # why the interval cannot be read as a finding (e.g. the timing's A/A control failed)

    @property
    def resolved(self) -> bool:
        if self.void or self.low is None or self.high is None:
            return False
        if self.interval != NEWCOMBE and self.n < MIN_RESAMPLED:
            return False
        return stats.resolved(self.low, self.high, self.null)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["resolved"] = self.resolved
        return _json_safe(out)


def _json_safe(value):
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _num(value: float) -> float | None:
    """None for a missing or NaN figure (infinite ends are kept: an interval open above)."""
    return None if value is None or math.isnan(value) else float(value)


# ---- per-step series -----------------------------------------------------------------------------------


def step_durations(rows: list[dict]) -> dict[int, float]:
    """{step: seconds}: ``train/step_seconds`` where every step logged it, else the increments of
    ``wall_s`` (the first step's from 0)."""
    if rows and all(finite(r.get("train/step_seconds")) for r in rows):
        return {r["step"]: float(r["train/step_seconds"]) for r in rows}
    out, prev = {}, 0.0
    for r in rows:
        if finite(r.get("wall_s")):
            out[r["step"]] = float(r["wall_s"]) - prev
            prev = float(r["wall_s"])
    return out


def _series(rows: list[dict], key: str) -> dict[int, float]:
    return {r["step"]: float(r[key]) for r in rows if finite(r.get(key))}


def paired_steps(*series: dict[int, float]) -> list[list[float]]:
    """The values of each series at the steps all of them have, in step order."""
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    return [[s[k] for k in steps] for s in series]


def _by_steps(label, stat, null, columns, n_boot, seed, **extra) -> Figure | None:
    if not columns[0]:
        return None
    value, m = stats.paired_bootstrap(stat, columns, n_boot, seed)
    return Figure(label, _num(value), _num(m["low"]), _num(m["high"]), null, BY_STEPS, m["n"], extra)


def _ratio(arm: Arm, ref: Arm, key: str, label: str, n_boot: int, seed: int) -> Figure | None:
    a, r = paired_steps(_series(arm.rows, key), _series(ref.rows, key))
    return _by_steps(label, stats.ratio_of_means, 1.0, [a, r], n_boot, seed)


def _difference(arm: Arm, ref: Arm, key: str, label: str, n_boot: int, seed: int) -> Figure | None:
    a, r = paired_steps(_series(arm.rows, key), _series(ref.rows, key))
    if not a:
        return None
    return _by_steps(
        label,
        stats.difference_of_means,
        0.0,
        [a, r],
        n_boot,
        seed,
        arm_mean=sum(a) / len(a),
        ref_mean=sum(r) / len(r),
    )


def _step_time(arm: Arm, ref: Arm, n_boot: int, seed: int) -> Figure | None:
    a, r = paired_steps(step_durations(arm.rows), step_durations(ref.rows))
    label = "step time (sequential wall-clock: machine load included)"
    return _by_steps(label, stats.ratio_of_means, 1.0, [a, r], n_boot, seed)


def _timed(timing: dict | None, *names: str) -> bool:
    return bool(timing) and all(n in timing["arms"] for n in names)


def interleaved_figures(timing: dict, arm: str, ref: str, n_boot: int, seed: int) -> dict[str, Figure]:
    """The timing figures of ``arm`` against ``ref`` from timing.json (module docstring)."""
    a, r = timing["arms"][arm], timing["arms"][ref]
    sa, sr, ta, tr = a["seconds"], r["seconds"], a["tokens"], r["tokens"]

    def rate(x_tok, x_sec, y_tok, y_sec):
        return (x_tok.sum(-1) / x_sec.sum(-1)) / (y_tok.sum(-1) / y_sec.sum(-1))

    def fig(label, stat, columns, **extra):
        value, m = stats.paired_bootstrap(stat, columns, n_boot, seed)
        return Figure(label, _num(value), _num(m["low"]), _num(m["high"]), 1.0, BY_REPEATS, m["n"], extra)

    out = {
        "tokens_per_s_ratio": fig("rollout tokens/s (interleaved)", rate, [ta, sa, tr, sr]),
        "rollout_time_ratio": fig("rollout seconds per step (interleaved)", stats.ratio_of_means, [sa, sr]),
    }
    train = timing.get("train_seconds")
    if finite(train):

        def step(x, y):
            return (train + x.mean(-1)) / (train + y.mean(-1))

        out["step_time_ratio"] = fig(
            "step time (interleaved rollout + the reference's training seconds)",
            step,
            [sa, sr],
            train_seconds=float(train),
        )
    return out


def aa_check(
    timing: dict | None, ref: str, n_boot: int = stats.N_BOOT, seed: int = stats.SEED
) -> Figure | None:
    """The reference's A/A copy against the reference in the interleaved timing (rollout seconds)."""
    if not _timed(timing, ref, ref + AA_SUFFIX):
        return None
    return interleaved_figures(timing, ref + AA_SUFFIX, ref, n_boot, seed)["rollout_time_ratio"]


def step_cost(timing: dict | None, name: str) -> float | None:
    """An arm's per-step cost from the interleaved timing: the reference's training seconds plus the
    arm's mean rollout seconds; None without timing for it."""
    if not _timed(timing, name) or not finite(timing.get("train_seconds")):
        return None
    seconds = timing["arms"][name]["seconds"]
    return float(timing["train_seconds"]) + sum(seconds) / len(seconds)


def _time_to_target(
    arm: Arm, ref: Arm, target: float, n_boot: int, seed: int, timing: dict | None = None
) -> Figure | None:
    def curve(a: Arm):
        cost = step_cost(timing, a.name)
        durations = step_durations(a.rows)
        if cost is not None:
            durations = dict.fromkeys(durations, cost)
        rewards, seconds = paired_steps(_series(a.rows, "train/reward"), durations)
        return rewards, seconds

    a, r = curve(arm), curve(ref)
    if not a[0] or not r[0]:
        return None
    value, m = stats.time_to_target_interval(a, r, target, n_boot=n_boot, seed=seed, warmup=stats.EMA_WARMUP)
    extra = {k: m[k] for k in ("arm_s", "ref_s", "arm_reached", "ref_reached")}
    timed = step_cost(timing, arm.name) is not None or step_cost(timing, ref.name) is not None
    extra.update(
        target=target,
        alpha=stats.EMA_ALPHA,
        warmup=stats.EMA_WARMUP,
        time_axis=TIMED_AXIS if timed else "wall-clock",
    )
    label = f"time to reward {target:g} (EMA-smoothed)"
    return Figure(label, _num(value), _num(m["low"]), _num(m["high"]), 1.0, BY_CURVES, len(a[0]), extra)


# ---- held-out accuracy ---------------------------------------------------------------------------------


def eval_results(evaluation: dict | None, part: str) -> dict[str, dict]:
    """{name: result} of one part of eval.json (``before`` / ``after``): a part holding ``accuracy``
    itself is one result named ``greedy`` when its ``temperature`` is 0 or absent; else each member
    with an ``accuracy`` is one (``t1``, ``greedy``, ... as ``marsrl.experiment.evaluate`` writes)."""
    got = (evaluation or {}).get(part)
    if not isinstance(got, dict):
        return {}
    if "accuracy" in got:
        t = got.get("temperature")
        return {"greedy" if not t else f"t{t:g}": got}
    return {k: v for k, v in got.items() if isinstance(v, dict) and "accuracy" in v}


def _outcomes(result: dict) -> list[int] | None:
    correct = result.get("correct")
    if isinstance(correct, list) and correct and all(c in (0, 1, True, False) for c in correct):
        return [int(c) for c in correct]
    return None


def _heldout(arm: Arm, ref: Arm, n_boot: int, seed: int) -> dict[str, Figure]:
    out = {}
    ref_after = eval_results(ref.eval, "after")
    for name, res in eval_results(arm.eval, "after").items():
        other = ref_after.get(name)
        if other is None or not finite(res.get("accuracy")) or not finite(other.get("accuracy")):
            continue
        label = f"held-out accuracy after training ({name})"
        a, r = _outcomes(res), _outcomes(other)
        if a is not None and r is not None and len(a) == len(r):
            value, m = stats.paired_accuracy_difference(a, r, n_boot, seed)
            extra = {"p_value": m["p_value"], "test": "exact McNemar", "arm_only": m["a_only"]}
            extra.update(ref_only=m["b_only"], arm=sum(a) / len(a), ref=sum(r) / len(r))
            out[f"heldout_{name}_diff"] = Figure(
                label, value, m["low"], m["high"], 0.0, BY_PROBLEMS, m["n"], extra
            )
        elif finite(res.get("n")) and finite(other.get("n")) and res["n"] and other["n"]:
            n1, n2 = int(res["n"]), int(other["n"])
            k1, k2 = round(res["accuracy"] * n1), round(other["accuracy"] * n2)
            value, m = stats.newcombe_difference(k1, n1, k2, n2)
            extra = {"arm": k1 / n1, "ref": k2 / n2}
            out[f"heldout_{name}_diff"] = Figure(
                label, value, m["low"], m["high"], 0.0, NEWCOMBE, m["n"], extra
            )
    return out


# ---- the comparison --------------------------------------------------------------------------------


def compare_arms(
    arm: Arm,
    ref: Arm,
    target: float | None = None,
    n_boot: int = stats.N_BOOT,
    seed: int = stats.SEED,
    timing: dict | None = None,
) -> dict[str, Figure]:
    """Every figure of the module docstring that both arms logged, in the order listed there; the
    timings from ``timing`` (timing.json) when it holds both arms, else from the sequential steps."""
    if _timed(timing, arm.name, ref.name):
        figs: dict[str, Figure | None] = dict(interleaved_figures(timing, arm.name, ref.name, n_boot, seed))
    else:
        figs = {
            "tokens_per_s_ratio": _ratio(
                arm, ref, "train/rollout/tokens_per_s", "rollout tokens/s", n_boot, seed
            ),
            "step_time_ratio": _step_time(arm, ref, n_boot, seed),
        }
    figs["time_to_target_ratio"] = (
        _time_to_target(arm, ref, target, n_boot, seed, timing) if target is not None else None
    )
    figs.update(_heldout(arm, ref, n_boot, seed))
    for k in (1, 2):
        figs[f"top{k}_excess_diff"] = _difference(
            arm, ref, f"train/bias/top{k}_excess", f"top-{k} excess", n_boot, seed
        )
    figs["unsupported_mass_diff"] = _difference(
        arm, ref, "train/bias/unsupported_mass", "unsupported mass", n_boot, seed
    )
    figs["is_ess_diff"] = _difference(
        arm, ref, "train/bias/is_ratio_ess_frac", "IS effective sample size (share)", n_boot, seed
    )
    return {k: v for k, v in figs.items() if v is not None}


def projection(
    arm: Arm, ref: Arm, n_boot: int = stats.N_BOOT, seed: int = stats.SEED, timing: dict | None = None
) -> dict | None:
    """What the arm's rollout speed-up would do to the step time: Amdahl's 1 / (1 - s + s / r), r the
    tokens/s ratio, s the reference's rollout share of a step (measured; published: ``PUBLISHED_SHARES``).
    Arithmetic, not a measurement.  With the interleaved timing (``timing.json``), r and s come from it
    (s: the reference's rollout seconds over those plus its non-rollout seconds per step), resampled over
    the repeats, like the report's other timing ratios; without it, from the arms' per-step rows
    (resampled over the paired steps).  None when a series is missing."""
    if _timed(timing, arm.name, ref.name) and finite(timing.get("train_seconds")):
        return _projection_interleaved(timing, arm.name, ref.name, n_boot, seed)
    share = _series(ref.rows, "train/rollout/share_of_step")
    s, a, r = paired_steps(
        share,
        _series(arm.rows, "train/rollout/tokens_per_s"),
        _series(ref.rows, "train/rollout/tokens_per_s"),
    )
    if not s:
        return None

    def at_measured(sh, x, y):
        return 1.0 / (1.0 - sh.mean(axis=-1) + sh.mean(axis=-1) * y.mean(axis=-1) / x.mean(axis=-1))

    value, m = stats.paired_bootstrap(at_measured, [s, a, r], n_boot, seed)
    speedup, ms = stats.paired_bootstrap(stats.ratio_of_means, [a, r], n_boot, seed)
    published = _published(speedup, ms)
    return _json_safe(
        {
            "share": sum(s) / len(s),
            "speedup": speedup,
            "speedup_low": ms["low"],
            "speedup_high": ms["high"],
            "measured": {"value": value, "low": m["low"], "high": m["high"]},
            "published": published,
            "source": PUBLISHED_SOURCE,
            "interval": BY_STEPS,
            "basis": "per-step rows",
            "n": m["n"],
        }
    )


def _published(speedup: float, interval: dict) -> dict:
    """Amdahl's step-time speed-up at each published rollout share, with the speed-up's interval."""
    return {
        f"{p:g}": {
            "value": stats.amdahl(p, speedup),
            "low": stats.amdahl(p, interval["low"]),
            "high": stats.amdahl(p, interval["high"]),
        }
        for p in PUBLISHED_SHARES
    }


def _projection_interleaved(timing: dict, arm: str, ref: str, n_boot: int, seed: int) -> dict:
    a, r = timing["arms"][arm], timing["arms"][ref]
    train = float(timing["train_seconds"])
    columns = [a["tokens"], a["seconds"], r["tokens"], r["seconds"]]

    def speed(ta, sa, tr, sr):
        return (ta.sum(-1) / sa.sum(-1)) / (tr.sum(-1) / sr.sum(-1))

    def at_measured(ta, sa, tr, sr):
        sh = sr.mean(-1) / (train + sr.mean(-1))
        return 1.0 / (1.0 - sh + sh / speed(ta, sa, tr, sr))

    speedup, ms = stats.paired_bootstrap(speed, columns, n_boot, seed)
    value, m = stats.paired_bootstrap(at_measured, columns, n_boot, seed)
    rollout = sum(r["seconds"]) / len(r["seconds"])
    return _json_safe(
        {
            "share": rollout / (train + rollout),
            "speedup": speedup,
            "speedup_low": ms["low"],
            "speedup_high": ms["high"],
            "measured": {"value": value, "low": m["low"], "high": m["high"]},
            "published": _published(speedup, ms),
            "source": PUBLISHED_SOURCE,
            "interval": BY_REPEATS,
            "basis": "interleaved timing",
            "n": m["n"],
        }
    )


UNFAIR_TIMING = "the A/A control resolved a difference: the timing is not fair"
TIMED_AXIS = "interleaved per-step cost"  # a time-to-level figure whose seconds come from the timing


def void_unfair_timing(comparisons: dict[str, dict[str, Figure]], aa: Figure | None) -> dict:
    """The comparisons with every interleaved-timing figure voided (``Figure.void``) when the reference's
    A/A copy read a resolved difference: a bias that large in the timing makes its ratios no finding,
    and no finding of a time to a reward level measured on the timing's per-step costs either."""
    if aa is None or not aa.resolved:
        return comparisons

    def timed(f: Figure) -> bool:  # the timing's ratios, and a time to a level on the timing's time axis
        return f.interval == BY_REPEATS or (f.extra or {}).get("time_axis") == TIMED_AXIS

    return {
        arm: {k: replace(f, void=UNFAIR_TIMING) if timed(f) else f for k, f in figs.items()}
        for arm, figs in comparisons.items()
    }
