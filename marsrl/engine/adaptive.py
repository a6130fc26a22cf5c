"""Adaptive speculation (``EngineConfig(num_draft_tokens="auto", max_draft_tokens=K)``): each round the
engine drafts the k in {0, ..., K} that maximises expected tokens per second for the live batch,

    k* = argmax_k  rows * E[tokens | k] / t_round(rows, k, width)

    E[tokens | k] = 1 + sum_{j=1..k} prod_{i<=j} a_i        (a_i: P(draft i accepted | drafts < i were))

k = 0 is a plain step (one target forward, no drafter: the drafter absorbs the run's pairs with the next
speculative round, every one of them or each row's last ``EngineConfig.drafter_window``).  t_round
comes from a ``CostModel`` measured on
the engine's own models (``SpeculativeEngine.calibrate``: whole rounds timed at each k over a grid of
live batch sizes, so drafting, verification and the host's bookkeeping are all in it), once per engine;
every call's measured rounds then set each batch size's level, all k alike, and never the ratios
between k's, which only the calibration measures fairly (its k's share each second; see
``CostModel``).  It is taken at the round's context: every round reads
each live row's cached keys and values, so its time grows with the cache's width (the shared time
axis, in slots) by an added cost per slot: the plain step's own figure and one line in k through the
rounds of every k >= 1 (``context_line``): the target's block attends over
every slot from each of its k + 1 queries and the drafter once a draft step, so a slot costs a longer
chain more.  The a_i are running estimates from the rounds of the current ``generate`` call
(``AcceptanceEstimates``), started from the engine's earlier calls, scaled down to a few dozen rounds;
where the engine names its live rows, E[tokens | k] is that of the rows still live (their own counts
pooled, ``RowAcceptance``), each row's capped by the tokens it may still make.
The carry-overs (the levels, the estimates and the count of speculative rounds that times exploration)
are off with
``EngineConfig(adapt_costs=False)``: the choice is then a pure function of the cost model, the call's
own outcomes and its seed, and the same engine reproduces the same K sequence.  Exactness does not
depend on k: every round is verified by the same rule, and a chain of any length (0 included) is
lossless under strict.

The workload's check (``SpeedCheck``, ``EngineConfig(speed_check=True)``, the default with
``adapt_costs``): the levels move every k alike, so an error of the calibration in the ratio of a
speculative round to a plain step stays.  Where that ratio decides (the two kinds within
``explore_within`` of each other: strict at 128 rows on this project's CPU, where the calibration's
few-percent error flipped the choice and auto read 0.89-0.93x plain) each round's measured seconds
are set against its prediction per kind, the predicted seconds of every k >= 1 are multiplied by the
measured ratio of the two kinds, and now and then a near-tie round at a batch size runs the kind the
model ranks second, so that both are measured: the ``tie_every``-th, then ever more rarely while each
such measurement confirms the ranking (``SpeedCheck.tie_due``).

The switch's price (with the ``SpeedCheck``): after plain steps the first speculative round absorbs
every pair they left the drafter, at each live row (``_EagleState.debt``), a cost no steady round has.
The check measures it (``SpeedCheck.pair_seconds``: catch-up rounds' seconds past a steady round's, per
pair), and the planner switches from plain steps to its best k only where that k's saving on the tokens
the live rows are still expected to make (``Lengths``: the last call's completion lengths) covers the
catch-up; an exploring switch (a probe, a near tie's measurement) waits while its catch-up costs more
than its round (``KPlanner._pays``).

Exploration: a round learns nothing about the positions past its k.  So after ``probe_every`` plain rounds
in a row the engine drafts once at the best k >= 1 (each probe that still loses to plain doubles the
wait; the run and the wait carry over the engine's calls, and a probe that turns the choice to
drafting resets it), and every ``explore_every``-th speculative round (counted over the engine's calls:
a call at B = 1 has fewer rounds than that) drafts past the best k: to the deepest k whose expected rate
is within ``explore_within`` (10%) of the best's, at least one position past it (up to K).
Without it a pessimistic early estimate of a deep position is never revised and a shorter k than the
best is kept for good; with it each deeper position is re-measured every few dozen rounds, for the
price of one round in ``explore_every`` at most 10% slower than the best.  Where the optimum is flat (a
few live rows, whose rounds cost about the same at any k) that reaches K, so the deepest positions are
measured too and not left on one unlucky early sample; where long chains cost (many rows) it stays next
to the best.

Left out: per-row k (the target forward's width is the batch's largest k anyway), trees.
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
    xs[i]; y0 + (y1 - y0) t can put a curve one ulp above another it equals at the point, which made
    the model's slot cost at k = 1 read above k = 2's at a measured batch size (a test's flake)."""
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
    median leaned on medians of a few pairs each (nine in a calibration): on this CPU a high k's median
    read 0 in three calibrations of six and pulled the line flat (``bench/context_slope.py``).  Fitted
    to every k's pairs, a k whose few rounds were unlucky is one column of many."""
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
    ``context_line``'s, already a line in k (it pooled every k >= 1 into one figure until 2026-12-04,
    which priced a long chain's context low, and then fitted the line to each k's own figure; see
    ``calibrate``).  Both tables are read the same way: per
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
    counting as ``seed_runs`` ratios of 1.  Folding a call's rounds into the per-k figures instead, as
    this model once did, judged the k the planner kept choosing by its rounds in the workload and the
    k's it had left by their calibrated best: at B = 1 on this CPU the chosen K = 6 and K = 7 figures
    rose from 5.75 / 5.77 ms to 6.09 / 6.73 ms over one run while K = 1..5 kept theirs, the line's slope
    steepened, and the planner drafted ever shorter (2026-12-02).  ``per_slot`` is the calibration's
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
        at an empty cache can be near 0 where the context is most of a round (the plain step at 128
        rows on this CPU: 1.5 ms empty, 158 us a slot), and a ratio against it would read noise in
        the context's share as a level of 3-7."""
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
        size: refitted for each, the tables cost 0.25-0.4 ms, and a 128-row call meets ~100 sizes
        (15-30 ms of a 4.6 s call on this CPU, ``KPlanner.choose`` and ``observe`` timed apart,
        2026-12-06)."""
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


class AcceptanceEstimates:
    """Per-position conditional acceptance a_1..a_K.  Each position's estimate is shrunk towards the
    pooled rate of all positions (``pool`` pseudo-observations), itself starting from 1/2: a position
    the planner has stopped drafting keeps a fair guess instead of a frozen early one."""

    def __init__(self, k_max: int, pool: float = 4.0):
        self.accepted = [0.0] * k_max
        self.reached = [0.0] * k_max
        self.pool = pool

    def update(self, drafted: int, accepted: int) -> None:
        """One row's round: ``drafted`` drafts verified, the first ``accepted`` of them kept."""
        for j in range(min(accepted + 1, drafted)):  # positions 1..accepted+1 were reached
            self.reached[j] += 1
            if j < accepted:
                self.accepted[j] += 1

    def carried(self, cap: float = 64.0) -> AcceptanceEstimates:
        """A copy for the next call: each position's counts scaled down to at most ``cap`` reached
        rounds (its rate kept), so what the new call measures outweighs the past within a few rounds
        (the policy, and with it the acceptance, moves between RL steps)."""
        out = AcceptanceEstimates(len(self.reached), self.pool)
        for j, (a, r) in enumerate(zip(self.accepted, self.reached, strict=True)):
            scale = min(1.0, cap / r) if r else 1.0
            out.accepted[j], out.reached[j] = a * scale, r * scale
        return out

    @property
    def observed(self) -> bool:
        return any(self.reached)

    def rate(self, j: int) -> float:
        return self.rates()[j]

    def rates(self) -> list[float]:
        """Each position's rate, its counts shrunk toward the pooled rate of all positions."""
        pooled = (sum(self.accepted) + 1) / (sum(self.reached) + 2)
        pairs = zip(self.accepted, self.reached, strict=True)
        return [(a + self.pool * pooled) / (r + self.pool) for a, r in pairs]

    def expected_tokens(self, k: int) -> float:
        return self.expected_tokens_upto(k)[k]

    def expected_tokens_upto(self, k_max: int) -> list[float]:
        """``expected_tokens(k)`` for k = 0 .. k_max in one pass."""
        out, total, run = [1.0], 1.0, 1.0
        for a in self.rates()[:k_max]:
            run *= a
            total += run
            out.append(total)
        return out


class RowAcceptance:
    """The acceptance of the rows still live, within one ``generate`` call: each row's counts are kept,
    and a round's expected tokens come from the per-position rates of the live rows' counts pooled
    (shrunk toward the call's rates by ``prior`` pseudo-observations), each row's capped by the tokens
    it may still make.

    Why: acceptance differs from row to row (a prompt, a completion that loops), and the rows still
    live late in a call are not a sample of the call's rows: they are its long ones.  Measured with
    ``python bench/live_rows.py`` (default world, B = 128, mars, 16 calls, 2026-12-06 on an AVX-512
    machine; ``kept_over_expected``: drafts kept plus one a row over what the planner expected): on
    the call's pooled estimates the k = 7 rounds under 8 live rows kept 0.79 of it (5.20 expected, 4.10
    kept) and k = 6 0.87, and at 8-31 rows 0.88-0.96; on the live rows' rates the rounds under 32 rows
    kept 0.81-1.34 (1.04-1.13 for the k's drafted most).  An earlier reading of the same comparison
    that day (a throwaway script, auto alone, 8 calls) had the k = 7 rounds under 8 rows keep 0.45 of
    what the pooled estimates expected.

    Why the live rows' counts pooled, not each row's own chain averaged (tried first): a row's few
    rounds make its per-position rates noisy and correlated (one lucky round raises every position it
    reached), and a mean of products of such estimates runs high: at 128 live rows the planner drafted
    k = 5 about twice as often as before, and side by side it read 0.974 [0.953, 0.996] and 0.987
    [0.959, 1.013] of the pooled estimates.  Pooled over the live rows, the rates are those of the live
    population and the product is that population's chain.  At a call's start (nothing counted yet)
    they are the call's own rates; later, every row still live, they weigh the call's own rounds above
    those carried from the engine's earlier calls (which count only through the ``prior``).  Side by
    side with the call's pooled estimates (one calibration copied to both, 2026-12-06, this session's
    AVX-512 machine; throwaway runs before ``bench/live_rows.py`` was written): mars 1.036 [1.001, 1.071]
    at B = 128 (``bench/live_rows.py`` after: 1.015 [0.981, 1.055]) and 0.995
    [0.971, 1.020] at B = 32, strict 0.987 [0.948, 1.023] at B = 128: tokens a second move by less than
    this machine resolves (one mars B = 128 run excepted, and its rerun did not repeat it); what changed
    for sure is that the planner's predictions under 32 live rows are now about right."""

    def __init__(self, k_max: int, prior: float = 4.0):
        self.k_max, self.prior = k_max, prior
        self.counts: dict[int, AcceptanceEstimates] = {}  # each row's counts, by its key

    def update(self, key: int, drafted: int, accepted: int) -> None:
        if key not in self.counts:
            self.counts[key] = AcceptanceEstimates(self.k_max)
        self.counts[key].update(drafted, accepted)

    def rates(self, pooled: list[float], keys: list[int]) -> list[float]:
        """Per position: the live rows' (``keys``) accepted over reached, with ``prior``
        pseudo-observations at ``pooled`` (the call's rate there, ``AcceptanceEstimates.rates``)."""
        acc, reached = [0.0] * self.k_max, [0.0] * self.k_max
        for key in keys:
            row = self.counts.get(key)
            if row is not None:
                for j in range(self.k_max):
                    acc[j] += row.accepted[j]
                    reached[j] += row.reached[j]
        prior = self.prior
        return [(a + prior * p) / (r + prior) for a, r, p in zip(acc, reached, pooled, strict=True)]

    def expected_tokens_upto(self, pooled: list[float], keys: list[int], left: list[int]) -> list[float]:
        """For k = 0 .. k_max: the mean over the live rows (``keys``, each with ``left`` tokens it may
        still make, >= 1) of E[min(1 + accepted drafts, left)] at k drafts, the chain's rates those of
        the live rows (``rates``)."""
        reach, run = [1.0], 1.0  # reach[m]: P(the first m drafts are kept)
        for a in self.rates(pooled, keys):
            run *= a
            reach.append(run)
        # rows by the most drafts a round can keep of theirs: min(k, left - 1)
        capped = [0] * (self.k_max + 1)
        for n in left:
            capped[min(max(n - 1, 0), self.k_max)] += 1
        rows = max(len(keys), 1)
        out, total, open_rows = [1.0], 1.0, rows
        for m in range(1, self.k_max + 1):
            open_rows -= capped[m - 1]  # rows that can still keep an m-th draft
            total += reach[m] * open_rows / rows
            out.append(total)
        return out


class Lengths:
    """Completion lengths of the engine's last call, for the tokens a live row can still be expected to
    make: ``remaining(made)`` is the mean of (length - made) over the lengths past ``made``, and
    ``cap - made`` where none is (nothing known: the call's max_new_tokens bounds it).  A GRPO step's
    next call samples the same prompts' distribution under a policy one update away."""

    def __init__(self, lengths: list[int], cap: int):
        self.cap = cap
        self.sorted = sorted(min(n, cap) for n in lengths)
        self.suffix = list(itertools.accumulate(reversed(self.sorted)))[::-1]  # sum of sorted[i:]

    def remaining(self, made: float) -> float:
        i = bisect.bisect_right(self.sorted, made)
        if i == len(self.sorted):
            return max(self.cap - made, 1.0)
        return self.suffix[i] / (len(self.sorted) - i) - made


def nearest_size(grid: list[int], rows: int) -> int:
    """The measured batch size nearest to ``rows`` live rows, in log scale (grid sorted, non-empty)."""
    return min(grid, key=lambda g: abs(math.log(g / max(rows, 1))))


class SpeedCheck:
    """The workload's word on the one ratio the calibration can get wrong where it matters: speculative
    rounds against plain steps.  Each round's measured seconds over the seconds the planner predicted for
    it (the levelled model at its rows, k and width) is kept per measured batch size (``nearest_size``)
    and kind (plain step or speculative round), the last ``window`` of each; ``factor(size)`` is then

        (sum of speculative rounds' seconds / sum of their predictions)
        / (sum of plain steps' seconds / sum of their predictions)

    and the planner multiplies its predicted seconds for every k >= 1 by it.  1.0 until both kinds have
    ``least`` rounds at the size, so where the model is clear (only one kind ever chosen) nothing
    changes; it acts where the planner alternates, in the near-ties a few percent of model error decides.
    Sums, not medians: a throughput is a ratio of sums.  Each round counts at most ``cap`` times its
    prediction, so one stall of the machine (a page fault, another process) cannot swing the factor.

    A speculative round right after plain steps (``after_plain`` > 0) first absorbs the pair each of
    them left the drafter, a cost of switching that the calibration never times (it times rounds that
    follow one at their own k): such a catch-up round is left out, so the factor compares what the
    calibration modelled, steady speculative rounds against plain steps.  Counted in, the catch-up fed
    on itself: more plain steps, dearer rounds after them, a larger factor, more plain steps.  Strict
    at B = 128 on this CPU (2026-12-05): speculative rounds read 1.32-1.65x their prediction at 128 rows
    against plain steps' 1.02-1.20x, a factor of 1.23-1.45, plain chosen in 703 of 1101 rounds and
    0.925x the plain engine where the check turned off read 0.988x.  With catch-up rounds left out
    (``bench/speed_check.py --calls 20``, 2026-12-05 late) the factor there read 0.915 (1.068 against
    1.167) and the check paid: on / off 1.027 strict, 1.020 mars.  The planner makes a near tie's
    speculative round after plain steps two rounds, so that the second is a sample (``KPlanner``).

    Why both kinds and a ratio: a shared machine's pace moves every round alike, and that cancels; the
    two kinds are interleaved in time wherever the factor acts.  Why not the per-k figures: judging each
    k by the rounds it was chosen in steepened the model's line (``CostModel``); here every k >= 1 shares
    one factor, so the line's shape stays the calibration's.  Carried over calls with the acceptance
    estimates (``EngineConfig(adapt_costs=False)`` turns it off: it reads the clock, so the K sequence
    would no longer be a function of the seed)."""

    def __init__(self, window: int = 64, least: int = 8, cap: float = 3.0):
        self.window, self.least, self.cap = window, least, cap
        self.rounds: dict[tuple[int, bool], list[tuple[float, float]]] = {}
        # catch-up rounds: each one's seconds past a steady round's, per plain-step pair it absorbed
        # (``pair_seconds``), the last ``window``
        self.catchups: list[float] = []
        # per size: [near-tie rounds left before the next measuring one, the gap, the kind that won at
        # the last measuring round] (``tie_due``)
        self.ties: dict[int, list] = {}

    def tie_due(self, size: int, plain_wins: bool, every: int, most: int) -> bool:
        """Whether this near-tie round at ``size`` runs the kind ranked second, so that both kinds are
        measured.  The first is the ``every``-th near-tie round; once both kinds have ``least`` rounds
        (the factor acts), each measuring round whose winner is the last one's (the measurement confirmed
        the ranking) doubles the gap to the next, up to ``most``; any other sets it back to ``every``.
        Counted over the engine's calls (carried with the rounds).  Why not every ``every``-th for good:
        where plain wins by a hair (strict at 128 rows on this CPU) each measuring round is a pair of
        speculative rounds, a catch-up and its sample; at 64-127 rows catch-up rounds ran 1156 tok/s and
        steady ones 2226 against the plain engine's 2514 (``bench/plain_steps.py --part mix --calls 8
        --warmup 6``, 2026-12-06); at a gap of 8 that is 2 rounds in 9 while the tie lasts.
        Against the gap held at 8 (throwaway A/B at B = 128, 20 paired calls, 2026-12-06) it read 1.005
        [0.991, 1.021] strict and 0.995 [0.982, 1.007] mars: no effect this CPU resolves, the catch-ups
        of probes and of the planner's own alternation weighing more there."""
        left, gap, last = self.ties.get(size, (every, every, None))
        left -= 1
        due = left <= 0
        if due:
            measured = self.ratio(size, True) is not None and self.ratio(size, False) is not None
            gap = min(2 * gap, most) if measured and last == plain_wins else every
            left, last = gap, plain_wins
        self.ties[size] = [left, gap, last]
        return due

    def add(
        self,
        size: int,
        speculative: bool,
        seconds: float,
        predicted: float,
        after_plain: int = 0,
        pairs: int = 0,
    ) -> None:
        """One round at measured batch size ``size``; ``after_plain``: the plain steps right before it
        (a speculative round after any is a catch-up round, not counted in the ratios); ``pairs``: the
        plain steps' pairs a catch-up round absorbed first, over all its rows (its excess over a steady
        round, per pair, goes to ``pair_seconds``)."""
        if speculative and after_plain:
            if pairs > 0:
                steady = predicted * (self.ratio(size, True) or 1.0)
                self.catchups = [*self.catchups, (seconds - steady) / pairs][-self.window :]
            return
        kept = self.rounds.setdefault((size, speculative), [])
        kept.append((min(seconds, self.cap * predicted), predicted))
        del kept[: -self.window]

    def ratio(self, size: int, speculative: bool) -> float | None:
        """Measured over predicted seconds of one kind at one size, None under ``least`` rounds."""
        kept = self.rounds.get((size, speculative), [])
        if len(kept) < self.least:
            return None
        return sum(t for t, _ in kept) / max(sum(p for _, p in kept), 1e-12)

    def pair_seconds(self) -> float | None:
        """What one plain-step pair costs the catch-up round that absorbs it (seconds, >= 0): the median
        over the last ``window`` catch-up rounds of (seconds - a steady round's at its k, rows and width)
        / pairs, a steady round being the model's prediction times the size's measured ratio; None under
        ``least`` catch-ups.  A median: one stall of the machine in a catch-up would move a mean by
        seconds over a few thousand pairs."""
        if len(self.catchups) < self.least:
            return None
        return max(statistics.median(self.catchups), 0.0)

    def factor(self, size: int) -> float:
        spec, plain = self.ratio(size, True), self.ratio(size, False)
        return spec / plain if spec is not None and plain is not None else 1.0

    def carried(self) -> SpeedCheck:
        out = SpeedCheck(self.window, self.least, self.cap)
        out.rounds = {key: list(v) for key, v in self.rounds.items()}
        out.ties = {key: list(v) for key, v in self.ties.items()}
        out.catchups = list(self.catchups)
        return out

    def to_dict(self) -> dict:
        sizes = sorted({s for s, _ in self.rounds} | set(self.ties))
        return {
            str(s): {
                "factor": self.factor(s),
                "plain": self.ratio(s, False),
                "speculative": self.ratio(s, True),
                "rounds": [len(self.rounds.get((s, False), [])), len(self.rounds.get((s, True), []))],
                "tie_gap": self.ties[s][1] if s in self.ties else None,
            }
            for s in sizes
        }


class KPlanner:
    """Chooses each round's k; one per ``generate`` call.  Its estimates start from the prior, or from
    ``estimates`` carried over from the engine's earlier calls (then no exploring first round), and its
    count of speculative rounds (``speculative``, which times the exploration rounds) from 0 or from
    the engine's last call.  ``lengths``: the engine's last call's completion lengths, with which a
    switch from plain steps to drafting is priced (``_pays``); None prices nothing."""

    exhausted = False  # every planner has it; only ``CycleK`` ever ends a call early

    def __init__(
        self,
        costs: CostModel,
        k_max: int,
        probe_every: int = 8,
        estimates: AcceptanceEstimates | None = None,
        explore_every: int = 16,
        explore_within: float = 0.1,
        speculative: int = 0,
        speed: SpeedCheck | None = None,
        tie_every: int = 8,
        tie_most: int = 64,
        probe: tuple[int, int] | None = None,
        lengths: Lengths | None = None,
        row_prior: float | None = 4.0,
    ):
        self.costs = costs
        self.k_max = k_max
        self.estimates = estimates if estimates is not None else AcceptanceEstimates(k_max)
        self.first = not self.estimates.observed
        # plain rounds in a row and the wait for the next probe, from 0 and probe_every or carried over
        # from the engine's last call (``probe``): a batch size where plain keeps winning (strict at 128
        # rows on this CPU) is probed ever more rarely, not from a wait of probe_every each call; every
        # probe there absorbs the drafter's pairs of the whole run before it, at all its rows
        self.probe_every = probe_every
        self.plain_run, self.wait = probe if probe is not None else (0, probe_every)
        self._probed = False  # the last speculative round was a probe
        self.explore_every = explore_every
        self.explore_within = explore_within
        # speculative rounds chosen so far, counted on from the engine's earlier calls where carried over:
        # a call of fewer than explore_every rounds (B = 1: ~13) would otherwise never explore; only a
        # call that ran long would, always near its end
        self.speculative = speculative
        # CostModel.tables per live batch size: the model changes only between calls (``observe``)
        self._tables: dict[int, tuple[list[float], list[float]]] = {}
        self._fitted: tuple | None = None  # CostModel.fitted, once a call (at the first choice it needs)
        # measured against predicted seconds (``timed``); None: the choice never reads the clock
        self.speed = speed
        self.tie_every, self.tie_most = tie_every, tie_most  # near ties' measuring gap (SpeedCheck.tie_due)
        self._grid = sorted(costs.rounds)
        self._last: tuple[int, int, float] | None = None  # the chosen round: (size, k, predicted seconds)
        self._since_spec = 0  # plain steps since this call's last speculative round (timed ones)
        self._follow: int | None = None  # the k of a near-tie speculative round's second half
        # the switch's price (``choose``'s debt): the last call's completion lengths, for the tokens
        # the live rows still make; this round's plain-step pairs and their seconds; rounds held plain
        self.lengths = lengths
        self._debt, self._owed, self._ahead = 0, 0.0, 0.0
        self._times: list[float] = []  # this round's predicted seconds per k, the factor applied
        self.held = 0
        # the acceptance of the rows still live this call (``RowAcceptance``), where the engine names its
        # rows (``choose``'s and ``observe``'s ``keys``); None: the call's pooled estimates at every round
        self.live_rows = RowAcceptance(k_max, row_prior) if row_prior is not None else None

    def rate(self, rows: int, k: int, width: int = 0) -> float:
        """Expected tokens per second of a round with k drafts for ``rows`` live rows over a cache
        ``width`` slots wide."""
        return rows * self.estimates.expected_tokens(k) / self.costs.round_seconds(rows, k, width)

    def choose(
        self,
        rows: int,
        width: int = 0,
        debt: int = 0,
        made: float = 0.0,
        keys: list[int] | None = None,
        left: list[int] | None = None,
    ) -> int:
        """The round's k for ``rows`` live rows whose cache is ``width`` slots wide.  ``debt``: the
        plain-step pairs the drafter has not absorbed yet, over all rows (any k >= 1 absorbs them first);
        ``made``: the live rows' mean tokens so far (with ``debt``, for the tokens they still make).
        ``keys``: the live rows' names within the call (as ``observe`` got them) and ``left`` the
        tokens each may still make: the expected tokens are then those of the live rows
        (``RowAcceptance``); without them, the call's pooled estimates."""
        self._debt = debt
        if self.first:  # nothing observed yet: learn the acceptance of every position once
            self.first = False
            return self.k_max
        if keys is not None and self.live_rows is not None:
            left = left if left is not None else [self.k_max + 1] * len(keys)
            tokens = self.live_rows.expected_tokens_upto(self.estimates.rates(), keys, left)
        else:
            tokens = self.estimates.expected_tokens_upto(self.k_max)
        if rows not in self._tables:
            if self._fitted is None:
                self._fitted = self.costs.fitted(self.k_max)
            self._tables[rows] = self.costs.tables(rows, self.k_max, self._fitted)
        base, slot = self._tables[rows]
        # = self.rate(rows, k, width), the seconds as round_seconds_upto(rows, k_max, width) gives them,
        # every k >= 1 times the workload's speculative-against-plain factor where one is measured
        seconds = [max(b + s * width, 1e-9) for b, s in zip(base, slot, strict=True)]
        size = nearest_size(self._grid, rows) if self._grid else rows
        f = self.speed.factor(size) if self.speed is not None else 1.0
        self._times = [t * f if k else t for k, t in enumerate(seconds)]
        rates = [rows * n / t for n, t in zip(tokens, self._times, strict=True)]
        pair = self.speed.pair_seconds() if self.speed is not None and debt else None
        self._owed = debt * pair if pair is not None else 0.0
        if self._owed:
            ahead = self.lengths.remaining(made) if self.lengths is not None else 0.0
            self._ahead = rows * ahead
        k = self._pick(rates, size)
        self._last = (size, k, seconds[k])
        return k

    def _pays(self, k: int, rates: list[float], exploring: bool = False) -> bool:
        """Whether switching from plain steps to k >= 1 now is worth what it owes: the catch-up's
        seconds (``_owed``: the debt's pairs at the SpeedCheck's measured price; 0 where nothing is
        owed or no price is measured yet).  A switch the model ranks best pays if the time it saves on
        the tokens the live rows are still expected to make (``_ahead``, at this round's rates) covers
        it; without the last call's lengths nothing is known to be ahead, and it does.  An exploring
        switch (a probe, a near tie's measurement: the model ranks plain first) pays if the catch-up
        costs no more than the round itself; otherwise it waits, for a batch's start where nothing is
        owed.

        Why: every plain step leaves the drafter a pair a row to absorb later (the check read 31-39 us
        a pair at B = 128 strict on this CPU, about 8% of a 128-row plain step); strict at B = 128
        switched to drafting at 64-127 rows after plain runs of 31-63 steps, and its 14 catch-up rounds
        there took 2.90 s against 1.33 s at plain's pace (0.951x plain, ``bench/plain_steps.py --part
        mix --calls 8 --warmup 6``, 2026-12-06).  Side by side with the planner without it (throwaway
        A/B, B = 128, 20 paired calls, 2026-12-06) it read 0.994 [0.979, 1.010] strict and 1.007 mars:
        no effect this CPU resolves, the catch-ups it saves being few once the drafter's pairs of a long
        plain run stopped costing a copy a finishing row (``_EagleState.select``)."""
        if not self._owed:
            return True
        if exploring:
            return self._owed <= self._times[k]
        if self.lengths is None:
            return True
        saved = self._ahead * (1 / rates[0] - 1 / rates[k])
        return saved >= self._owed

    def _pick(self, rates: list[float], size: int) -> int:
        if self._follow is not None:
            k, self._follow = self._follow, None
            return k
        if self.speed is not None:  # a near tie between the kinds: measure the runner-up now and then
            spec = max(range(1, self.k_max + 1), key=lambda k: (rates[k], -k))
            low, high = sorted((rates[0], rates[spec]))
            near = low >= high * (1 - self.explore_within)
            plain_wins = rates[0] >= rates[spec]
            # measuring the speculative kind after plain steps waits while its catch-up costs too much
            measurable = not plain_wins or self._pays(spec, rates, exploring=True)
            if near and measurable and self.speed.tie_due(size, plain_wins, self.tie_every, self.tie_most):
                if not plain_wins:
                    return 0
                # after plain steps the first speculative round is a catch-up round, which the check
                # leaves out (``SpeedCheck.add``): a second one is its sample
                if self._since_spec:
                    self._follow = spec
                return spec
        best = max(range(self.k_max + 1), key=lambda k: (rates[k], -k))
        if best > 0 and not self._pays(best, rates):  # held plain: the catch-up would cost more
            self.held += 1
            self._probed = False
            return 0
        if best > 0:
            if self._probed:  # the probe turned the choice: probe soon again where plain wins next
                self.wait = self.probe_every
            self._probed = False
            self.plain_run = 0
            self.speculative += 1
            if best < self.k_max and self.speculative % self.explore_every == 0:
                # re-measure past the best k: as deep as a k within explore_within of its rate
                floor = rates[best] * (1 - self.explore_within)
                return max(k for k in range(best + 1, self.k_max + 1) if k == best + 1 or rates[k] >= floor)
            return best
        self._probed = False
        self.plain_run += 1
        probe = max(range(1, self.k_max + 1), key=lambda k: (rates[k], -k))
        # probe: re-measure acceptance at the best speculative k, once its catch-up costs no more than
        # the round (else the run goes on, and the probe waits for a cheaper moment)
        if self.plain_run >= self.wait and self._pays(probe, rates, exploring=True):
            self.plain_run = 0
            self.wait *= 2
            self._probed = True
            return probe
        return 0

    def observe(self, drafted: list[int], accepted: list[int], keys: list[int] | None = None) -> None:
        """One round's outcome per live row: drafts verified and the first ones kept; ``keys``: the
        rows' names within the call, for the live rows' estimates (``RowAcceptance``)."""
        for d, a in zip(drafted, accepted, strict=True):
            if d:
                self.estimates.update(d, a)
        if keys is not None and self.live_rows is not None:
            for key, d, a in zip(keys, drafted, accepted, strict=True):
                if d:
                    self.live_rows.update(key, d, a)

    def timed(self, seconds: float) -> None:
        """The wall seconds of the round last chosen (the engine calls this after every round)."""
        if self._last is not None:
            size, k, predicted = self._last
            if self.speed is not None:
                after, pairs = (self._since_spec, self._debt) if k else (0, 0)
                self.speed.add(size, k > 0, seconds, predicted, after_plain=after, pairs=pairs)
            self._since_spec = 0 if k else self._since_spec + 1
        self._last = None


class FixedK:
    """A planner that always drafts k (the calibration's warm-up call; tests)."""

    exhausted = False

    def __init__(self, k: int):
        self.k = k

    def choose(self, rows: int, width: int = 0, debt: int = 0, made: float = 0.0, **rows_named) -> int:
        return self.k

    def observe(self, drafted: list[int], accepted: list[int], keys: list[int] | None = None) -> None:
        pass

    def timed(self, seconds: float) -> None:
        pass


class CycleK:
    """The calibration's planner: one round at ``ks[0]`` (it absorbs the prompt's last pair, not a
    round's worth), then ``cycles`` passes over ``ks``, each k ``repeat`` rounds in a row, then
    ``exhausted`` (the engine stops the call).  Every k's rounds are spread over the whole call, a few
    tens of milliseconds apart, so a slow spell of the machine (seconds) falls on all of them alike.

    ``measured[i]``: whether the calibration times the plan's round i, the last of each block (with
    ``repeat`` 1, every round but the lead-in).  A round's drafter first absorbs the pairs the round
    before it kept, so a round after one at its own k costs what a run at that k costs, and a round
    after another k does not: passing up, k = 1 follows a plain step and absorbs what that step and K
    kept; passing down, K absorbs what k = 1 and the plain step kept.  One plan covers one batch:
    calibration calls stay within max_batch_size."""

    def __init__(self, ks: list[int], cycles: int, repeat: int = 1):
        block = [k for k in ks for _ in range(repeat)]
        self.plan = [ks[0], *(block * cycles)]
        self.measured = [False, *([i % repeat == repeat - 1 for i in range(len(block))] * cycles)]
        self.i = 0
        self.exhausted = False

    def choose(self, rows: int, width: int = 0, debt: int = 0, made: float = 0.0, **rows_named) -> int:
        k = self.plan[self.i]
        self.i += 1
        self.exhausted = self.i == len(self.plan)
        return k

    def observe(self, drafted: list[int], accepted: list[int], keys: list[int] | None = None) -> None:
        pass

    def timed(self, seconds: float) -> None:
        pass
