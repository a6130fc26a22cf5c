"""The planners that choose each round's k (0: a plain step), and the state the adaptive planner carries
from one ``generate`` call to the next.

Every planner answers the engine's three calls of a round: ``choose`` (the round's k, from the live
rows, the cache width, what a switch to drafting owes and what each row may still make), ``observe``
(the drafts each row verified and kept) and ``timed`` (the round's wall seconds); ``exhausted`` ends a
call early.  ``FixedK`` always drafts one k, ``CycleK`` is the calibration's plan, and ``KPlanner``
picks the k of the most expected tokens per second (acceptance.py over costs.py, corrected by
speed.py); ``Carried`` holds what a ``KPlanner`` hands the engine's next one.  See docs/engine.md.
"""

from __future__ import annotations

import bisect
import itertools

from .acceptance import AcceptanceEstimates, RowAcceptance
from .costs import CostModel, nearest_size
from .speed import SpeedCheck


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
        # from the engine's last call (``probe``): a batch size where plain keeps winning is probed ever
        # more rarely, not from a wait of probe_every each call; every probe there absorbs the
        # drafter's pairs of the whole run before it, at all its rows
        self.probe_every = probe_every
        self.plain_run, self.wait = probe if probe is not None else (0, probe_every)
        self._probed = False  # the last speculative round was a probe
        self.explore_every = explore_every
        self.explore_within = explore_within
        # speculative rounds chosen so far, counted on from the engine's earlier calls where carried over:
        # a call of fewer than explore_every rounds (short completions) would otherwise never explore;
        # only a call that ran long would, always near its end
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

        Why: every plain step leaves the drafter a pair a row to absorb later, so after a long plain
        run at many rows the first speculative round costs several plain steps' time
        (``bench/plain_steps.py --part mix`` measures it; see docs/benchmarks.md)."""
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
    """A planner that always drafts k: the engine's with a fixed ``num_draft_tokens`` (k = 0 without a
    drafter), and the calibration's warm-up call (k = 0)."""

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


class Carried:
    """What ``KPlanner`` carries from one ``generate`` call of an engine to the next (with
    ``EngineConfig(adapt_costs=True)``): the acceptance estimates (scaled down, ``carried``), the count
    of speculative rounds that times exploration, the probe's plain run and wait, the ``SpeedCheck`` and
    the call's completion lengths (the next call's horizon for a switch's price).  Nothing is carried
    before the first call, or with ``adapt_costs=False``: every call's planner then starts fresh."""

    def __init__(self):
        self.acceptance: AcceptanceEstimates | None = None
        self.speculative = 0
        self.probe: tuple[int, int] | None = None
        self.speed: SpeedCheck | None = None
        self.lengths: list[int] = []

    def planner(
        self,
        costs: CostModel,
        k_max: int,
        max_new_tokens: int,
        adapt: bool,
        speed_check: bool,
        row_prior: float | None,
        factory=None,
    ) -> KPlanner:
        """A call's planner (``factory``, default ``KPlanner``), started from what is carried where
        ``adapt``; ``speed_check`` (with ``adapt``) gives it a ``SpeedCheck``, else its choice never
        reads the clock."""
        carry = self.acceptance is not None and adapt
        speed = None
        if adapt and speed_check:
            speed = self.speed.carried() if self.speed is not None else SpeedCheck()
        return (factory or KPlanner)(
            costs,
            k_max,
            estimates=self.acceptance.carried() if carry else None,
            speculative=self.speculative if carry else 0,
            speed=speed,
            probe=self.probe if carry else None,
            lengths=Lengths(self.lengths, max_new_tokens) if carry and self.lengths else None,
            row_prior=row_prior,
        )

    def keep(self, planner: KPlanner, lengths: list[int]) -> dict:
        """Take over ``planner``'s state at the end of a call whose completions had ``lengths``;
        returns the speed check's entries for the engine's stats (none without one)."""
        self.acceptance, self.speculative = planner.estimates, planner.speculative
        self.probe = (planner.plain_run, planner.wait)
        self.speed = planner.speed
        self.lengths = lengths
        if planner.speed is None:
            return {}
        # what a plain step's pair costs a catch-up round (None: not measured yet), and the rounds held
        # plain because switching to drafting would have cost more than it saves
        return {
            "speed_check": planner.speed.to_dict(),
            "switch_debt": {"pair_seconds": planner.speed.pair_seconds(), "held": planner.held},
        }
