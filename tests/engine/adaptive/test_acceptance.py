"""Acceptance of the rows still live (``adaptive/acceptance.py``) against a reference."""

import math

import pytest

from marsrl.engine.adaptive import CostModel, KPlanner


def _live_tokens_reference(history, pooled, prior, keys, left, k_max):
    """``RowAcceptance.expected_tokens_upto`` by definition: the live rows' counts summed position by
    position and shrunk toward ``pooled``, the chain of those rates, and for each row the sum of
    P(first m drafts kept) over m = 0 .. min(k, left - 1), averaged over the rows."""
    acc, reached = [0.0] * k_max, [0.0] * k_max
    for key in keys:
        for drafted, accepted in history.get(key, []):
            for j in range(min(accepted + 1, drafted)):
                reached[j] += 1
                acc[j] += j < accepted
    rates = [(acc[j] + prior * pooled[j]) / (reached[j] + prior) for j in range(k_max)]
    out = []
    for k in range(k_max + 1):
        per_row = []
        for cap in left:
            tokens = 0.0
            for m in range(min(k, cap - 1) + 1):
                tokens += math.prod(rates[:m])
            per_row.append(tokens)
        out.append(sum(per_row) / len(per_row))
    return out


def test_live_rows_acceptance_equals_its_reference_and_follows_the_live_rows():
    """The planner's expected tokens from the live rows (``RowAcceptance``): 300 random histories,
    live subsets and caps (seed 0) equal the by-definition reference within 1e-12; rows that accept
    everything and rows that accept nothing, each group live alone, give K + 1 and 1 tokens (shrunk a
    little toward the pooled rates) where the call's pooled estimates give one figure for both, and the
    planner on a flat cost model drafts K for the first group and the least k for the second; a row
    with one token left keeps one whatever k."""
    import random

    from marsrl.engine.adaptive import AcceptanceEstimates, RowAcceptance

    rng = random.Random(0)
    for _ in range(300):
        k_max = rng.randint(1, 8)
        prior = rng.choice([1.0, 4.0, 16.0])
        rows = RowAcceptance(k_max, prior)
        history: dict[int, list] = {}
        for key in range(rng.randint(1, 12)):
            for _ in range(rng.randint(0, 10)):
                d = rng.randint(1, k_max)
                a = rng.randint(0, d)
                rows.update(key, d, a)
                history.setdefault(key, []).append((d, a))
        pooled = [rng.uniform(0.05, 0.95) for _ in range(k_max)]
        keys = rng.sample(range(14), rng.randint(1, 6))  # some never observed
        left = [rng.randint(1, k_max + 2) for _ in keys]
        got = rows.expected_tokens_upto(pooled, keys, left)
        want = _live_tokens_reference(history, pooled, prior, keys, left, k_max)
        assert got == pytest.approx(want, rel=0, abs=1e-12)

    k_max = 4  # a round costs 1 + k / 2: a draft pays where it is likely kept
    figures = {k: 1.0 + 0.5 * k for k in range(k_max + 1)}
    costs = CostModel(rounds={1: dict(figures), 64: dict(figures)})
    planner = KPlanner(
        costs, k_max, probe_every=10**9, explore_every=10**9, estimates=AcceptanceEstimates(k_max)
    )
    planner.first = False
    good, bad = list(range(8)), list(range(8, 16))
    for _ in range(10):  # every row drafts K each round: the good ones keep all, the bad ones none
        planner.observe([k_max] * 16, [k_max] * 8 + [0] * 8, keys=good + bad)
    pooled = planner.live_rows.expected_tokens_upto(planner.estimates.rates(), good + bad, [100] * 16)
    high = planner.live_rows.expected_tokens_upto(planner.estimates.rates(), good, [100] * 8)
    low = planner.live_rows.expected_tokens_upto(planner.estimates.rates(), bad, [100] * 8)
    assert high[k_max] > k_max + 0.9 and low[k_max] < 1.1
    assert low[1] < pooled[1] < high[1]
    assert planner.choose(8, keys=good, left=[100] * 8) == k_max
    assert planner.choose(8, keys=bad, left=[100] * 8) == 0
    assert planner.choose(16) == planner.choose(16, keys=good + bad, left=[100] * 16)  # every row live
    one_left = planner.live_rows.expected_tokens_upto(planner.estimates.rates(), good, [1] * 8)
    assert one_left == [1.0] * (k_max + 1)
