"""The engine under ``num_draft_tokens="auto"`` (``engine.py`` driving ``adaptive/``): exact and
deterministic with k varying, config errors, and what the engine tells the planner and carries over
calls (``adaptive.Carried``)."""

import itertools

import pytest
import torch

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.engine.adaptive import CostModel, KPlanner
from tests.engine.helpers import PROMPTS, exact_joint, hf_greedy, sample_index
from tests.stats import assert_distribution


def test_auto_strict_greedy_equals_hf_after_windowed_plain_runs(target):
    """Width-proportional costs: plain steps win after the first round, with a probe after every run of
    8 (then 16): runs longer than the window, so the drafter skips pairs before each probe; strict
    greedy still equals HF greedy token for token."""
    head = Eagle3Drafter.from_target(target)
    cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, drafter_window=4)
    costs = CostModel(rounds={1: {k: float(k + 1) for k in range(4)}})
    eng = SpeculativeEngine(target, head, cfg, cost_model=costs)
    out = eng.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True))
    assert [t.completion_ids for t in out] == hf_greedy(target, PROMPTS, 40)
    ks = eng.stats["k_per_round"]
    assert ks.count(0) > 20 and sum(1 for k in ks[1:] if k) >= 2, ks
    assert eng.stats["drafter_pairs_skipped"] > 0


# ---------------------------------------------------------------------------------- adaptive speculation
# a cost model where a round drafting k tokens costs 1.3 + 0.35 k: the best k moves with the acceptance
# estimates, so K varies between rounds
VARYING = CostModel(rounds={1: {k: 1.3 + 0.35 * k for k in range(6)}})


def test_auto_strict_greedy_equals_hf_with_k_varying(target):
    head = Eagle3Drafter.from_target(target)
    cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=5)
    eng = SpeculativeEngine(target, head, cfg, cost_model=VARYING)
    out = eng.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=24))
    assert [t.completion_ids for t in out] == hf_greedy(target, PROMPTS, 24)
    ks = eng.stats["k_per_round"]
    assert len(set(ks)) > 1 and 0 < max(ks) <= 5, ks


def test_auto_is_deterministic_for_a_seed(target):
    head = Eagle3Drafter.from_target(target)
    cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=5, rule="mars", adapt_costs=False)
    sp = SamplingParams(temperature=1.0, max_new_tokens=20, n=3, seed=5)
    eng = SpeculativeEngine(target, head, cfg, cost_model=VARYING)
    runs = []
    for e in (eng, eng, SpeculativeEngine(target, head, cfg, cost_model=eng.cost_model)):
        out = e.generate(PROMPTS, sp)
        ids, logps = [t.completion_ids for t in out], [t.behavior_logprobs for t in out]
        runs.append((ids, logps, e.stats["k_per_round"]))
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0][2])) > 1


def test_auto_strict_sampling_matches_exact_joint(small):
    """N = 60k completions of 3 tokens (seed 21) with k chosen per round (K then zero-length chains)."""
    cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, max_batch_size=60_000)
    # width-proportional cost: after the first (exploring) round plain steps win, so later rounds are k = 0
    costs = CostModel(rounds={1: {k: float(k + 1) for k in range(4)}})
    eng = SpeculativeEngine(small, Eagle3Drafter.from_target(small), cfg, cost_model=costs)
    assert_distribution(sample_index(eng), exact_joint(small), "auto")
    assert eng.stats["accepted"] > 1000
    assert set(eng.stats["k_per_round"]) == {3, 0}, set(eng.stats["k_per_round"])


def test_auto_config_errors():
    with pytest.raises(ValueError, match="max_draft_tokens is only"):
        EngineConfig(num_draft_tokens=3, max_draft_tokens=4)
    with pytest.raises(ValueError, match="max_draft_tokens must be >= 1"):
        EngineConfig(num_draft_tokens="auto", max_draft_tokens=0)
    with pytest.raises(ValueError, match='num_draft_tokens must be an int >= 1 or "auto"'):
        EngineConfig(num_draft_tokens="7")
    assert EngineConfig(num_draft_tokens="auto").max_draft_tokens == 7
    assert EngineConfig(num_draft_tokens="auto").drafter_window == 0  # every pair absorbed
    assert EngineConfig(num_draft_tokens="auto", max_draft_tokens=4, drafter_window=5).drafter_window == 5
    with pytest.raises(
        ValueError, match=r"drafter_window must be 0 \(no window\) or an int >= max_draft_tokens \+ 1 = 5"
    ):
        EngineConfig(num_draft_tokens="auto", max_draft_tokens=4, drafter_window=4)
    with pytest.raises(ValueError, match="drafter_window is only"):
        EngineConfig(num_draft_tokens=3, drafter_window=8)
    with pytest.raises(ValueError, match="speed_check must be True or False, got 'no'"):
        EngineConfig(num_draft_tokens="auto", speed_check="no")


def test_engine_carries_the_exploration_count_unless_adapt_costs_is_off(qwen):
    """Rounds cost the same at every k, so every round drafts K = 3 and counts as speculative, except
    the first call's first round (the exploring first round) and the last few, where the rows' tokens
    left cap what a chain can keep and the least k that keeps as many ties and wins (0 once every live
    row has one token left): after two calls the engine's count is every speculative round but the
    first; with adapt_costs=False nothing is carried and the count stays 0.  The
    SpeedCheck is off: a random head's drafts are rarely accepted, so a plain step and K = 3 tie within
    10% and every 8th tie would run plain (which random head, and so whether it ties, depended on the
    tests run before this one in the process)."""
    torch.manual_seed(0)
    head = Eagle3Drafter.from_target(qwen)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, ignore_eos=True, seed=3)
    for adapt in (True, False):
        costs = CostModel(rounds={1: dict.fromkeys(range(4), 1.0), 4: dict.fromkeys(range(4), 1.0)})
        cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, adapt_costs=adapt, speed_check=False)
        eng = SpeculativeEngine(qwen, head, cfg, cost_model=costs)
        rounds = []
        for _ in range(2):
            eng.generate([[1, 2, 3]], sp)
            rounds.append(eng.stats["k_per_round"])
        assert all(k == 3 for ks in rounds for k in ks[:-3])  # a row keeps >= 1 token a round: 3 rounds
        speculative = [sum(k > 0 for k in ks) for ks in rounds]
        assert eng._carry.speculative == (speculative[0] - 1 + speculative[1] if adapt else 0)


def test_auto_carries_acceptance_across_calls_unless_adapt_costs_is_off(qwen):
    """A random head is almost never accepted and rounds cost 1 + k: the first call explores k = K once,
    learns that plain steps win, and the next call starts from what it learnt (plain from its first
    round); with adapt_costs=False every call starts from the prior and explores again."""
    head = Eagle3Drafter.from_target(qwen)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, ignore_eos=True, seed=3)
    firsts = {}
    for adapt in (True, False):
        costs = CostModel(rounds={1: {k: 1.0 + k for k in range(4)}, 4: {k: 1.0 + k for k in range(4)}})
        cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, adapt_costs=adapt)
        eng = SpeculativeEngine(qwen, head, cfg, cost_model=costs)
        firsts[adapt] = []
        for _ in range(2):
            eng.generate([[1, 2, 3]], sp)
            firsts[adapt].append(eng.stats["k_per_round"][0])
    assert firsts[True] == [3, 0], firsts
    assert firsts[False] == [3, 3], firsts


def test_engine_tells_the_planner_what_a_switch_owes(qwen):
    """Each round the engine passes the plain steps' pairs the drafter has not absorbed, over the
    live rows (a ``drafter_window`` bounds each row's), and the rows' mean tokens so far; a speculative
    round absorbs them.  After an auto call it keeps the completion lengths for the next call's planner
    and reports the price and the held rounds (``stats["switch_debt"]``)."""
    from marsrl.engine.adaptive import Lengths

    class Scripted:
        exhausted = False

        def __init__(self, plan):
            self.plan, self.seen = list(plan), []

        def choose(self, rows, width=0, debt=0, made=0.0, keys=None, left=None):
            self.seen.append((rows, debt, made))
            k = self.plan.pop(0)
            self.exhausted = not self.plan
            return k

        def observe(self, drafted, accepted, keys=None):
            pass

        def timed(self, seconds):
            pass

    head = Eagle3Drafter.from_target(qwen)
    sp = SamplingParams(temperature=1.0, max_new_tokens=40, n=2, ignore_eos=True, seed=1)
    for window, want in ((0, [0, 0, 2, 4, 6, 8, 0, 2]), (3, [0, 0, 2, 4, 6, 6, 0, 2])):
        cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=2, drafter_window=window)
        eng = SpeculativeEngine(qwen, head, cfg, cost_model=CostModel(rounds={1: {0: 1.0, 1: 1.5, 2: 2.0}}))
        plan = Scripted([2, 0, 0, 0, 0, 2, 0, 2])
        eng._generate([[3, 4, 5]], sp, plan)
        assert [d for _, d, _ in plan.seen] == want, plan.seen
        kept = eng.stats["tokens_per_round"]
        made = [1 + sum(kept[:i]) / 2 for i in range(len(kept))]  # both rows live: the prefill's token on
        assert [m for _, d, m in plan.seen if d] == [made[i] for i, d in enumerate(want) if d]
    out = eng.generate([[3, 4, 5], [6, 7]], sp)
    assert eng._carry.lengths == [len(t.completion_ids) for t in out] == [40] * 4
    assert set(eng.stats["switch_debt"]) == {"pair_seconds", "held"}
    assert Lengths(eng._carry.lengths, 40).remaining(10) == 30


def test_engine_carries_its_speed_check_unless_turned_off(qwen):
    """With the defaults an auto call times every round against the model but the exploring first one
    and the catch-up rounds (a speculative round right after a plain step, whose excess goes to the plain
    steps), and carries the SpeedCheck to the next call (its rounds add up over calls);
    speed_check=False or adapt_costs=False leave it out: no stats entry, nothing carried."""
    head = Eagle3Drafter.from_target(qwen)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, n=2, ignore_eos=True, seed=3)
    for opts in ({}, {"speed_check": False}, {"adapt_costs": False}):
        costs = CostModel(rounds={1: {k: 1.0 + k for k in range(4)}, 4: {k: 1.0 + k for k in range(4)}})
        cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, **opts)
        eng = SpeculativeEngine(qwen, head, cfg, cost_model=costs)
        counted, rounds = [], []
        for _ in range(2):
            eng.generate([[1, 2, 3]], sp)
            ks = eng.stats["k_per_round"]
            catch_up = sum(1 for a, b in itertools.pairwise(ks) if a == 0 and b > 0)
            rounds.append(len(ks) - catch_up)
            if not opts:
                kept = eng.stats["speed_check"]["1"]["rounds"]  # rows 2: nearest measured size is 1
                counted.append(sum(kept))
            else:
                assert "speed_check" not in eng.stats and eng._carry.speed is None
        if not opts:  # the first call's first round explores (no prediction); the second's is planned
            assert counted == [rounds[0] - 1, rounds[0] - 1 + rounds[1]], (counted, rounds)


def test_engine_names_its_live_rows_to_the_planner(qwen):
    """Each auto round the engine passes the live rows' names (their places in the call: distinct, a
    row keeps its name as others finish and rows move) and the tokens each may still make, and the
    round's outcome under the same names: a row's tokens left fall by exactly what it kept."""
    head = Eagle3Drafter.from_target(qwen)
    torch.manual_seed(0)
    events = []

    class Recording(KPlanner):
        def choose(self, rows, width=0, debt=0, made=0.0, keys=None, left=None):
            k = super().choose(rows, width, debt, made, keys=keys, left=left)
            events.append(("choose", rows, keys and list(keys), left and list(left), k))
            return k

        def observe(self, drafted, accepted, keys=None):
            events.append(("observe", list(keys), list(accepted)))
            super().observe(drafted, accepted, keys=keys)

    costs = CostModel(
        rounds={1: {k: 1.0 + 0.2 * k for k in range(4)}, 8: {k: 1.0 + 0.2 * k for k in range(4)}}
    )
    eng = SpeculativeEngine(
        qwen, head, EngineConfig(num_draft_tokens="auto", max_draft_tokens=3), cost_model=costs
    )
    sp = SamplingParams(temperature=1.0, max_new_tokens=24, n=3, seed=5, eos_token_id=7)
    eng._generate([[3, 4, 5], [6, 7, 8]], sp, Recording(costs, 3))
    assert events[0][0] == "choose" and events[0][2] is None and events[0][4] == 3  # the prefill's
    made = dict.fromkeys(range(6), 1)  # the prefill's token
    live = list(range(6))
    checked = 0
    for event in events[1:]:
        if event[0] == "observe":
            _, keys, accepted = event
            assert keys == live
            for key, a in zip(keys, accepted, strict=True):
                made[key] += a + 1
        else:
            _, rows, keys, left, k = event
            assert len(keys) == rows == len(set(keys)) and set(keys) <= set(live)
            assert left == [24 - made[key] for key in keys]
            checked += rows
            live = keys
            if k == 0:  # a plain step: one token a row, nothing to observe
                for key in keys:
                    made[key] += 1
    assert checked and len(live) < 6  # rows finished, the rest kept their names
