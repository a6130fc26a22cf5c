"""The cost model of adaptive speculation: the measured seconds of one whole round for a number of live
rows, a chain length k (0: a plain step) and a cache width, and the fits that turn calibration rounds
into it.

    t(rows, k, width) = level[rows] * (rounds[rows][k] + per_slot[rows][k] * width)

``rounds`` and ``per_slot`` come from the calibration (``calibration.py``), ``level`` from the rounds
of later calls (``CostModel.observe``).  What the planner does with it is in ``planner.py``; the design
is described in docs/engine.md.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from dataclasses import dataclass, field


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past the ends (xs sorted, len >= 1).

    Written as (1 - t) y0 + t y1: between two points that form keeps the order of two curves in
    floating point too (each product and the sum round monotonically), and gives ys[i] exactly at
    xs[i]; y0 + (y1 - y0) t can put a curve one ulp above another it equals at the point, so that a
    shorter chain's slot cost reads above a longer one's at a measured batch size."""
    if len(xs) == 1:
        return ys[0] * (x / xs[0] if xs[0] else 1.0)
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    t = (x - x0) / (x1 - x0)
    return (1 - t) * y0 + t * y1


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares a + b x through the points with b >= 0 (a longer chain never costs less): eight
    noisy round times become two numbers, so one slow measurement cannot flip the choice."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx, 0.0) if sxx else 0.0
    return my - slope * mx, slope


def lower_quartile(values: list[float]) -> float:
    """The (n - 1) // 4-th smallest: the least of up to four, the second of five to eight, ..."""
    return sorted(values)[(len(values) - 1) // 4]


def _pair_slopes(points: list[tuple[int, float]]) -> list[float]:
    return [(t1 - t0) / (w1 - w0) for (w0, t0), (w1, t1) in itertools.combinations(points, 2) if w0 != w1]


def context_slope(groups: list[list[tuple[int, float]]]) -> float:
    """Seconds a round gains per slot of cache width: the median of the slopes between every two rounds
    of a group (one k within one run: ``(width, seconds)`` each) at different widths, never below 0.

    Pairs are only taken within a group, so neither the k's different costs nor a run's level (a
    shared machine's slow spell lasts seconds) reads as a slope, and the median (Theil-Sen) lets a
    minority of slow rounds pass without tilting it."""
    slopes = [s for points in groups for s in _pair_slopes(points)]
    return max(statistics.median(slopes), 0.0) if slopes else 0.0


def context_line(groups: dict[int, list[list[tuple[int, float]]]]) -> dict[int, float]:
    """Seconds a slot of cache width adds to a round drafting k, for every k in ``groups`` (k -> groups
    of ``(width, seconds)`` rounds, as ``context_slope`` takes them), fitted jointly: k = 0 (a plain
    step: no drafter, one query a row) is ``context_slope`` of its own rounds, and the k >= 1 figures
    lie on one line a + b k through the pair slopes of every k at once (Theil-Sen in k: b the median
    of (s_q - s_p) / (k_q - k_p) over every two pair slopes at different k's, at least 0; a the median
    of s - b k), each figure at least 0.

    Why jointly: the line is what the model reads (``_shaped``), and a line through each k's own
    median leans on the few pairs each k has (nine in a default calibration), so one unlucky k can read
    0 and pull the line flat.  Fitted to every k's pairs, a k whose few rounds were unlucky is one
    column of many (``bench/context_slope.py`` compares the two fits; see docs/benchmarks.md)."""
    out = {k: context_slope(g) for k, g in groups.items() if k == 0}
    obs = [(k, s) for k, g in groups.items() if k > 0 for points in g for s in _pair_slopes(points)]
    ks = sorted({k for k, _ in obs})
    if len(ks) < 2:  # one k (or none) with pairs: its own median
        return {**out, **{k: context_slope(g) for k, g in groups.items() if k > 0}}
    b = max(
        statistics.median(
            (s1 - s0) / (k1 - k0) for (k0, s0), (k1, s1) in itertools.combinations(obs, 2) if k0 != k1
        ),
        0.0,
    )
    a = statistics.median(s - b * k for k, s in obs)
    return {**out, **{k: max(a + b * k, 0.0) for k in groups if k > 0}}


def _shaped(figures: dict[int, float], k_max: int) -> list[float]:
    """Per-k figures at one batch size as the model reads them, for k = 0 .. k_max: the plain step's own
    figure at k = 0, and a line in k through the k >= 1 figures (``_line``) never below it."""
    plain = figures.get(0)
    ks = sorted(j for j in figures if j > 0)
    if not ks:  # only plain steps measured here
        return [plain] * (k_max + 1)
    a, b = _line(ks, [figures[j] for j in ks])
    floor = plain if plain is not None else 0.0
    return [plain if k == 0 and plain is not None else max(a + b * k, floor) for k in range(k_max + 1)]


@dataclass
class CostModel:
    """Measured seconds of one whole round (draft, target forward, verification, commit, record) for
    ``rows`` live rows drafting k tokens (k = 0 a plain step) over a cache ``width`` slots wide (the
    shared time axis every row's attention reads):

        t(rows, k, width) = level[rows] * (rounds[rows][k] + per_slot[rows][k] * width)

    ``rounds[rows][k]``: the round at an empty cache (measured rounds with their context taken off);
    ``per_slot[rows][k]``: the seconds each slot of context adds (none measured means 0, and the model
    is the same at every width).  The table may give every k its own figure (the target scores k + 1
    queries against every slot, the drafter reads its cache once per draft); ``calibrate`` stores
    ``context_line``'s, already a line in k (one figure pooled over every k >= 1 would price a long
    chain's context low).  Both tables are read the same way: per
    measured batch size, the plain step's own figure at k = 0 and a line in k through the k >= 1
    figures (least squares, slope >= 0, never below the plain step; ``_shaped``): a speculative round
    pays the drafter's absorb and a wider forward even at k = 1, a step a line through k = 0 would
    smear over every k.  Interpolated linearly between sizes.

    Each ``rounds`` figure is the lower quartile of the calibration's runs behind it (``runs[rows][k]``:
    one figure a run, the median of its rounds; ``add_run``).  Noise on a shared machine only ever adds
    time, so a low quantile is the steady cost, and the calibration measures every k within the same
    second, so its figures rank the k's fairly.

    Later calls set the ``level`` of a batch size, never the ratios between its k's (``observe``): a
    call's rounds at a size, each against the calibrated seconds of its k at its width, give one ratio
    (their median), and the size's level is the lower quartile of its last ``keep`` ratios, the calibration
    counting as ``seed_runs`` ratios of 1.  Why not fold a call's rounds into the per-k figures: that
    judges the k the planner keeps choosing by its rounds in the workload (slowed by whatever else the
    machine does) and the k's it has left by their calibrated best, so the chosen k's figures rise, the
    line's slope steepens, and the planner drafts ever shorter.  ``per_slot`` is the calibration's
    too, scaled by the level with the rest of the round."""

    rounds: dict[int, dict[int, float]] = field(default_factory=dict)
    runs: dict[int, dict[int, list[float]]] = field(default_factory=dict)
    per_slot: dict[int, dict[int, float]] = field(default_factory=dict)
    levels: dict[int, list[float]] = field(default_factory=dict)
    keep: int = 32
    seed_runs: int = 3

    def add_run(self, rows: int, k: int, seconds: float) -> None:
        """One calibration run's figure for (rows, k); the model's figure becomes the lower quartile of
        the runs."""
        figures = self.rounds.setdefault(rows, {})
        runs = self.runs.setdefault(rows, {})
        if k not in runs:
            runs[k] = [figures[k]] * self.seed_runs if k in figures else []
        runs[k] = (runs[k] + [seconds])[-self.keep :]
        figures[k] = lower_quartile(runs[k])

    def level(self, rows: int) -> float:
        """The factor on a measured batch size's calibrated figures: the lower quartile of its observed
        calls' ratios, the calibration counting as ``seed_runs`` ratios of 1 (1.0 before any call)."""
        ratios = self.levels.get(rows)
        return lower_quartile([1.0] * self.seed_runs + ratios) if ratios else 1.0

    def observe(self, trace: list) -> None:
        """Fold a call's measured rounds ([start, live rows, k, seconds, width] each) into the levels:
        a round with L live rows counts at the measured batch size nearest to L (in log scale),
        rescaled by the model's ratio between the two sizes at the round's k and width, and is divided
        by the calibrated seconds of that k and width there; the rounds of one size make one ratio,
        their median, whatever their k's.  The whole round is judged, its context included: a figure
        at an empty cache can be near 0 where the context is most of a round (a plain step at many
        rows), and a ratio against it would read noise in the context's share as a level of several."""
        grid = sorted(self.rounds)
        if not grid:
            return
        k_max = max(self.rounds[grid[0]])
        tables: dict[int, tuple[list[float], list[float]]] = {}  # the model is unchanged until the end
        fitted = self.fitted(k_max)
        calibrated = {r: (_shaped(self.rounds[r], k_max), self.slot_seconds_upto(r, k_max)) for r in grid}

        def at(rows: int) -> tuple[list[float], list[float]]:
            if rows not in tables:
                tables[rows] = self.tables(rows, k_max, fitted)
            return tables[rows]

        def seconds_of(table: tuple[list[float], list[float]], k: int, width: int) -> float:
            base, slot = table
            return max(base[k] + slot[k] * width, 1e-9)

        groups: dict[int, list[float]] = {}
        for _, live, k, seconds, width in trace:
            if live < 1 or k not in self.rounds[grid[0]]:
                continue
            r = nearest_size(grid, live)
            scaled = seconds * seconds_of(at(r), k, width) / seconds_of(at(live), k, width)
            groups.setdefault(r, []).append(scaled / seconds_of(calibrated[r], k, width))
        for r, ratios in groups.items():
            self.levels[r] = [*self.levels.get(r, []), statistics.median(ratios)][-self.keep :]

    def slot_seconds(self, rows: int, k: int) -> float:
        return self.slot_seconds_upto(rows, k)[k]

    def slot_seconds_upto(self, rows: int, k_max: int) -> list[float]:
        """Seconds one slot of cache width adds to a round of ``rows`` live rows, for k = 0 .. k_max,
        as the calibration measured them (``tables`` gives them levelled)."""
        grid = sorted(self.per_slot)
        if not grid:
            return [0.0] * (k_max + 1)
        at = [_shaped(self.per_slot[r], k_max) for r in grid]
        return [max(_interp(grid, [row[k] for row in at], rows), 0.0) for k in range(k_max + 1)]

    def round_seconds(self, rows: int, k: int, width: int = 0) -> float:
        return self.round_seconds_upto(rows, k, width)[k]

    def round_seconds_upto(self, rows: int, k_max: int, width: int = 0) -> list[float]:
        """``round_seconds(rows, k, width)`` for k = 0 .. k_max, with one line fit per measured batch
        size and table (the planner asks for every k each round)."""
        base, slot = self.tables(rows, k_max)
        return [max(b + s * width, 1e-9) for b, s in zip(base, slot, strict=True)]

    def fitted(self, k_max: int) -> tuple[list[int], list[list[float]], list[int], list[list[float]]]:
        """The model's line fits at its measured batch sizes, levelled, for k = 0 .. k_max: (the sizes,
        each one's seconds a round at an empty cache per k, the sizes with a per-slot figure, each
        one's seconds a slot per k).  What ``tables`` interpolates between; fixed while the model is
        (a ``generate`` call), so the planner and ``observe`` fit once a call, not once a live batch
        size: a call at many rows meets nearly as many live batch sizes as it has rows, and a refit at
        each would be a noticeable share of the call's host time."""
        grid = sorted(self.rounds)
        base = [[self.level(r) * t for t in _shaped(self.rounds[r], k_max)] for r in grid]
        slot_grid = sorted(self.per_slot)
        slot = [[self.level(r) * t for t in _shaped(self.per_slot[r], k_max)] for r in slot_grid]
        return grid, base, slot_grid, slot

    def tables(self, rows: int, k_max: int, fitted: tuple | None = None) -> tuple[list[float], list[float]]:
        """For k = 0 .. k_max at ``rows`` live rows, levelled: the seconds of a round at an empty cache
        and the seconds each slot of width adds, so that ``round_seconds(rows, k, width)`` is
        ``max(base[k] + slot[k] * width, 1e-9)``.  ``fitted``: ``fitted(k_max)`` of this model as it
        is now (None fits it here); the planner also keeps the tables per live batch size."""
        grid, at, slot_grid, slot_at = fitted if fitted is not None else self.fitted(k_max)
        base = [_interp(grid, [row[k] for row in at], rows) for k in range(k_max + 1)]
        if not slot_grid:
            return base, [0.0] * (k_max + 1)
        slot = [max(_interp(slot_grid, [row[k] for row in slot_at], rows), 0.0) for k in range(k_max + 1)]
        return base, slot

    def to_dict(self) -> dict:
        return {
            "rounds": {str(r): {str(k): t for k, t in ks.items()} for r, ks in self.rounds.items()},
            "runs": {str(r): {str(k): list(v) for k, v in ks.items()} for r, ks in self.runs.items()},
            "per_slot": {str(r): {str(k): c for k, c in ks.items()} for r, ks in self.per_slot.items()},
            "levels": {str(r): list(v) for r, v in self.levels.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        def table(t: dict) -> dict[int, dict[int, float]]:
            return {int(r): {int(k): float(x) for k, x in ks.items()} for r, ks in t.items()}

        return cls(
            rounds=table(d["rounds"]),
            runs={
                int(r): {int(k): [float(t) for t in v] for k, v in ks.items()}
                for r, ks in d.get("runs", {}).items()
            },
            per_slot=table(d.get("per_slot", {})),
            levels={int(r): [float(x) for x in v] for r, v in d.get("levels", {}).items()},
        )


def nearest_size(grid: list[int], rows: int) -> int:
    """The measured batch size nearest to ``rows`` live rows, in log scale (grid sorted, non-empty)."""
    return min(grid, key=lambda g: abs(math.log(g / max(rows, 1))))
