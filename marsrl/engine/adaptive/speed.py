"""The workload's check on the cost model (``SpeedCheck``): measured against predicted round seconds,
per batch size and kind (plain step or speculative round), which corrects the one ratio the calibration
can get wrong where it decides, and prices the pairs a switch from plain steps to drafting owes the
drafter.  See docs/engine.md.
"""

from __future__ import annotations

import statistics


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
    on itself: more plain steps, dearer rounds after them, a larger factor, more plain steps
    (``bench/speed_check.py`` measures the check on and off; see docs/benchmarks.md).  The planner makes
    a near tie's speculative round after plain steps two rounds, so that the second is a sample
    (``KPlanner``).

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
        where plain wins by a hair each measuring round is a pair of speculative rounds, a catch-up
        (much slower than a plain step) and its sample; at a gap of 8 that is 2 rounds in 9 for as long
        as the tie lasts."""
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
