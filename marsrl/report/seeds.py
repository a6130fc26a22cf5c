"""Aggregate an experiment run at several seeds (``seeds: [0, 1, 2]``): every figure of each seed's
report, its mean over the seeds and a 95% interval across seeds (Student's t on the per-seed values, n - 1
degrees of freedom: the seeds are the independent replicates; within-seed intervals are each seed's own
report; a ratio's mean and interval are taken on the log scale, ``across_seeds_ratio``). Pure functions
over the seeds' ``table.json`` contents; ``write_seed_report`` writes
``seeds.json`` and ``seeds.md``.

Two kinds of figure are not averaged. The interleaved timing runs once per experiment, on the initial
policy, so its ratios are one measurement that every seed's report repeats: they are reported once, with
their own interval over the timing repeats (``shared``). A time to a reward level is a ratio only when
both arms reach the level; where either does not in some seed, its per-seed value is a convention (0 or
inf), so no mean or interval is formed (``note`` says where).

Each arm's learning (held-out accuracy after training minus before, ``aggregate_learning``) is
aggregated the same way: per-seed gains with their exact McNemar p, the mean gain and its t interval."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .compare import BY_REPEATS
from .stats import resolved as stats_resolved

RATIO_NOTE = "geometric mean; t interval on the log scale"
INTERVAL = "Student t over the per-seed values (95%); ratios on the log scale"

# two-sided 95% Student t quantiles t_{0.975, df}, df = 1..30; larger df use the normal quantile
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975 = 1.959964


def t_quantile(df: int) -> float:
    """t_{0.975, df} (the 95% two-sided quantile); the normal's past df = 30."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else _Z975


def across_seeds(values: list[float]) -> dict:
    """Mean of the per-seed values with a 95% t interval (None with fewer than two seeds) and whether
    the interval excludes ``null`` is left to the caller."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "n": 0, "sd": None}
    mean = sum(xs) / n
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": 1, "sd": None}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n, "sd": sd}


def across_seeds_ratio(values: list[float]) -> dict:
    """``across_seeds`` for a ratio (null 1): on the log scale, so the interval stays positive and a
    ratio and its inverse are treated alike. ``mean`` is the geometric mean, ``low`` / ``high`` the t
    interval of the mean log, exponentiated; ``sd`` is on the log scale; ``log`` says which scale was
    used: a value <= 0 (no ratio) falls back to ``across_seeds`` on the values themselves."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs or min(xs) <= 0:
        return {**across_seeds(xs), "log": False}
    logs = across_seeds([math.log(x) for x in xs])
    back = {k: (None if logs[k] is None else math.exp(logs[k])) for k in ("mean", "low", "high")}
    return {**back, "n": logs["n"], "sd": logs["sd"], "log": True}


def _number(x) -> float | None:
    """A table.json number (JSON writes infinities as strings) as a float; None when absent."""
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None


def _shared(figs: list[dict]) -> bool:
    """The seeds' figures are one interleaved-timing measurement repeated in every seed's report."""
    first = figs[0]
    return all(
        f.get("interval") == BY_REPEATS and all(f.get(k) == first.get(k) for k in ("value", "low", "high"))
        for f in figs
    )


def _unreached(figs: dict[str, dict]) -> list[str]:
    """Seeds where a time-to-level figure's arm or reference never reached the level."""
    return [
        seed
        for seed, f in figs.items()
        if "arm_s" in (f.get("extra") or {}) and None in (f["extra"].get("arm_s"), f["extra"].get("ref_s"))
    ]


def aggregate(tables: dict[str, dict]) -> dict:
    """{"seeds": [...], "comparisons": {arm: {key: {"per_seed": {seed: value}, "null", "label",
    **across_seeds, "resolved", "shared", "note"}}}} from each seed's table.json (``tables``: {seed label:
    content}); see the module docstring for ``shared`` and ``note``."""
    seeds = list(tables)
    out: dict = {"seeds": seeds, "interval": INTERVAL, "comparisons": {}}
    arms: dict[str, dict] = {}
    figs: dict[tuple[str, str], dict[str, dict]] = {}
    for seed, table in tables.items():
        for arm, figures in (table.get("comparisons") or {}).items():
            for key, fig in figures.items():
                slot = arms.setdefault(arm, {}).setdefault(
                    key, {"label": fig.get("label", key), "null": fig.get("null"), "per_seed": {}}
                )
                slot["per_seed"][seed] = fig.get("value")
                figs.setdefault((arm, key), {})[seed] = fig
    for arm, figures in arms.items():
        for key, slot in figures.items():
            these = figs[(arm, key)]
            null = slot["null"]
            unreached = _unreached(these)
            if len(these) > 1 and _shared(list(these.values())):
                f = next(iter(these.values()))
                stats = {"mean": _number(f.get("value")), "low": _number(f.get("low")),
                         "high": _number(f.get("high")), "n": f.get("n"), "sd": None}  # fmt: skip
                slot.update(stats, shared=True, note=f"one timing shared by every seed; {BY_REPEATS}")
            elif unreached:
                stats = {"mean": None, "low": None, "high": None, "n": 0, "sd": None}
                slot.update(
                    stats,
                    shared=False,
                    note="the level was not reached by both arms at " + ", ".join(unreached),
                )
            else:
                values = [_number(slot["per_seed"].get(s)) for s in seeds]
                stats = across_seeds_ratio(values) if null == 1.0 else across_seeds(values)
                slot.update(stats, shared=False, note=RATIO_NOTE if stats.pop("log", False) else None)
            void = next((f["void"] for f in these.values() if f.get("void")), "")
            if void:  # a seed's report could not read it as a finding (its timing's A/A control failed)
                slot["note"] = f"{slot['note']}; {void}" if slot.get("note") else void
            slot["resolved"] = (
                not void
                and slot["low"] is not None
                and slot["high"] is not None
                and null is not None
                and not (slot["low"] <= null <= slot["high"])
            )
    out["comparisons"] = arms
    out["learning"] = aggregate_learning(tables)
    return out


def aggregate_learning(tables: dict[str, dict]) -> dict:
    """{arm: {setting: {"per_seed": {seed: after − before}, "p": {seed: exact McNemar p}, **across_seeds,
    "resolved"}}}: each seed's held-out gain (its ``table.json`` verdict metrics, ``learning``), the mean
    gain across seeds with its t interval, resolved where that interval excludes 0."""
    seeds = list(tables)
    out: dict[str, dict] = {}
    for seed, table in tables.items():
        learned = ((table.get("verdict") or {}).get("metrics") or {}).get("learning") or {}
        for arm, settings in learned.items():
            for name, c in settings.items():
                slot = out.setdefault(arm, {}).setdefault(name, {"per_seed": {}, "p": {}})
                slot["per_seed"][seed] = _number(c.get("diff"))
                slot["p"][seed] = _number(c.get("p_two_sided"))
    for settings in out.values():
        for slot in settings.values():
            slot.update(across_seeds([slot["per_seed"].get(s) for s in seeds]))
            lo, hi = slot["low"], slot["high"]
            slot["resolved"] = lo is not None and hi is not None and stats_resolved(lo, hi, 0.0)
    return out


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def format_markdown(agg: dict, experiment: str) -> str:
    """One table per arm: each figure's per-seed values, the mean and its interval across seeds."""
    seeds = agg["seeds"]
    lines = [f"# {experiment}: {len(seeds)} seeds", "", f"Intervals: {agg['interval']}.", ""]
    for arm, figures in agg["comparisons"].items():
        lines += [f"## {arm} vs the reference", ""]
        lines.append("| figure | " + " | ".join(seeds) + " | mean [95% CI] | resolved |")
        lines.append("|---|" + "---:|" * len(seeds) + "---:|:---:|")
        for slot in figures.values():
            per = " | ".join(_fmt(_number(slot["per_seed"].get(s))) for s in seeds)
            ci = f"{_fmt(slot['mean'])} [{_fmt(slot['low'])}, {_fmt(slot['high'])}]"
            if slot.get("note"):
                ci = f"{ci} ({slot['note']})" if slot["mean"] is not None else f"n/a ({slot['note']})"
            lines.append(f"| {slot['label']} | {per} | {ci} | {'yes' if slot['resolved'] else 'no'} |")
        lines.append("")
    learning = agg.get("learning") or {}
    if learning:
        lines += ["## Learning: held-out accuracy after training minus before", ""]
        lines.append("| arm, setting | " + " | ".join(seeds) + " | mean [95% CI] | resolved |")
        lines.append("|---|" + "---:|" * len(seeds) + "---:|:---:|")
        for arm, settings in learning.items():
            for name, slot in settings.items():
                cells = []
                for seed in seeds:
                    d, p = slot["per_seed"].get(seed), slot["p"].get(seed)
                    cells.append(
                        "n/a" if d is None else f"{100 * d:+.1f} pt" + ("" if p is None else f" (p {p:.2g})")
                    )
                pt = lambda x: "n/a" if x is None else f"{100 * x:+.1f}"  # noqa: E731
                ci = f"{pt(slot['mean'])} pt [{pt(slot['low'])}, {pt(slot['high'])}]"
                lines.append(
                    f"| {arm}, {name} | {' | '.join(cells)} | {ci} | {'yes' if slot['resolved'] else 'no'} |"
                )
        lines += ["", "Per seed: the gain with its exact McNemar p over the same problems.", ""]
    return "\n".join(lines)


def write_seed_report(root: Path, tables: dict[str, dict], out_dir: Path) -> dict:
    """Write ``seeds.json`` and ``seeds.md`` into ``out_dir``; returns the aggregate."""
    agg = aggregate(tables)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "seeds.json").write_text(json.dumps(agg, indent=2))
    (out_dir / "seeds.md").write_text(format_markdown(agg, Path(root).name) + "\n")
    return agg
