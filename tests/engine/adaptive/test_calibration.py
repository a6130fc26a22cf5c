"""Measuring a cost model on an engine (``adaptive/calibration.py``), on simulated clocks."""

import itertools

import pytest

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.engine.adaptive import CostModel


def test_calibrate_measures_every_batch_and_width(qwen):
    eng = SpeculativeEngine(
        qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens="auto", max_draft_tokens=2)
    )
    costs = eng.calibrate(rows=[1, 4], context=8, repeats=1)
    assert sorted(costs.rounds) == [1, 4] and all(sorted(v) == [0, 1, 2] for v in costs.rounds.values())
    assert all(t > 0 for v in costs.rounds.values() for t in v.values())
    again = CostModel.from_dict(costs.to_dict())
    assert again.round_seconds(2, 2) == costs.round_seconds(2, 2)
    # a longer chain never costs less in the model, whatever the noise of the measurement, nor does a
    # longer context; per-slot figures for plain and for k >= 1, measured over at least ``span`` tokens a row
    for w in (0, 100):
        assert all(
            costs.round_seconds(r, k, w) <= costs.round_seconds(r, k + 1, w) for r in (1, 4) for k in (0, 1)
        )
    assert sorted(costs.per_slot) == [1, 4] and all(sorted(v) == [0, 1, 2] for v in costs.per_slot.values())
    assert all(c >= 0 for v in costs.per_slot.values() for c in v.values())
    # one figure a k, read as a line in k >= 1 that never falls
    assert all(costs.slot_seconds(r, 1) <= costs.slot_seconds(r, 2) for r in (1, 4))


def test_a_calibration_run_cycles_every_k_and_stops_when_the_plan_is_done(qwen):
    from marsrl.engine.adaptive import CycleK

    eng = SpeculativeEngine(
        qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens="auto", max_draft_tokens=2)
    )
    sp = SamplingParams(max_new_tokens=40, n=2, ignore_eos=True)
    plan = CycleK([2, 1, 0], cycles=2)
    widths = []
    choose = plan.choose
    plan.choose = lambda rows, width=0, *rest, **kw: widths.append(width) or choose(rows, width, *rest, **kw)
    out = eng._generate([[3, 4, 5]], sp, plan)
    # a lead-in round, then two passes; the call ends there, before any row reaches max_new_tokens
    assert eng.stats["k_per_round"] == [2, 2, 1, 0, 2, 1, 0]
    assert all(len(t.completion_ids) < 40 for t in out)
    assert [live for _, live, *_ in eng.stats["trace"]] == [2] * 7
    # each round is planned and traced at its cache width: the 3 prompt slots, then growing every round
    traced = [width for *_, width in eng.stats["trace"]]
    assert widths == traced and traced[0] == 3 and all(b > a for a, b in itertools.pairwise(traced))
    # the tokens each round kept, over its rows: a plain step one a row, every token past the prefill's
    kept = eng.stats["tokens_per_round"]
    assert len(kept) == 7 and kept[3] == kept[6] == 2 and all(n >= 2 for n in kept)
    assert sum(kept) == sum(len(t.completion_ids) for t in out) - 2


def test_a_calibration_plan_repeats_each_k_and_times_only_the_last_of_each_block():
    from marsrl.engine.adaptive import CycleK

    plan = CycleK([0, 1, 2], cycles=2, repeat=2)
    assert plan.plan == [0, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]
    assert plan.measured == [False] + [False, True] * 6
    assert CycleK([2, 1, 0], cycles=2).measured == [False] + [True] * 6  # repeat 1: all but the lead-in
    ks = [plan.choose(4) for _ in plan.plan]
    assert ks == plan.plan and plan.exhausted


def test_calibrate_times_only_rounds_that_follow_their_own_k(qwen):
    """A round's drafter absorbs what the round before it kept, so only a round after one at its own k
    costs what a run at that k costs.  On a simulated clock where every other round takes 100 s, the
    model must come out of the steady rounds alone (1 + k/10 s each, whatever the width)."""
    from marsrl.engine.adaptive import CycleK

    eng = SpeculativeEngine(
        qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens="auto", max_draft_tokens=3)
    )
    plans = []

    def fake_generate(prompts, sampling, planner):
        if not isinstance(planner, CycleK):  # the warm-up call
            eng._totals = {"trace": []}
            return []
        plans.append(planner)
        trace, last = [], None
        while not planner.exhausted:
            k = planner.choose(len(prompts) * sampling.n)
            width = 10 + 3 * len(trace)
            trace.append([0.0, len(prompts) * sampling.n, k, 1.0 + k / 10 if k == last else 100.0, width])
            last = k
        eng._totals = {"trace": trace}
        return []

    eng._generate = fake_generate
    costs = eng.calibrate(rows=[4], context=8, repeats=2)
    # every k twice in a row, at least 3 passes (64 tokens a row here: 4), the second of each pair timed
    assert len(plans) == 2 and all(p.measured.count(True) == (len(p.plan) - 1) // 2 >= 3 * 4 for p in plans)
    assert costs.per_slot[4] == {k: 0.0 for k in range(4)}
    assert costs.round_seconds_upto(4, 3) == pytest.approx([1.0, 1.1, 1.2, 1.3])


def test_calibrate_prices_a_slot_of_context_per_k(qwen):
    """A round drafting k reads the cache from k + 1 target queries and k draft steps, so a slot of
    width costs a longer chain more.  On a simulated clock where a steady round takes
    1 + k/10 s + (1 + k/2) ms a slot (the plain step 0.5 ms a slot), the model must price each k's slot
    as that line, and the round at an empty cache as 1 + k/10 s; one figure pooled over every k >= 1
    (the model before) would give every k the same slot."""
    from marsrl.engine.adaptive import CycleK

    eng = SpeculativeEngine(
        qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens="auto", max_draft_tokens=3)
    )

    def slot(k: int) -> float:
        return 5e-4 if k == 0 else 1e-3 * (1 + k / 2)

    def fake_generate(prompts, sampling, planner):
        trace, last = [], None
        while isinstance(planner, CycleK) and not planner.exhausted:
            k = planner.choose(len(prompts) * sampling.n)
            width = 10 + 3 * len(trace)
            steady = 1.0 + k / 10 + slot(k) * width
            trace.append([0.0, len(prompts) * sampling.n, k, steady if k == last else 100.0, width])
            last = k
        eng._totals = {"trace": trace}
        return []

    eng._generate = fake_generate
    costs = eng.calibrate(rows=[4], context=8, repeats=2)
    assert costs.slot_seconds_upto(4, 3) == pytest.approx([slot(k) for k in range(4)])
    assert costs.round_seconds_upto(4, 3) == pytest.approx([1.0, 1.1, 1.2, 1.3])
    assert costs.round_seconds(4, 3, 200) - costs.round_seconds(4, 1, 200) == pytest.approx(0.2 + 200 * 1e-3)
    with pytest.raises(ValueError, match="repeat and cycles must be >= 1, got repeat=0"):
        eng.calibrate(rows=[4], repeat=0)
