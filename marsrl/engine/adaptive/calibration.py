"""Measuring a ``CostModel`` on an engine's own models: whole rounds at every k, over a grid of live batch
sizes, with a planner that cycles k (``CycleK``) through the engine's ordinary decode loop.  The engine's
``calibrate`` and ``calibration_runs`` are these functions; docs/engine.md describes the model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch

from ..config import SamplingParams
from .costs import CostModel, context_line
from .planner import CycleK, FixedK


def calibrate(
    engine,
    rows: Sequence[int] | None = None,
    context: int = 64,
    repeats: int = 3,
    prompts: Sequence[Sequence[int]] | None = None,
    cycles: int = 3,
    span: int = 64,
    repeat: int = 2,
):
    """Measure a ``CostModel`` on ``engine``'s models: whole rounds drafting k = 0 .. K tokens for
    about each live batch size in ``rows`` (default 1, 4, 16, ... up to max_batch_size), as groups of
    up to 8 rows sharing a prompt (a GRPO batch).  The prompts are ``prompts`` where given (the first
    ``generate`` call calibrates on its own, so context lengths and the drafter's acceptance, which
    sets how many pairs a round absorbs, are the workload's), else random ones of ``context`` tokens.

    A run is one call whose rounds cycle through k = 0 .. K ``cycles`` times, or more to decode at
    least ``span`` tokens a row, each k ``repeat`` rounds in a row of which only the last is timed
    (``CycleK``; every row live throughout, the first round left out): a round's drafter absorbs
    what the round before it kept, so the timed round costs what a run at its k costs (cycling one
    round a k would make k = 1 absorb K's pairs when passing up, and K absorb k = 1's when passing
    down; ``bench/calibration_bias.py`` measures the difference).  The context grows along a run, so
    the rounds give the seconds a slot of cache width adds (``CostModel.per_slot``): the plain step's
    own figure (``context_slope``: the median slope between two rounds of one run) and one line in k
    fitted to the pairs of rounds of every k >= 1 at once (``context_line``): a round drafting k reads
    the cache k + 1 times in the target's block and once per draft step in the drafter, so a slot
    costs more the longer the chain; a figure pooled over every k >= 1 would price K's context low and
    k = 1's high, and lean the choice toward long chains at the wide caches late in a call.  A run's
    figure for k is the median of its timed rounds at k with their context taken off, and each k's
    figure is the lower quartile of its runs' (``CostModel.add_run``; the least of up to four).  A
    round's time varies little within a run, but a shared machine slows whole seconds at a time: with
    every k measured within the same second, such a spell moves all k's alike, and as it only ever
    adds time the least run is the steady cost, the one that ranks the k's.  The runs sweep k up and
    down in turn.  On a GPU a round already ends in the engine's one device -> host copy, so wall time
    per round is device time."""
    if repeat < 1 or cycles < 1:
        raise ValueError(f"calibrate: repeat and cycles must be >= 1, got repeat={repeat}, cycles={cycles}")
    top = engine.config.max_batch_size
    rows = sorted(set(rows or [*(4**i for i in range(8) if 4**i < top), top]))
    costs = CostModel()
    gen = torch.Generator().manual_seed(0)
    given = [list(p) for p in prompts] if prompts else None
    saved = engine.stats
    ks = list(range(engine._k_max + 1))
    for want in rows:
        group = min(8, want)
        n = max(want // group, 1)
        if given:
            batch = [given[i % len(given)] for i in range(n)]
        else:
            batch = torch.randint(0, engine.vocab_size, (n, context), generator=gen).tolist()
        r = n * group
        engine._generate(batch, SamplingParams(max_new_tokens=2, n=group, ignore_eos=True), FixedK(0))
        runs = engine.calibration_runs(batch, group, repeats, cycles, span, repeat)
        # the plain step's own slope and one line in k through every k >= 1's pairs (``context_line``)
        costs.per_slot[r] = context_line({k: [run[k] for run in runs if k in run] for k in ks})
        slopes = costs.slot_seconds_upto(r, ks[-1])  # as the model reads them
        for rounds in runs:
            for k, points in sorted(rounds.items()):
                costs.add_run(r, k, statistics.median(t - slopes[k] * w for w, t in points))
    engine.stats = saved
    return costs


def calibration_runs(
    engine,
    batch: Sequence[Sequence[int]],
    group: int,
    repeats: int = 3,
    cycles: int = 3,
    span: int = 64,
    repeat: int = 2,
    seed: int = 0,
) -> list[dict[int, list[tuple[int, float]]]]:
    """The timed rounds of ``calibrate``'s runs at one batch size (``batch`` prompts, ``group`` rows
    each), one dict a run: k -> [(cache width, seconds), ...] of the rounds timed with every row
    live.  Run i cycles k = 0 .. K (down for odd i) with sampling seed ``seed + i``; see
    ``calibrate`` for cycles, span and repeat.  Leaves ``stats`` as the last run's."""
    ks = list(range(engine._k_max + 1))
    per_pass = repeat * sum(k + 1 for k in ks)  # tokens a row decodes at most in one pass over ks
    cycles = max(cycles, math.ceil(span / per_pass))
    new = cycles * per_pass + ks[-1] + 1  # no row can finish before the cycles end
    rows = len(batch) * group
    runs = []
    for rep in range(repeats):
        sp = SamplingParams(max_new_tokens=new, n=group, ignore_eos=True, seed=seed + rep)
        plan = CycleK(ks if rep % 2 == 0 else ks[::-1], cycles, repeat)
        engine._generate(batch, sp, plan)
        rounds: dict[int, list[tuple[int, float]]] = {}
        # a call cut short (a row at the model's context limit) simply has fewer rounds
        for measured, (_, live, k, t, width) in zip(plan.measured, engine._totals["trace"], strict=False):
            if measured and live == rows:
                rounds.setdefault(k, []).append((width, t))
        runs.append(rounds)
    return runs
