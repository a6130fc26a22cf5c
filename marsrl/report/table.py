"""The side-by-side figures of an experiment: one column per arm, computed from its metric rows and
evaluation by small pure functions over ``(rows, key)``.  Missing, null and NaN values are skipped;
a figure with no value at all is ``None`` (printed as n/a).

How each figure summarises the steps:
    final reward        mean of the last 20% of the steps that logged a reward (at least one step)
    rates and speeds    mean over steps (tau, tokens/s, rollout share, relaxed fraction, ...)
    top-k excess ± SE   mean over steps; SE = sqrt(sum of per-step SE^2) / n, i.e. the steps are
                        treated as independent batches; n/a when any of those steps lacks its SE
    IS ratio min / max  min / max over steps of the per-step min / max
    wall-clock          the last ``wall_s``
    draft loss          mean of the last 20% of steps (its trend matters, not its average)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import finite, learning
from .load import Arm

FINAL_FRAC = 0.2


def values(rows: list[dict], key: str) -> list[float]:
    """The finite values of ``key`` in step order."""
    return [float(r[key]) for r in rows if finite(r.get(key))]


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def final_window(n: int, frac: float = FINAL_FRAC) -> int:
    """How many of ``n`` values make "the last ``frac``": ceil(frac * n), at least 1."""
    return max(1, math.ceil(frac * n)) if n else 0


def final_mean(rows: list[dict], key: str, frac: float = FINAL_FRAC) -> tuple[float | None, dict]:
    """Mean of the last ``frac`` of the finite values of ``key``; metrics: the window and its first step."""
    steps = [r["step"] for r in rows if finite(r.get(key))]
    xs = values(rows, key)
    w = final_window(len(xs), frac)
    if not w:
        return None, {"window": 0, "from_step": None}
    return mean(xs[-w:]), {"window": w, "from_step": steps[-w]}


def mean_with_se(rows: list[dict], key: str, se_key: str) -> tuple[float | None, float | None]:
    """Mean over steps of ``key`` and its SE, sqrt(sum se^2) / n over the same steps."""
    pairs = [(r[key], r.get(se_key)) for r in rows if finite(r.get(key))]
    if not pairs:
        return None, None
    n = len(pairs)
    m = sum(v for v, _ in pairs) / n
    if not all(finite(se) for _, se in pairs):
        return m, None
    return m, math.sqrt(sum(se * se for _, se in pairs)) / n


def last(rows: list[dict], key: str) -> float | None:
    xs = values(rows, key)
    return xs[-1] if xs else None


def _eval_parts(evaluation: dict | None, part: str) -> dict[str, dict]:
    """eval.json's ``before`` / ``after``: one result (``{"": result}``) or one per evaluation setting
    (``{"t1": ..., "greedy": ...}``), each cut to accuracy, interval and n."""
    got = (evaluation or {}).get(part) or {}
    results = (
        {"": got} if "accuracy" in got or not got else {k: v for k, v in got.items() if isinstance(v, dict)}
    )
    return {
        name: {k: r.get(k) if finite(r.get(k)) else None for k in ("accuracy", "ci_low", "ci_high", "n")}
        for name, r in results.items()
    }


def summarize_arm(arm: Arm, frac: float = FINAL_FRAC) -> dict:
    """Every figure of the table for one arm (flat keys; ``None`` where the arm logged nothing)."""
    rows = arm.rows
    m = lambda key: mean(values(rows, key))  # noqa: E731
    out: dict = {"steps": len(rows), "rule": arm.rule}
    out["final_reward"], window = final_mean(rows, "train/reward", frac)
    out["final_window"] = window["window"]
    out["mean_reward"] = m("train/reward")
    for part in ("before", "after"):
        for name, result in _eval_parts(arm.eval, part).items():
            key = f"acc_{name}_{part}" if name else f"acc_{part}"
            for k, v in result.items():
                out[key if k == "accuracy" else f"{key}_{k}"] = v
    for name, c in learning(arm.eval).items():
        out[f"gain_{name}"] = c["diff"]
        for k in ("ci_low", "ci_high", "p_two_sided", "n"):
            out[f"gain_{name}_{k}"] = c.get(k)
    tau = (arm.eval or {}).get("tau")
    out["eval_tau"] = tau if finite(tau) else None
    out["wall_s"] = max(values(rows, "wall_s"), default=None)
    out["rollout_share"] = m("train/rollout/share_of_step")
    out["tokens_per_s"] = m("train/rollout/tokens_per_s")
    out["tau"] = m("train/rollout/tau")
    out["relaxed_frac"] = m("train/rollout/relaxed_frac")
    for k in (1, 2):
        out[f"top{k}_excess"], out[f"top{k}_excess_se"] = mean_with_se(
            rows, f"train/bias/top{k}_excess", f"train/bias/top{k}_excess_se"
        )
        out[f"top{k}_rate"] = m(f"train/bias/top{k}_rate")
        out[f"top{k}_rate_expected"] = m(f"train/bias/top{k}_rate_expected")
    out["unsupported_mass"] = m("train/bias/unsupported_mass")
    out["is_ratio_mean"] = m("train/bias/is_ratio_mean")
    out["is_ratio_min"] = min(values(rows, "train/bias/is_ratio_min"), default=None)
    out["is_ratio_max"] = max(values(rows, "train/bias/is_ratio_max"), default=None)
    out["is_ratio_ess_frac"] = m("train/bias/is_ratio_ess_frac")
    out["is_ratio_mean_relaxed"] = m("train/bias/is_ratio_mean_relaxed")
    out["kl"] = m("train/kl")
    out["kl_behavior"] = m("train/bias/kl_behavior")
    out["draft_loss"] = final_mean(rows, "train/draft/loss", frac)[0]
    out["draft_refreshes"] = last(rows, "train/draft/refreshes")
    out["step_seconds"] = m("train/step_seconds")
    return out


# ---- formatting -------------------------------------------------------------------------------------


def _num(fmt: str):
    return lambda s, key: None if s.get(key) is None else format(s[key], fmt)


def _pct(s: dict, key: str) -> str | None:
    return None if s.get(key) is None else f"{100 * s[key]:.2f}%"


def _excess(s: dict, key: str) -> str | None:
    """A rate difference in percentage points, with its SE."""
    if s.get(key) is None:
        return None
    se = s.get(f"{key}_se")
    return f"{100 * s[key]:+.2f} ± {100 * se:.2f} pt" if se is not None else f"{100 * s[key]:+.2f} pt"


def _accuracy(s: dict, key: str) -> str | None:
    if s.get(key) is None:
        return None
    lo, hi, n = s.get(f"{key}_ci_low"), s.get(f"{key}_ci_high"), s.get(f"{key}_n")
    text = f"{s[key]:.3f}"
    if lo is not None and hi is not None:
        text += f" [{lo:.3f}, {hi:.3f}]"
    return text + (f" n={int(n)}" if n is not None else "")


def _gain(s: dict, key: str) -> str | None:
    """after − before in percentage points, its paired interval and the exact McNemar p."""
    if s.get(key) is None:
        return None
    lo, hi, p = s.get(f"{key}_ci_low"), s.get(f"{key}_ci_high"), s.get(f"{key}_p_two_sided")
    text = f"{100 * s[key]:+.1f} pt"
    if lo is not None and hi is not None:
        text += f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return text + (f" p={p:.2g}" if p is not None else "")


def _rate_vs_expected(s: dict, key: str) -> str | None:
    if s.get(key) is None:
        return None
    exp = s.get(f"{key}_expected")
    return f"{s[key]:.4f}" + (f" (exp {exp:.4f})" if exp is not None else "")


@dataclass(frozen=True)
class Row:
    label: str
    key: str
    fmt: object  # (summary, key) -> str | None


ROWS: tuple[Row, ...] = (
    Row("steps logged", "steps", _num("d")),
    Row("final reward (last 20% of steps)", "final_reward", _num(".4f")),
    Row("mean reward", "mean_reward", _num(".4f")),
    Row("held-out accuracy before [95% CI]", "acc_before", _accuracy),
    Row("held-out accuracy after [95% CI]", "acc_after", _accuracy),
    Row("held-out accuracy at T = 1, before [95% CI]", "acc_t1_before", _accuracy),
    Row("held-out accuracy at T = 1, after [95% CI]", "acc_t1_after", _accuracy),
    Row("held-out greedy accuracy, before [95% CI]", "acc_greedy_before", _accuracy),
    Row("held-out greedy accuracy, after [95% CI]", "acc_greedy_after", _accuracy),
    Row("held-out T = 1, after − before [95% CI], McNemar p", "gain_t1", _gain),
    Row("held-out greedy, after − before [95% CI], McNemar p", "gain_greedy", _gain),
    Row("tau at the end (eval.json)", "eval_tau", _num(".3f")),
    Row("wall-clock (s)", "wall_s", _num(".1f")),
    Row("step time (s, mean)", "step_seconds", _num(".2f")),
    Row("rollout share of step", "rollout_share", _pct),
    Row("rollout tokens/s", "tokens_per_s", _num(".1f")),
    Row("tau (tokens / round)", "tau", _num(".3f")),
    Row("relaxed fraction", "relaxed_frac", _pct),
    Row("top-1 excess ± SE", "top1_excess", _excess),
    Row("top-2 excess ± SE", "top2_excess", _excess),
    Row("top-1 rate (expected)", "top1_rate", _rate_vs_expected),
    Row("top-2 rate (expected)", "top2_rate", _rate_vs_expected),
    Row("unsupported mass", "unsupported_mass", _num(".5f")),
    Row("IS ratio mean", "is_ratio_mean", _num(".4f")),
    Row("IS ratio min", "is_ratio_min", _num(".4f")),
    Row("IS ratio max", "is_ratio_max", _num(".4f")),
    Row("IS ratio ESS share", "is_ratio_ess_frac", _num(".4f")),
    Row("IS ratio mean (relaxed tokens)", "is_ratio_mean_relaxed", _num(".4f")),
    Row("KL to reference (train/kl)", "kl", _num(".5f")),
    Row("KL(behaviour ‖ policy)", "kl_behavior", _num(".5f")),
    Row("draft loss (last 20% of steps)", "draft_loss", _num(".4f")),
    Row("draft refreshes", "draft_refreshes", _num(".0f")),
)


def table_cells(summaries: dict[str, dict], frac: float = FINAL_FRAC) -> list[dict]:
    """``[{"key", "label", "cells": {arm: text}}]``; a row no arm has a value for is left out."""
    out = []
    pct = f"{100 * frac:g}%"
    for row in ROWS:
        cells = {arm: row.fmt(s, row.key) for arm, s in summaries.items()}
        if all(c is None for c in cells.values()):
            continue
        label = row.label.replace("20%", pct)
        out.append({"key": row.key, "label": label, "cells": {a: c or "n/a" for a, c in cells.items()}})
    return out


def comparison_cells(comparisons: dict[str, dict], arms: list[str], ref: str) -> list[dict]:
    """Rows of the compared figures (``compare.compare_arms`` per arm): ``value [low, high]`` and a ``*``
    where the interval resolves a difference; the reference's cell is ``ref``."""
    from .verdict import format_figure

    keys = list(dict.fromkeys(k for figs in comparisons.values() for k in figs))
    out = []
    for key in keys:
        label = next(figs[key].label for figs in comparisons.values() if key in figs)
        cells = {}
        for arm in arms:
            f = comparisons.get(arm, {}).get(key)
            cells[arm] = (
                "ref"
                if arm == ref
                else ("n/a" if f is None else format_figure(key, f) + (" *" if f.resolved else ""))
            )
        kind = "ratio" if key.endswith("_ratio") else "difference"
        out.append({"key": key, "label": f"vs {ref}: {label}, {kind} [95% CI]", "cells": cells})
    return out


def format_markdown(rows: list[dict], arms: list[str]) -> str:
    """A Markdown table (columns padded so it also reads as plain text; ``|`` in a cell escaped)."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731  a literal | would split the cell
    header = ["", *map(cell, arms)]
    body = [[cell(r["label"]), *(cell(r["cells"][a]) for a in arms)] for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(line: list[str]) -> str:
        cells = (
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([fmt(header), rule, *map(fmt, body)])


def table_json(experiment: str, summaries: dict[str, dict], rows: list[dict], frac: float) -> dict:
    """What ``table.json`` holds: the numbers (``figures``, JSON-safe) and the formatted ``rows``."""
    clean = {
        a: {k: (v if v is None or isinstance(v, str) or finite(v) else None) for k, v in s.items()}
        for a, s in summaries.items()
    }
    return {
        "experiment": experiment,
        "arms": list(summaries),
        "final_frac": frac,
        "figures": clean,
        "rows": rows,
    }
