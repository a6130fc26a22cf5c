"""Several ``bench/scale.py`` runs read as one: every bar the runs judged on their head-to-heads,
pooled over the runs.

    python -m bench.scale > a.json && python -m bench.scale > b.json && python -m bench.scale > c.json
    python -m bench.pool_scale a.json b.json c.json

Why: one run's head-to-head measures an auto bar to a few percent on a small shared CPU (48
calls a system at B <= 32), while auto and the best fixed k differ by less than that where the k curve
is flat, so a single run's verdict on the 0.97 bar can move from run to run.  Pooled, the
same calls give one figure per bar with an interval about sqrt(runs) narrower.

How each bar is pooled, in order of preference (``method`` in the output):

- ``"pairs"``: every run kept its head-to-head calls (``results[B]["confirm"]["pairs"]``: {system:
  [[tokens, seconds], ...]}, written by ``bench/scale.py``): the ratio of
  tokens/s over all runs' calls, sums over sums as in one run, with a 90% bootstrap interval that
  resamples each run's pairs within that run (``pooled_ratio_of_sums``; the runs are strata, as a
  machine's pace differs between them).  With one run this is the run's own figure exactly.
- ``"intervals"``: some run has no calls kept (older output of ``bench/scale.py``): each run's figure
  and 90% interval, read as a normal on the log scale, pooled by inverse variance (``inverse_variance``).

The pair of systems is each run's own: auto / best fixed compares auto with the best fixed system that
run's sweep picked, which may differ between runs (``per_run`` lists each run's figure and ``best``).
Bars a run judged on its sweep alone (no head-to-head for that pair) are left out.  Prints one JSON
object: ``bars`` ({batch: {bar: {value, ci, bar, pass, resolved, method, runs, pairs, per_run}}}),
``failed``, ``failed_resolved`` (the pooled interval wholly under the bar) and ``unresolved`` (every
bar whose pooled interval holds its level).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from statistics import NormalDist

from bench._common import pooled_ratio_of_sums


def bar_systems(name: str, bar: dict) -> tuple[str, str] | None:
    """The two systems a ``bench/scale.py`` bar divides (as ``compute_bars`` names its bars), or None
    for a name it does not know."""
    for rule in ("strict", "mars"):
        if name == f"{rule}_auto_vs_best_fixed":
            return (f"{rule}_auto", bar.get("best")) if bar.get("best") else None
        if name in (f"{rule}_auto_vs_plain", f"{rule}_auto_speedup"):
            return f"{rule}_auto", "plain"
    if name.startswith("mars_vs_strict_"):
        shape = name.removeprefix("mars_vs_strict_")
        return f"mars_{shape}", f"strict_{shape}"
    return None


def inverse_variance(readings: list[dict], level: float = 0.9) -> dict:
    """Ratios ``{value, ci}`` (each a ``level`` interval) pooled on the log scale by inverse variance:
    each interval read as value * exp(+-z sigma).  A reading whose interval has no width (one call)
    cannot be weighed and is left out; None-free input assumed."""
    z = NormalDist().inv_cdf((1 + level) / 2)  # a level interval is +-z sigma
    num = den = 0.0
    used = 0
    for r in readings:
        lo, hi = r["ci"]
        sigma = (math.log(hi) - math.log(lo)) / (2 * z) if lo > 0 and hi > lo else 0.0
        if sigma <= 0:
            continue
        w = 1.0 / sigma**2
        num += w * math.log(r["value"])
        den += w
        used += 1
    if not used:
        return {"value": None, "ci": None, "level": level, "n": 0}
    mean, sigma = num / den, 1.0 / math.sqrt(den)
    lo, hi = math.exp(mean - z * sigma), math.exp(mean + z * sigma)
    return {"value": round(math.exp(mean), 4), "ci": [round(lo, 4), round(hi, 4)], "level": level, "n": used}


def pool(runs: list[dict]) -> dict:
    """The pooled bars of ``bench/scale.py`` outputs ``runs`` (see the module's docstring)."""
    batches = [b for b in runs[0]["bars"] if b.startswith("batch_") and all(b in r["bars"] for r in runs)]
    out: dict = {"runs": len(runs), "bars": {}}
    for batch in batches:
        row = {}
        for name, first in runs[0]["bars"][batch].items():
            bars = [r["bars"][batch].get(name) for r in runs]
            if any(b is None or not b.get("confirm") for b in bars):
                continue  # judged on a sweep in some run: no calls to pool
            systems = [bar_systems(name, b) for b in bars]
            if None in systems:
                continue
            kept = [((r["results"].get(batch) or {}).get("confirm") or {}).get("pairs") for r in runs]
            strata = []
            for calls, (num, den) in zip(kept, systems, strict=True):
                if not calls or num not in calls or den not in calls:
                    strata = None
                    break
                strata.append(list(zip(map(tuple, calls[num]), map(tuple, calls[den]), strict=True)))
            if strata is not None:
                pooled, method = pooled_ratio_of_sums(strata), "pairs"
                pairs = sum(len(s) for s in strata)
            else:
                pooled, method = inverse_variance([b["confirm"] for b in bars]), "intervals"
                pairs = sum(b["confirm"]["n"] for b in bars)
            if pooled is None:  # no call with any seconds in it: nothing to pool
                continue
            level = first["bar"]
            value, ci = pooled["value"], pooled["ci"]
            row[name] = {
                "value": value,
                "ci": ci,
                "bar": level,
                "pass": value >= level if value is not None else None,
                "resolved": (ci[1] < level or ci[0] >= level) if ci else None,
                "method": method,
                "runs": len(runs),
                "pairs": pairs,
                "per_run": [
                    {"value": b["confirm"]["value"], "ci": b["confirm"]["ci"], "n": b["confirm"]["n"]}
                    | ({"best": b["best"]} if "best" in b else {})
                    for b in bars
                ],
            }
        out["bars"][batch] = row
    named = [(f"{batch}.{name}", b) for batch, row in out["bars"].items() for name, b in row.items()]
    out["failed"] = [n for n, b in named if b["pass"] is False]
    out["failed_resolved"] = [n for n, b in named if b["pass"] is False and b["resolved"]]
    out["unresolved"] = [n for n, b in named if b["resolved"] is False]
    return out


def load(path: str) -> dict:
    """One ``bench/scale.py`` output; ValueError naming the file where it is not one."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    try:
        run = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(run, dict) or run.get("bench") != "scale" or "bars" not in run or "results" not in run:
        raise ValueError(f"{path}: not a bench/scale.py output (no 'bench': 'scale' with bars and results)")
    return run


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN.json", help="bench/scale.py outputs (one or more)")
    args = ap.parse_args(argv)
    try:
        runs = [load(p) for p in args.runs]
    except ValueError as e:
        print(f"pool_scale: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    out = {"bench": "pool_scale", "files": args.runs, **pool(runs)}
    json.dump(out, sys.stdout, indent=2)
    print()
    return out


if __name__ == "__main__":
    main()
