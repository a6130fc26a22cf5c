"""The report's plots: every arm on the same axes, one PNG per figure, and beside each PNG a CSV with
exactly the series drawn (``arm, x, y`` and, for a band, ``y_low, y_high``; for a smoothed figure,
``y_smooth``).  The training reward is drawn raw (thin, faint) beside its smoothed curve (solid): a
debiased exponential moving average over the arm's steps, ``stats.ema`` with alpha ``stats.EMA_ALPHA``.

A row whose value is missing, null or NaN stays in the series with an empty ``y``: the line breaks
there (a gap), it is not bridged; a sparse figure (the held-out evaluations, every few steps) keeps only
the steps that logged it, with the result before training (``eval.json``) at step 0.  Rows without an x
(``wall_s`` absent) are left out.  An arm that never logged the key is not drawn; a figure no arm logged
is skipped.

Drawing uses matplotlib's Agg canvas on a bare ``Figure`` (no pyplot), so it needs no display and does
not change the process-wide backend.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from . import stats
from .base import finite
from .load import Arm


@dataclass(frozen=True)
class PlotSpec:
    title: str
    y: str  # the metric key, as logged
    ylabel: str
    x: str = "step"  # "step" or "wall_s"
    se: str | None = None  # a per-step standard error: drawn as a +-1 SE band
    smooth: bool = False  # also draw the EMA-smoothed curve (stats.ema), the raw one faint beside it
    low: str | None = None  # the keys of an interval drawn as a band (e.g. a Wilson 95% interval)
    high: str | None = None
    sparse: bool = False  # only the steps that logged ``y`` (an evaluation every few steps), joined
    before: str | None = None  # a held-out result in eval.json["before"] drawn at step 0

    @property
    def band(self) -> bool:
        return self.se is not None or self.low is not None


_SMOOTHED = "{} (faint: raw; solid: EMA, alpha " + f"{stats.EMA_ALPHA:g})"

PLOTS: dict[str, PlotSpec] = {
    "reward_step": PlotSpec(_SMOOTHED.format("reward vs step"), "train/reward", "mean reward", smooth=True),
    "reward_wall": PlotSpec(
        _SMOOTHED.format("reward vs wall-clock"), "train/reward", "mean reward", x="wall_s", smooth=True
    ),
    "tau": PlotSpec("accepted tokens per round (tau)", "train/rollout/tau", "tau"),
    "tokens_per_s": PlotSpec("rollout throughput", "train/rollout/tokens_per_s", "tokens / s"),
    "relaxed_frac": PlotSpec("relaxed fraction of rollout tokens", "train/rollout/relaxed_frac", "fraction"),
    "top2_excess": PlotSpec(
        "top-2 excess over exact sampling (±1 SE)",
        "train/bias/top2_excess",
        "rate - expected rate",
        se="train/bias/top2_excess_se",
    ),
    "unsupported_mass": PlotSpec("unsupported mass", "train/bias/unsupported_mass", "mass"),
    "is_ratio_mean": PlotSpec("importance ratio mean", "train/bias/is_ratio_mean", "mean pi / b"),
    "draft_loss": PlotSpec("draft loss", "train/draft/loss", "loss"),
    **{
        f"heldout_{name}": PlotSpec(
            f"held-out accuracy, {label} (band: Wilson 95%)",
            f"eval/{name}_accuracy",
            "accuracy",
            low=f"eval/{name}_ci_low",
            high=f"eval/{name}_ci_high",
            sparse=True,
            before=name,
        )
        for name, label in (("t1", "T = 1"), ("greedy", "greedy"))
    },
}
XLABELS = {"step": "step", "wall_s": "wall-clock (s)"}


def plot_series(arms: list[Arm], spec: PlotSpec) -> list[dict]:
    """The points drawn: ``{"arm", "x", "y"[, "y_low", "y_high"][, "y_smooth"]}``, ``None`` for a gap,
    arms in order."""
    out = []
    for arm in arms:
        if not any(finite(r.get(spec.y)) for r in arm.rows):
            continue
        smoothed = stats.ema([float(r[spec.y]) if finite(r.get(spec.y)) else None for r in arm.rows])
        before = _before_point(arm, spec)
        if before is not None:
            out.append(before)
        for r, smooth in zip(arm.rows, smoothed, strict=True):
            if not finite(r.get(spec.x)) or (spec.sparse and not finite(r.get(spec.y))):
                continue
            y = float(r[spec.y]) if finite(r.get(spec.y)) else None
            point = {"arm": arm.name, "x": r[spec.x], "y": y}
            if spec.se is not None:
                se = float(r[spec.se]) if finite(r.get(spec.se)) else None
                point["y_low"] = y - se if y is not None and se is not None else None
                point["y_high"] = y + se if y is not None and se is not None else None
            elif spec.low is not None:
                point["y_low"] = float(r[spec.low]) if finite(r.get(spec.low)) else None
                point["y_high"] = float(r[spec.high]) if finite(r.get(spec.high)) else None
            if spec.smooth:
                point["y_smooth"] = smooth
            out.append(point)
    return out


def _before_point(arm: Arm, spec: PlotSpec) -> dict | None:
    """The held-out result before training (eval.json), at step 0, for a spec that asks for it."""
    if spec.before is None or spec.x != "step" or not isinstance(arm.eval, dict):
        return None
    result = (arm.eval.get("before") or {}).get(spec.before)
    if not isinstance(result, dict) or not finite(result.get("accuracy")):
        return None
    return {
        "arm": arm.name,
        "x": 0,
        "y": float(result["accuracy"]),
        "y_low": float(result["ci_low"]) if finite(result.get("ci_low")) else None,
        "y_high": float(result["ci_high"]) if finite(result.get("ci_high")) else None,
    }


def write_series_csv(series: list[dict], path: Path, band: bool, smooth: bool = False) -> None:
    columns = ["arm", "x", "y", *(["y_low", "y_high"] if band else []), *(["y_smooth"] if smooth else [])]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for p in series:
            w.writerow(
                ["" if p[c] is None else (repr(p[c]) if isinstance(p[c], float) else p[c]) for c in columns]
            )


def read_series_csv(path: str | Path) -> list[dict]:
    """A series CSV back as dicts: ``x`` int where it was written as one, floats, ``None`` for gaps."""

    def num(text: str):
        if text == "":
            return None
        try:
            return int(text)
        except ValueError:
            return float(text)

    with Path(path).open(newline="") as f:
        return [{k: (v if k == "arm" else num(v)) for k, v in row.items()} for row in csv.DictReader(f)]


def draw(series: list[dict], spec: PlotSpec, path: Path, arm_names: list[str]) -> None:
    """Draw a series as a PNG (colour by the arm's place in ``arm_names``, the same in every plot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nan = math.nan
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name in dict.fromkeys(p["arm"] for p in series):
        pts = [p for p in series if p["arm"] == name]
        color = f"C{arm_names.index(name) % 10}" if name in arm_names else None
        xs = [p["x"] for p in pts]
        ys = [nan if p["y"] is None else p["y"] for p in pts]
        if spec.smooth:
            ax.plot(xs, ys, color=color, alpha=0.35, linewidth=0.8)
            sm = [nan if p["y_smooth"] is None else p["y_smooth"] for p in pts]
            ax.plot(xs, sm, color=color, linewidth=1.8, label=name)
        else:
            ax.plot(xs, ys, marker=".", color=color, label=name)
        if spec.band:
            lo = [nan if p["y_low"] is None else p["y_low"] for p in pts]
            hi = [nan if p["y_high"] is None else p["y_high"] for p in pts]
            ax.fill_between(xs, lo, hi, color=color, alpha=0.2, linewidth=0)
    if spec.se is not None:
        ax.axhline(0.0, color="0.5", linewidth=0.8, linestyle="--")
    ax.set_title(spec.title)
    ax.set_xlabel(XLABELS.get(spec.x, spec.x))
    ax.set_ylabel(spec.ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")


def write_plots(arms: list[Arm], out_dir: Path, plots: dict[str, PlotSpec] = PLOTS) -> tuple[dict, list[str]]:
    """Every figure of ``plots`` as ``<name>.png`` + ``<name>.csv`` in ``out_dir``.

    Returns ({name: {"png", "csv", "points"}}, [names skipped because no arm logged their key]).
    """
    names = [a.name for a in arms]
    written, skipped = {}, []
    for name, spec in plots.items():
        series = plot_series(arms, spec)
        if not series:
            skipped.append(name)
            continue
        png, csv_path = out_dir / f"{name}.png", out_dir / f"{name}.csv"
        write_series_csv(series, csv_path, band=spec.band, smooth=spec.smooth)
        draw(series, spec, png, names)
        written[name] = {"png": png, "csv": csv_path, "points": len(series)}
    return written, skipped
