"""The engine with an EAGLE-3 head (random weights: its drafts are often wrong, which exercises every
rejection path): greedy equality with HF generate, exact sampling for chains and trees."""

import pytest
import torch

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, OracleDrafter, SamplingParams, SpeculativeEngine, TreeConfig
from marsrl.engine.adaptive import CostModel
from marsrl.testing import tiny_causal_lm
from tests.engine.helpers import NEW, PROMPT, PROMPTS, exact_joint, hf_greedy, sample_index
from tests.stats import assert_distribution

CONFIGS = {
    "chain_k1": EngineConfig(num_draft_tokens=1),
    "chain_k5": EngineConfig(num_draft_tokens=5),
    "tree_3x3": EngineConfig(tree=TreeConfig(top_k=3, depth=3, total_tokens=10)),
    "tree_4x5": EngineConfig(tree=TreeConfig(top_k=4, depth=5, total_tokens=25)),
    # rows stop drafting once the head's confidence in their chain drops below 0.3: ragged chains
    "chain_k5_confidence": EngineConfig(num_draft_tokens=5, draft_confidence=0.3),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_strict_greedy_equals_hf_generate(target, name):
    head = Eagle3Drafter.from_target(target)
    eng = SpeculativeEngine(target, head, CONFIGS[name])
    out = eng.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=24))
    assert [t.completion_ids for t in out] == hf_greedy(target, PROMPTS, 24)
    assert eng.stats["draft_forwards"] > 0


@pytest.mark.parametrize(
    "name",
    # greedy-draft chains of a fixed K (then zero-length ones) are in test_engine_auto.py
    # tree_3x3: paths of up to 4 drafts cover the whole 3-token completion, 3 siblings a node (the 4x5
    # tree costs 2.5x the time for nothing this test can see)
    ["tree_3x3", "chain_k3_sampled_drafts", "chain_k5_confidence", "chain_k4_sampled_conf"],
)
def test_strict_sampling_matches_exact_joint(small, name):
    """N = 60k completions of 3 tokens (seed 21) against the enumerated joint over V**3 = 512 sequences."""
    extra = {
        "chain_k3_sampled_drafts": EngineConfig(num_draft_tokens=3, draft_sampling="sample"),
        "chain_k4_sampled_conf": EngineConfig(
            num_draft_tokens=4, draft_sampling="sample", draft_confidence=0.2
        ),
    }
    cfg = CONFIGS.get(name) or extra[name]
    cfg = EngineConfig(**{**cfg.__dict__, "max_batch_size": 60_000})
    torch.manual_seed(0)  # the random head: the same one whatever ran before in this process
    head = Eagle3Drafter.from_target(small)
    eng = SpeculativeEngine(small, head, cfg)
    assert_distribution(sample_index(eng), exact_joint(small), name)
    assert eng.stats["accepted"] > 1000, "the head never got a draft accepted: rejection-only test"
    if cfg.draft_confidence > 0:  # chains really were cut short, yet the completions are exact
        per_round = eng.stats["drafted"] / eng.stats["rounds"]
        assert 1 < per_round < cfg.num_draft_tokens - 0.5, per_round


AUTO = EngineConfig(num_draft_tokens="auto", max_draft_tokens=5, adapt_costs=False)
FLAT = CostModel(rounds={1: dict.fromkeys(range(6), 1.0)})  # every k costs a plain step: the planner drafts


@pytest.mark.parametrize("name", [*CONFIGS, "auto", "plain", "oracle"])
def test_greedy_ends_at_max_seq_len_exactly(target, name):
    """Prompts of 5, 3, 7 and 1 tokens under max_seq_len = 16 (max_new_tokens 24): every row runs into the
    context's end mid-chain, at its own round, and must stop there exactly with HF's greedy tokens, as
    plain decoding does (a K = 5 chain used to stop up to 6 tokens short, a 4x5 tree 7; a tree that no
    longer fits every row takes plain steps)."""
    cfg = AUTO if name == "auto" else CONFIGS.get(name, CONFIGS["chain_k5"])
    head = None if name == "plain" else Eagle3Drafter.from_target(target)
    if name == "oracle":  # a propose() drafter whose drafts are all kept: only the context's end cuts them
        head = OracleDrafter.from_target(target, PROMPTS, 15)
    cfg = EngineConfig(**{**(cfg if head is not None else EngineConfig()).__dict__, "max_seq_len": 16})
    eng = SpeculativeEngine(target, head, cfg, cost_model=FLAT if name == "auto" else None)
    out = eng.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=24))
    want = [ids[: 16 - len(p)] for p, ids in zip(PROMPTS, hf_greedy(target, PROMPTS, 15), strict=True)]
    assert [t.completion_ids for t in out] == want
    assert all(t.finish_reason == "length" and len(t.behavior_logprobs) == len(t.completion_ids) for t in out)
    if head is not None:
        assert eng.stats["drafted"] > 0
        if cfg.tree is None:  # chains were cut to the room left: rounds of fewer drafts than K
            assert min(eng.stats["k_per_round"]) < 5 or name == "chain_k1"


def test_no_position_past_the_context_reaches_the_target():
    """A dynamic-RoPE target rescales every position of a forward that holds one past its
    max_position_embeddings (16 here; 4e-4 on a logit of this model): the lockstep columns of a row cut
    at the context's end must not carry one.  Each token's recorded target log-prob equals the
    teacher-forced one of the whole sequence, whose positions all lie within the context."""
    target = tiny_causal_lm("llama", max_positions=16, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    eng = SpeculativeEngine(target, Eagle3Drafter.from_target(target), CONFIGS["chain_k5"])
    assert eng.max_seq_len == 16
    out = eng.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=24, seed=2))
    worst = 0.0
    for p, t in zip(PROMPTS, out, strict=True):
        assert len(p) + len(t.completion_ids) == 16
        seq = torch.tensor([p + t.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(target(seq).logits[0, len(p) - 1 : -1].double(), -1)
        want = logp.gather(1, seq[0, len(p) :, None])[:, 0]
        worst = max(worst, (want - torch.tensor(t.target_logprobs, dtype=torch.float64)).abs().max().item())
    assert worst < 2e-5, worst


@pytest.mark.parametrize("name", ["chain_k5", "auto"])
def test_strict_sampling_is_exact_at_the_context_end(small, name):
    """N = 60k completions (seed 21) that only ``max_seq_len`` = prompt + 3 ends (max_new_tokens 10):
    rows cut to 1 then 0 drafts, their other columns drafted in lockstep, against the enumerated joint."""
    cfg = AUTO if name == "auto" else CONFIGS[name]
    cfg = EngineConfig(**{**cfg.__dict__, "max_batch_size": 60_000, "max_seq_len": len(PROMPT) + NEW})
    torch.manual_seed(0)
    costs = FLAT if name == "auto" else None
    eng = SpeculativeEngine(small, Eagle3Drafter.from_target(small), cfg, cost_model=costs)
    assert_distribution(sample_index(eng, max_new_tokens=10), exact_joint(small), name)
    assert eng.stats["accepted"] > 1000


@pytest.mark.parametrize("name", ["chain_k5", "tree_4x5"])
def test_theta_one_equals_strict_and_mars_relaxes(target, name):
    head = Eagle3Drafter.from_target(target)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16, n=2, seed=4)
    base = CONFIGS[name].__dict__
    strict = SpeculativeEngine(target, head, EngineConfig(**{**base, "rule": "strict"})).generate(PROMPTS, sp)
    same = SpeculativeEngine(target, head, EngineConfig(**{**base, "rule": "mars", "theta": 1.0})).generate(
        PROMPTS, sp
    )
    assert [t.completion_ids for t in strict] == [t.completion_ids for t in same]
    assert [t.behavior_logprobs for t in strict] == [t.behavior_logprobs for t in same]
    assert all(t.rule == "mars" and t.theta == 1.0 for t in same)


@pytest.mark.parametrize("name", ["chain_k5", "tree_3x3"])
def test_top_k_one_makes_every_rule_greedy(target, name):
    """top_k = 1 at T = 1 is greedy sampling.  With theta = 0 (relaxable wherever z1 > 0) and a random head
    that often drafts the filtered-out t2, mars and mars_code must still give HF's greedy completions: a
    rollout never emits a token its sampling distribution gives probability 0."""
    head = Eagle3Drafter.from_target(target)
    sp = SamplingParams(temperature=1.0, top_k=1, max_new_tokens=24, seed=3)
    want = hf_greedy(target, PROMPTS, 24)
    for rule in ("mars", "mars_code"):
        cfg = EngineConfig(**{**CONFIGS[name].__dict__, "rule": rule, "theta": 0.0})
        out = SpeculativeEngine(target, head, cfg).generate(PROMPTS, sp)
        assert [t.completion_ids for t in out] == want, rule
        assert all(v == 0.0 for t in out for v in t.target_logprobs), rule  # p(t1) = 1 under top_k = 1


def test_draft_confidence_bounds(target):
    """A confidence no draft reaches keeps one draft per row and round; one every draft passes keeps K.
    Either way the greedy completions are the target's own."""
    head = Eagle3Drafter.from_target(target)
    sp = SamplingParams(temperature=0.0, max_new_tokens=20)
    want = hf_greedy(target, PROMPTS, 20)
    forwards = []
    for confidence, per_round in ((0.999999, 1), (1e-30, 6)):
        eng = SpeculativeEngine(target, head, EngineConfig(num_draft_tokens=6, draft_confidence=confidence))
        out = eng.generate(PROMPTS, sp)
        assert [t.completion_ids for t in out] == want
        assert eng.stats["drafted"] == per_round * eng.stats["rounds"], confidence
        forwards.append(eng.stats["draft_forwards"] / eng.stats["target_forwards"])
    assert forwards[0] < 1 < forwards[1]  # one drafter forward a round (the absorb) against six


def test_draft_confidence_checked(target):
    with pytest.raises(ValueError, match="draft_confidence must be in"):
        EngineConfig(draft_confidence=1.0)
    with pytest.raises(ValueError, match="a tree sizes itself"):
        EngineConfig(tree=TreeConfig(), draft_confidence=0.5)
    from marsrl.engine import OracleDrafter

    oracle = OracleDrafter.from_target(target, [PROMPTS[0]], 4)
    with pytest.raises(ValueError, match="draft_confidence needs an Eagle3Drafter"):
        SpeculativeEngine(target, oracle, EngineConfig(draft_confidence=0.5))


def test_ancestor_sets_equal_a_walk_up_the_parents():
    """The matmul closure = walking each node's parent chain to the root, on random parents-first trees
    (padding-like -1 parents included) of every depth up to the bound."""
    from marsrl.engine.tree import ancestor_sets

    g = torch.Generator().manual_seed(0)
    bsz, n = 6, 24
    parents = torch.full((bsz, n), -1, dtype=torch.long)
    depth = torch.ones(bsz, n, dtype=torch.long)
    for b in range(bsz):
        for i in range(1, n):
            p = int(torch.randint(-1, i, (1,), generator=g))
            parents[b, i] = p
            depth[b, i] = 1 if p < 0 else depth[b, p] + 1
    sets = ancestor_sets(parents, int(depth.max()))
    for b in range(bsz):
        for i in range(n + 1):
            want = {i, 0}
            node = i - 1
            while node >= 0:
                want.add(node + 1)
                node = int(parents[b, node])
            assert set(sets[b, i].nonzero().flatten().tolist()) == want, (b, i)
    # a bound below the deepest node misses its farthest ancestors
    assert not torch.equal(ancestor_sets(parents, int(depth.max()) - 1), sets)


def test_drafted_trees_carry_every_ancestor(target, monkeypatch):
    """Every tree the engine drafts (top_k 4, depth 5: nodes down to depth 6) masks each node to exactly
    its ancestors and the root, as walking its parents says — the deepest level included."""
    import marsrl.engine.engine as engine_mod

    trees = []
    real = engine_mod.draft_tree

    def capture(*args, **kwargs):
        trees.append(real(*args, **kwargs))
        return trees[-1]

    monkeypatch.setattr(engine_mod, "draft_tree", capture)
    head = Eagle3Drafter.from_target(target)
    with torch.no_grad():  # a confident head: its best-scored nodes run deep, down to depth 6
        head.lm_head.weight.mul_(40.0)
    SpeculativeEngine(target, head, CONFIGS["tree_4x5"]).generate(
        PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=8, seed=2)
    )
    assert trees and max(int(t.depth.max()) for t in trees) == 6
    for tree in trees:
        bsz, n = tree.parents.shape
        for b in range(bsz):
            for i in range(n):
                want = {0, i + 1}
                node = int(tree.parents[b, i])
                while node >= 0:
                    want.add(node + 1)
                    node = int(tree.parents[b, node])
                assert set(tree.ancestors[b, i + 1].nonzero().flatten().tolist()) == want
