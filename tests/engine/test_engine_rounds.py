"""The decode loop as a GPU run depends on it, checked on the CPU (``engine.py``): host syncs per round,
cache bytes flat in the committed length, the shared-prefix prefill, and plain steps with and without
a mask or an in-place write, each against its reference path."""

import pytest
import torch

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.engine.adaptive import CostModel
from tests.engine.helpers import PROMPTS, hf_greedy
from tests.engine.syncs import SyncCounter


def _syncs_per_round(engine, prompts, sp):
    engine.generate(prompts, sp)  # warm-up (lazy inits)
    with SyncCounter() as c:
        engine.generate(prompts, sp)
    rounds = engine.stats["rounds"] // len(prompts) + 1  # + the prefill, per row (all rows in lockstep)
    return c.count / rounds, c.where


@pytest.mark.parametrize("mode", ["plain", "chain", "mars", "auto"])
def test_at_most_two_syncs_per_round(qwen, mode):
    head = Eagle3Drafter.from_target(qwen)
    cfgs = {
        "plain": None,
        "chain": EngineConfig(num_draft_tokens=5),
        "mars": EngineConfig(num_draft_tokens=5, rule="mars"),
        "auto": EngineConfig(num_draft_tokens="auto", max_draft_tokens=4),
    }
    costs = CostModel(rounds={1: {k: 1.2 + 0.25 * k for k in range(5)}})
    eng = SpeculativeEngine(qwen, None if mode == "plain" else head, cfgs[mode], cost_model=costs)
    # one row: rows never leave the batch early, so every round is an ordinary round
    per_round, where = _syncs_per_round(eng, [[1, 2, 3]], SamplingParams(max_new_tokens=24, ignore_eos=True))
    assert per_round <= 2, (per_round, where)
    assert eng.stats["host_syncs"] == eng.stats["rounds"] + 1  # the engine's own: one record copy a round


def _bytes_per_extra_round(engine, prompt_len: int, mode: str) -> float:
    prompts = [[(7 * i + j) % 60 + 1 for j in range(prompt_len)] for i in range(2)]
    out = []
    for n in (8, 16):
        engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True))
        out.append((engine.stats["cache_bytes_copied"], engine.stats["rounds"]))
    return (out[1][0] - out[0][0]) / (out[1][1] - out[0][1])


@pytest.mark.parametrize("mode", ["plain", "chain"])
def test_cache_bytes_per_round_do_not_grow_with_the_committed_length(qwen, mode):
    # a head of its own seed: the bytes a round moves follow its acceptance, which an untrained head's
    # random init sets; drawn from the global generator it depended on the tests run before it (with
    # seed 4 of 0-7 a round moved 4608 bytes at 128 prompt tokens and 2432 at 1024)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        head = Eagle3Drafter.from_target(qwen)
    eng = SpeculativeEngine(qwen, None if mode == "plain" else head, EngineConfig(num_draft_tokens=3))
    short, long = (_bytes_per_extra_round(eng, t, mode) for t in (128, 1024))
    cfg = qwen.config
    # bytes of one row's K and V at one position, all layers, fp32 (rounds are counted per row)
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4
    if mode == "plain":  # an append of one token a round, nothing moved
        assert short == long == per_token
    else:  # at most the K + 1 appended entries plus the kept ones moved (target), and the drafter's few
        assert short <= 3 * 4 * per_token and long <= 3 * 4 * per_token, (short, long)
        assert abs(long - short) <= 0.25 * short, (short, long)


@pytest.mark.parametrize("mode", ["plain", "chain", "tree"])
def test_shared_prefix_prefill_gives_the_unshared_trajectories_bit_for_bit(target, mode):
    from marsrl.engine import TreeConfig

    head = Eagle3Drafter.from_target(target)
    shapes = {"plain": {}, "chain": dict(num_draft_tokens=4), "tree": dict(tree=TreeConfig(3, 3, 10))}
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, n=4, seed=7)
    runs = []
    for share in (True, False):
        cfg = EngineConfig(rule="mars", share_prefix=share, **shapes[mode])
        eng = SpeculativeEngine(target, None if mode == "plain" else head, cfg)
        out = eng.generate(PROMPTS, sp)
        runs.append([(t.completion_ids, t.behavior_logprobs, t.target_logprobs, t.provenance) for t in out])
    assert runs[0] == runs[1]


def test_plain_steps_without_padding_skip_the_mask_and_match_the_masked_path(qwen, monkeypatch):
    """One prompt (or a group sharing it) decoded plainly has no padding and no gaps: its steps pass no
    mask (SDPA's unmasked path, as HF generate takes) and give what the masked path gives."""
    from marsrl.engine.cache import RaggedCache

    masks = []
    real = RaggedCache.attention_mask

    def spy(self, *a, **kw):
        masks.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(RaggedCache, "attention_mask", spy)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16, n=3, ignore_eos=True, seed=4)
    eng = SpeculativeEngine(qwen, None, EngineConfig())
    runs = []
    for dense in (None, False):  # the engine's own decision, then the mask forced on every step
        if dense is not None:
            monkeypatch.setattr(RaggedCache, "dense", property(lambda self, d=dense: d))
        masks.clear()
        out = eng.generate([[5, 6, 7, 8]], sp)
        runs.append((out, len(masks)))
    (unmasked, n_unmasked), (masked, n_masked) = runs
    assert n_unmasked == 1 and n_masked == 1 + 15  # the prefill's mask only, then one every step
    assert [t.completion_ids for t in unmasked] == [t.completion_ids for t in masked]
    for a, b in zip(unmasked, masked, strict=True):
        assert torch.allclose(torch.tensor(a.target_logprobs), torch.tensor(b.target_logprobs), atol=1e-5)
    # two prompts of different lengths are padded: every step is masked again
    masks.clear()
    monkeypatch.undo()
    monkeypatch.setattr(RaggedCache, "attention_mask", spy)
    eng.generate([[5, 6, 7, 8], [9, 10]], sp)
    assert len(masks) == 1 + 15


def test_plain_steps_over_ragged_rows_written_at_their_ends_match_the_moved_path(qwen, monkeypatch):
    """Auto mode's plain steps after speculative rounds (rows' ends differ) write each row's entry at
    its end instead of appending and moving it: the same plan (``CycleK``: plain runs between chains)
    gives the same tokens and acceptance, and behaviour and target log-probs within 1e-5, greedy and
    sampled, rows finishing at different rounds.  ``new_empty`` is poisoned with NaN throughout: the
    in-place step reads masked slots no forward wrote, which must hold finite numbers (the buffers are
    allocated zeroed)."""
    from marsrl.engine.adaptive import CycleK
    from marsrl.engine.cache import RaggedCache

    real_new_empty = torch.Tensor.new_empty

    def poisoned(self, *a, **kw):
        out = real_new_empty(self, *a, **kw)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch.Tensor, "new_empty", poisoned)
    in_place = []
    real_mask = RaggedCache.ends_mask

    def spy(self, dtype):
        in_place.append(len(self.ends))
        return real_mask(self, dtype)

    monkeypatch.setattr(RaggedCache, "ends_mask", spy)

    class NoisyGreedy:
        """Drafts the target's greedy continuation with each token replaced by a random one with
        probability 0.3, seeded by the sequence (the two paths see the same drafts): rows accept
        different numbers of drafts, greedy and sampled, so their ends differ."""

        def propose(self, sequences, k):
            out = []
            for seq, greedy in zip(sequences, hf_greedy(qwen, sequences, k), strict=True):
                greedy = torch.tensor(greedy)
                g = torch.Generator().manual_seed(hash(tuple(seq)) % 2**31)
                noise = torch.randint(0, 64, (k,), generator=g)
                out.append(torch.where(torch.rand(k, generator=g) < 0.3, noise, greedy))
            return torch.stack(out)

    eng = SpeculativeEngine(qwen, NoisyGreedy(), EngineConfig(num_draft_tokens="auto", max_draft_tokens=3))

    def run(temperature: float, at_ends: bool):
        monkeypatch.setattr(SpeculativeEngine, "plain_at_ends", at_ends)
        sp = SamplingParams(temperature=temperature, max_new_tokens=40, n=3, seed=5, ignore_eos=True)
        out = eng._generate(PROMPTS, sp, CycleK([3, 0], cycles=30, repeat=2))
        return out, eng._totals["accepted"]

    ragged = {}
    for temperature in (0.0, 1.0):
        in_place.clear()
        moved, acc_moved = run(temperature, False)
        assert in_place == []
        placed, acc_placed = run(temperature, True)
        ragged[temperature] = list(in_place)
        assert acc_placed == acc_moved > 0
        for a, b in zip(placed, moved, strict=True):
            assert a.completion_ids == b.completion_ids
            assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-5)
            assert a.target_logprobs == pytest.approx(b.target_logprobs, abs=1e-5)
    print(ragged)
    for steps in ragged.values():
        assert len(steps) >= 10 and min(steps) < 12  # ragged plain steps ran, also after rows finished
