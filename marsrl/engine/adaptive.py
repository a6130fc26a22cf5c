"""Adaptive speculation (``EngineConfig(num_draft_tokens="auto", max_draft_tokens=K)``): each round the
engine drafts the k in {0, ..., K} that maximises expected tokens per second for the live batch,

    k* = argmax_k  rows * E[tokens | k] / (t_target(rows, k + 1) + k * t_draft(rows))

    E[tokens | k] = 1 + sum_{j=1..k} prod_{i<=j} a_i        (a_i: P(draft i accepted | drafts < i were))

k = 0 is a plain step (one target forward, no drafter).  The two time functions come from a
``CostModel`` measured on the engine's own models (``SpeculativeEngine.calibrate``: timed target forwards
over a grid of live batch sizes and widths, and timed draft steps), once per engine, then fixed; the a_i
are running estimates from the rounds of the current ``generate`` call (``AcceptanceEstimates``).  The
choice is therefore a pure function of the cost model, the call's own outcomes and its seed: the same
engine reproduces the same K sequence.  Exactness does not depend on k: every round is verified by the
same rule, and a chain of any length (0 included) is lossless under strict.

Exploration: a run of plain steps learns nothing about acceptance, so after ``probe_every`` plain rounds
in a row the engine drafts once at the best k >= 1; each probe that still loses to plain doubles the wait.

Left out: per-row k (the target forward's width is the batch's largest k anyway), trees.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past the ends (xs sorted, len >= 1)."""
    if len(xs) == 1:
        return ys[0] * (x / xs[0] if xs[0] else 1.0)
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass
class CostModel:
    """Measured seconds of one target forward for ``rows`` live rows and a block of ``width`` tokens
    (``target[rows][width]``), and of one draft forward for ``rows`` rows (``draft[rows]``)."""

    target: dict[int, dict[int, float]] = field(default_factory=dict)
    draft: dict[int, float] = field(default_factory=dict)

    def target_seconds(self, rows: int, width: int) -> float:
        grid = sorted(self.target)
        per_rows = []
        for r in grid:
            ws = sorted(self.target[r])
            per_rows.append(_interp(ws, [self.target[r][w] for w in ws], width))
        return max(_interp(grid, per_rows, rows), 1e-9)

    def draft_seconds(self, rows: int) -> float:
        if not self.draft:
            return 0.0
        grid = sorted(self.draft)
        return max(_interp(grid, [self.draft[r] for r in grid], rows), 0.0)

    def to_dict(self) -> dict:
        return {
            "target": {str(r): {str(w): t for w, t in ws.items()} for r, ws in self.target.items()},
            "draft": {str(r): t for r, t in self.draft.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        return cls(
            target={int(r): {int(w): float(t) for w, t in ws.items()} for r, ws in d["target"].items()},
            draft={int(r): float(t) for r, t in d.get("draft", {}).items()},
        )


class AcceptanceEstimates:
    """Per-position conditional acceptance a_1..a_K with a Beta(prior_accept, prior_reject) prior."""

    def __init__(self, k_max: int, prior_accept: float = 1.0, prior_reject: float = 1.0):
        self.accepted = [prior_accept] * k_max
        self.reached = [prior_accept + prior_reject] * k_max

    def update(self, drafted: int, accepted: int) -> None:
        """One row's round: ``drafted`` drafts verified, the first ``accepted`` of them kept."""
        for j in range(min(accepted + 1, drafted)):  # positions 1..accepted+1 were reached
            self.reached[j] += 1
            if j < accepted:
                self.accepted[j] += 1

    def expected_tokens(self, k: int) -> float:
        total, run = 1.0, 1.0
        for j in range(k):
            run *= self.accepted[j] / self.reached[j]
            total += run
        return total


class KPlanner:
    """Chooses each round's k; one per ``generate`` call (its estimates start from the prior)."""

    def __init__(self, costs: CostModel, k_max: int, probe_every: int = 8):
        self.costs = costs
        self.k_max = k_max
        self.estimates = AcceptanceEstimates(k_max)
        self.first = True
        self.plain_run = 0
        self.wait = probe_every

    def rate(self, rows: int, k: int) -> float:
        """Expected tokens per second of a round with k drafts for ``rows`` live rows."""
        t = self.costs.target_seconds(rows, k + 1) + k * self.costs.draft_seconds(rows)
        return rows * self.estimates.expected_tokens(k) / t

    def choose(self, rows: int) -> int:
        if self.first:  # nothing observed yet: learn the acceptance of every position once
            self.first = False
            return self.k_max
        rates = [self.rate(rows, k) for k in range(self.k_max + 1)]
        best = max(range(self.k_max + 1), key=lambda k: (rates[k], -k))
        if best > 0:
            self.plain_run = 0
            return best
        self.plain_run += 1
        if self.plain_run >= self.wait:  # probe: re-measure acceptance at the best speculative k
            self.plain_run = 0
            self.wait *= 2
            return max(range(1, self.k_max + 1), key=lambda k: (rates[k], -k))
        return 0

    def observe(self, drafted: list[int], accepted: list[int]) -> None:
        for d, a in zip(drafted, accepted, strict=True):
            if d:
                self.estimates.update(d, a)
