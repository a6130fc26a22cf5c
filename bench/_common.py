"""The harness every bench uses, and helpers they share.

The harness: ``compare`` times several variants ``repeats`` times, interleaved in rotated order, into a
``Timings`` (medians, spreads, a ratio of two variants with a paired bootstrap interval); ``interleaved``
is the same rotation for a bench whose measurement is more than a timed call (a seed per repeat, an
engine's per-call stats), with ``clock`` for one call and ``timed`` for a call repeated for a minimum
duration; ``ratio_of_sums`` / ``pooled_ratio_of_sums`` give the ratio of
two systems' tokens/s over paired calls with its interval; ``emit`` prints the bench's one JSON object on
stdout.  Besides: probing whether an EngineConfig option exists, and summaries of the engine's per-call
stats (``k_per_round``, ``host_syncs``, ``cache_bytes_copied``, and with ``profile=True`` ``time``,
``forward_by_width`` and ``trace``), read with ``.get()`` so a bench runs on engines that lack some.

Imports only the standard library: ``bench.gpu`` runs on a machine that has torch, transformers and
marsrl's own modules and nothing else.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

Name = TypeVar("Name", bound=Hashable)


def spread(values: list[float], digits: int = 4) -> dict:
    """Median, min, max and interquartile range of repeated measurements (None for an empty list)."""
    if not values:
        return {"median": None, "min": None, "max": None, "iqr": None, "n": 0}
    vals = sorted(values)
    iqr = 0.0
    if len(vals) >= 2:
        q = statistics.quantiles(vals, n=4, method="inclusive")
        iqr = q[2] - q[0]
    return {
        "median": round(statistics.median(vals), digits),
        "min": round(vals[0], digits),
        "max": round(vals[-1], digits),
        "iqr": round(iqr, digits),
        "n": len(vals),
    }


def ratio_of_sums(
    num: list[tuple[float, float]],
    den: list[tuple[float, float]],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.9,
) -> dict | None:
    """Paired calls of two systems, ``(tokens, seconds)`` each, call i of both on the same prompts and
    seed: the ratio of their tokens/s over all the calls (sum of tokens over sum of seconds, each side)
    and a ``level`` bootstrap interval (the calls resampled as pairs with replacement, ``resamples``
    times, from ``random.Random(seed)``; percentile bounds).  A long call weighs by its length, as in the
    figure itself, and a slow spell that hit both calls of a pair stays paired.  None without pairs.
    (One run of ``pooled_ratio_of_sums``.)"""
    return pooled_ratio_of_sums([list(zip(num, den, strict=True))], resamples, seed, level)


def pooled_ratio_of_sums(
    strata: list[list[tuple[tuple[float, float], tuple[float, float]]]],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.9,
) -> dict | None:
    """``ratio_of_sums`` over several runs' paired calls at once: ``strata`` holds one list of
    ``((tokens, seconds), (tokens, seconds))`` pairs per run.  The figure is the ratio of tokens/s over
    every pair of every run; the bootstrap resamples each run's pairs within that run, so a run's pace
    (another machine, another hour) stays in its own calls.  A pair with a call of no seconds is left
    out.  None without pairs."""
    strata = [[(a, b) for a, b in s if a[1] > 0 and b[1] > 0] for s in strata]
    strata = [s for s in strata if s]
    if not strata:
        return None

    def ratio(samples) -> float:
        ta = sum(a[0] for s in samples for a, _ in s)
        sa = sum(a[1] for s in samples for a, _ in s)
        tb = sum(b[0] for s in samples for _, b in s)
        sb = sum(b[1] for s in samples for _, b in s)
        return (ta / sa) / (tb / sb) if tb else math.inf

    rng = random.Random(seed)
    boots = sorted(ratio([rng.choices(s, k=len(s)) for s in strata]) for _ in range(resamples))
    lo = boots[int((1 - level) / 2 * (resamples - 1))]
    hi = boots[int((1 + level) / 2 * (resamples - 1))]
    return {"value": round(ratio(strata), 4), "ci": [round(lo, 4), round(hi, 4)], "level": level,
            "n": sum(len(s) for s in strata)}  # fmt: skip


def timed(fn: Callable[[], int], min_seconds: float = 0.0) -> tuple[float, int, int]:
    """Call ``fn`` (it returns the tokens it produced) until at least ``min_seconds`` have passed, at
    least once: (wall seconds, tokens, calls).  A short call repeated this way is timed over a span long
    enough that a neighbour's burst on a shared machine moves it less."""
    calls = tokens = 0
    start = time.perf_counter()
    while True:
        tokens += fn()
        calls += 1
        wall = time.perf_counter() - start
        if wall >= min_seconds:
            return wall, tokens, calls


def interleaved(names: list[Name], repeats: int, measure: Callable[[Name, int], Any]) -> dict[Name, list]:
    """``measure(name, repeat)`` for every name, ``repeats`` times, the order rotated by one each repeat
    (so no system always runs first, after the same neighbour or in the same part of a noisy minute).
    A name is any hashable (a system's name, a setting's number); each name's list is in repeat order.
    A bench with untimed warm-up calls counts them among the repeats and drops them from the lists
    (``runs[name][warmup:]``), so the warm-up rotates with the rest."""
    runs: dict[str, list] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(measure(name, rep))
    return runs


def _bootstrap(statistic: Callable[[list[int]], float], n: int, resamples: int, seed: int, level: float):
    """Percentile bounds of ``statistic`` over ``resamples`` resamplings (with replacement, from
    ``random.Random(seed)``) of the indices 0..n-1."""
    rng = random.Random(seed)
    boots = sorted(statistic(rng.choices(range(n), k=n)) for _ in range(resamples))
    return boots[int((1 - level) / 2 * (resamples - 1))], boots[int((1 + level) / 2 * (resamples - 1))]


@dataclass
class Timings:
    """What ``compare`` measured: per variant, one entry per repeat in repeat order, so entry i of two
    variants was taken in the same rotation.  ``seconds[name][i]`` is the median over the repeat's calls;
    ``results[name][i]`` what the repeat's last call returned."""

    seconds: dict[str, list[float]]
    results: dict[str, list[Any]]

    def median(self, name: str) -> float:
        """The variant's median seconds over its repeats."""
        return statistics.median(self.seconds[name])

    def spread(self, name: str, digits: int = 4) -> dict:
        """Median, min, max and interquartile range of the variant's seconds (``spread``)."""
        return spread(self.seconds[name], digits)

    def ratio(
        self, num: str, den: str, resamples: int = 2000, seed: int = 0, level: float = 0.9, digits: int = 4
    ) -> dict:
        """Median seconds of ``num`` over median seconds of ``den`` (< 1: ``num`` is faster) and a
        ``level`` bootstrap interval, the repeats resampled as pairs (a slow spell that hit both
        variants of a repeat stays paired)."""
        a, b = self.seconds[num], self.seconds[den]

        def stat(idx: list[int]) -> float:
            return statistics.median(a[i] for i in idx) / statistics.median(b[i] for i in idx)

        lo, hi = _bootstrap(stat, len(a), resamples, seed, level)
        value = stat(list(range(len(a))))
        return {"value": round(value, digits), "ci": [round(lo, digits), round(hi, digits)], "level": level,
                "n": len(a)}  # fmt: skip


def clock(fn: Callable[[], Any], sync: Callable[[], Any] | None = None) -> tuple[float, Any]:
    """One call of ``fn``: (wall seconds, what it returned).  ``sync`` (a device's wait for its queued
    work, e.g. ``torch.cuda.synchronize``) is called before the clock starts, so earlier work is not
    counted, and after ``fn`` inside the timed span, so the work ``fn`` launched is."""
    if sync is not None:
        sync()
    start = time.perf_counter()
    result = fn()
    if sync is not None:
        sync()
    return time.perf_counter() - start, result


def compare(variants: dict[str, Callable[[], Any]], repeats: int, warmup: int = 0, calls: int = 1) -> Timings:
    """Time each variant ``repeats`` times, interleaved in rotated order (``interleaved``), after
    ``warmup`` untimed calls of each.  A repeat's figure is the median wall seconds of ``calls``
    back-to-back calls (a call preempted by a neighbour's burst moves it less)."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()

    def measure(name: str, rep: int) -> tuple[float, Any]:
        runs = [clock(variants[name]) for _ in range(calls)]
        return statistics.median(s for s, _ in runs), runs[-1][1]

    runs = interleaved(list(variants), repeats, measure)
    return Timings(
        seconds={name: [s for s, _ in rs] for name, rs in runs.items()},
        results={name: [r for _, r in rs] for name, rs in runs.items()},
    )


def emit(out: dict, indent: int = 2) -> dict:
    """Print the bench's one JSON object on stdout (its progress goes to stderr) and return it."""
    json.dump(out, sys.stdout, indent=indent, default=float)
    print()
    return out


def option_supported(cls, **kwargs) -> bool:
    """Whether ``cls(**kwargs)`` constructs: an engine without the option raises TypeError (unknown
    field, or a comparison with a string) or ValueError (a check that names the field)."""
    try:
        cls(**kwargs)
    except (TypeError, ValueError):
        return False
    return True


def batched_rounds(stats: dict) -> int | None:
    """Rounds of the whole batch (not per sequence): one target forward each after one prefill per
    batch of at most ``max_batch_size`` sequences; the caller keeps the request in one batch."""
    ks = stats.get("k_per_round")
    if ks is not None:
        return len(ks)
    forwards = stats.get("target_forwards")
    return forwards - 1 if forwards else None


def k_summary(ks: list[int] | None) -> dict | None:
    """Draft length verified each round: mean, median, min, max and {k: rounds} (0 = a plain step)."""
    if ks is None:
        return None
    if not ks:
        return {"mean": None, "median": None, "min": None, "max": None, "rounds": 0, "counts": {}}
    return {
        "mean": round(statistics.fmean(ks), 3),
        "median": statistics.median(ks),
        "min": min(ks),
        "max": max(ks),
        "rounds": len(ks),
        "counts": {str(k): n for k, n in sorted(Counter(ks).items())},
    }


def per_round(stats: dict) -> dict:
    """The call's counters per batched round: host syncs and cache bytes (None where the engine does
    not report them), and the draft lengths."""
    rounds = batched_rounds(stats)
    out = {"rounds": rounds, "k_per_round": k_summary(stats.get("k_per_round"))}
    for key in ("host_syncs", "cache_bytes_copied"):
        value = stats.get(key)
        out[key] = value
        out[f"{key}_per_round"] = round(value / rounds, 2) if value is not None and rounds else None
    return out


def breakdown(stats: dict) -> dict | None:
    """Where the call's time went (``profile=True`` stats): per phase the total seconds, milliseconds
    per batched round and share of the phases' sum; per target-forward width the calls, rows and
    milliseconds per call.  None when the engine reported no ``time``."""
    phases = stats.get("time")
    if not phases:
        return None
    rounds = batched_rounds(stats) or 0
    total = sum(phases.values())
    out = {
        "phases_s": {k: round(v, 5) for k, v in phases.items()},
        "ms_per_round": {k: round(v / rounds * 1e3, 3) if rounds else None for k, v in phases.items()},
        "share": {k: round(v / total, 4) if total else None for k, v in phases.items()},
        "forward_by_width": None,
    }
    by_width = stats.get("forward_by_width")
    if by_width is not None:
        out["forward_by_width"] = {
            w: {
                "calls": e["calls"],
                "rows": e["rows"],
                "ms_per_call": round(e["seconds"] / e["calls"] * 1e3, 3) if e["calls"] else None,
            }
            for w, e in sorted(by_width.items(), key=lambda kv: int(kv[0]))
        }
    return out


def tail(trace: list | None, sequences: int, wall: float, finished: float = 0.9) -> dict | None:
    """The call's tail from its per-round trace (one entry per round, taken at its start, beginning
    [elapsed_s, live_rows, ...]): the first round at which at most (1 - finished) of the sequences
    were still live, and the wall time from there to the end of the call (absolute and as a share of
    it).  None without a trace."""
    if trace is None:
        return None
    live_cap = sequences - finished * sequences  # 12.8 live rows of 128 is 90% finished
    for entry in trace:
        elapsed, live = entry[0], entry[1]
        if live <= live_cap + 1e-9:
            return {
                "t_at_finished_s": round(elapsed, 4),
                "tail_s": round(wall - elapsed, 4),
                "tail_share": round((wall - elapsed) / wall, 4) if wall else None,
                "rounds_in_tail": sum(1 for e in trace if e[0] >= elapsed),
            }
    return {"t_at_finished_s": None, "tail_s": 0.0, "tail_share": 0.0, "rounds_in_tail": 0}


def world_and_prompts(preset: str, world, count: int):
    """A tiny world and ``count`` of its held-out prompts for a bench's engine calls: (path, target,
    tokenizer, drafter, the preset's config, chat prompt ids).  The world is built when missing; its
    progress goes to stderr, since a bench's stdout carries only its JSON."""
    import contextlib
    import sys

    from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
    from marsrl.tinyworld.build import heldout_problems
    from marsrl.tinyworld.tokenizer import chat_prompt_ids

    with contextlib.redirect_stdout(sys.stderr):
        path = world or build_tinyworld(preset, progress=False)
        target, tok, head, _ = load_tinyworld(path)
    cfg = PRESETS[preset]
    prompts = [chat_prompt_ids(tok, p["question"]) for p in heldout_problems(cfg, count)]
    return path, target, tok, head, cfg, prompts
