"""Acceptance estimates for adaptive speculation: per draft position, the chance that a draft is kept
given that the drafts before it were, over the call's rounds (``AcceptanceEstimates``) and over the rows
still live (``RowAcceptance``), and from them the expected tokens a round keeps at each k:

    E[tokens | k] = 1 + sum_{j=1..k} prod_{i<=j} a_i

The planner (``planner.py``) divides these by the cost model's seconds; see docs/engine.md.
"""

from __future__ import annotations


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
    live late in a call are not a sample of the call's rows: they are its long ones.  On the call's
    pooled estimates the planner over-expects what long chains keep once few rows are left;
    ``bench/live_rows.py`` sets the two side by side (``kept_over_expected``; see docs/benchmarks.md).

    Why the live rows' counts pooled, not each row's own chain averaged: a row's few rounds make its
    per-position rates noisy and correlated (one lucky round raises every position it reached), and a
    mean of products of such estimates runs high, so the planner drafts too long.  Pooled over the live
    rows, the rates are those of the live population and the product is that population's chain.  At a
    call's start (nothing counted yet) they are the call's own rates; later, every row still live, they
    weigh the call's own rounds above those carried from the engine's earlier calls (which count only
    through the ``prior``)."""

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
