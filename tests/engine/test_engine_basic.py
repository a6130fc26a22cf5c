"""Engine paths that need no trained drafter: plain sampling and the oracle drafter."""

import math
import re

import torch

from marsrl.engine import EngineConfig, OracleDrafter, SamplingParams, SpeculativeEngine
from marsrl.verify import Provenance
from marsrl.verify.reference import reference_behavior_distribution_chain, reference_unsupported_mass_chain
from tests.engine.helpers import PROMPTS, hf_greedy


def test_plain_and_oracle_greedy_equal_hf_generate(target):
    ref = hf_greedy(target, PROMPTS, 24)
    sp = SamplingParams(temperature=0.0, max_new_tokens=24)
    plain = SpeculativeEngine(target).generate(PROMPTS, sp)
    assert [t.completion_ids for t in plain] == ref
    oracle = OracleDrafter.from_target(target, PROMPTS, 40)
    for k in (1, 3, 7):
        eng = SpeculativeEngine(target, oracle, EngineConfig(num_draft_tokens=k))
        assert [t.completion_ids for t in eng.generate(PROMPTS, sp)] == ref
        # every draft accepted: K + 1 tokens per round, the last round cut at 24 (23 after the prefill's)
        assert eng.stats["rounds"] == len(PROMPTS) * math.ceil(23 / (k + 1))
        assert eng.stats["tau"] == 23 * len(PROMPTS) / eng.stats["rounds"] <= k + 1


def test_tau_counts_only_kept_tokens(target):
    """A round's tokens past max_new_tokens or an EOS are dropped, and tau must not count them:
    tau = (kept tokens - the prefill's) / rounds exactly.  max_new_tokens = 2 with an oracle drafter and
    K = 7: each sequence keeps one token of its one round (8 emitted), so tau is 1, not 8."""
    oracle = OracleDrafter.from_target(target, PROMPTS, 40)
    eng = SpeculativeEngine(target, oracle, EngineConfig(num_draft_tokens=7))
    out = eng.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=2))
    assert all(len(t.completion_ids) == 2 for t in out)
    assert eng.stats["rounds"] == len(PROMPTS) and eng.stats["tau"] == 1.0
    assert eng.stats["accepted"] == len(PROMPTS)  # accepted counts kept tokens too
    ref = hf_greedy(target, PROMPTS, 24)
    eos = ref[0][5]  # row 0 stops at its 6th token, mid-round
    for sp in (
        SamplingParams(temperature=0.0, max_new_tokens=24, eos_token_id=eos),
        SamplingParams(temperature=1.0, max_new_tokens=13, seed=3, n=3),
    ):
        out = eng.generate(PROMPTS, sp)
        kept = sum(len(t.completion_ids) - 1 for t in out)
        assert eng.stats["tokens_in_rounds"] == kept
        assert eng.stats["tau"] == kept / eng.stats["rounds"]
        assert eng.stats["rounds"] == sum(t.stats["rounds"] for t in out)


def teacher_forced_logprobs(target, prompt, completion, temperature=1.0):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = target(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1), logits


def test_recorded_logprobs_match_teacher_forcing(target):
    oracle = OracleDrafter.from_target(target, PROMPTS, 40)
    for rule in ("strict", "mars"):
        eng = SpeculativeEngine(target, oracle, EngineConfig(rule=rule, num_draft_tokens=4))
        for traj in eng.generate(PROMPTS, SamplingParams(temperature=0.8, max_new_tokens=20, seed=3)):
            logp, logits = teacher_forced_logprobs(target, traj.prompt_ids, traj.completion_ids, 0.8)
            want = logp.gather(1, torch.tensor(traj.completion_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(traj.target_logprobs), want, rtol=0, atol=1e-4)
            top = logits.topk(2, -1)
            torch.testing.assert_close(
                torch.tensor(traj.logit_ratio), top.values[:, 1] / top.values[:, 0], rtol=0, atol=1e-5
            )
            assert traj.is_top2 == (torch.tensor(traj.completion_ids) == top.indices[:, 1]).tolist()


def test_behaviour_logprobs_match_slow_recomputation(target):
    """Rebuild each round from draft_position, re-ask the oracle for its drafts, teacher-force the target,
    and enumerate b and the unsupported mass with the reference; every recorded behaviour log-prob must
    match (1e-4), every unsupported mass (1e-5)."""
    k, theta = 4, 0.5  # a low theta so the tiny random target relaxes often
    oracle = OracleDrafter.from_target(target, PROMPTS, 40)
    for rule, lam in (("mars", 1.0), ("mars", 0.5), ("mars_code", 1.0)):
        cfg = EngineConfig(rule=rule, theta=theta, num_draft_tokens=k, relax_prob=lam)
        eng = SpeculativeEngine(target, oracle, cfg)
        relaxed, out_of_reach = 0, 0.0
        for traj in eng.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=30, seed=5, n=3)):
            assert traj.relax_prob == lam
            assert len(traj.unsupported_mass) == len(traj.completion_ids)
            logp, logits = teacher_forced_logprobs(target, traj.prompt_ids, traj.completion_ids)
            drafts = None
            for i, (y, j) in enumerate(zip(traj.completion_ids, traj.draft_position, strict=True)):
                if i == 0:
                    assert traj.provenance[0] == Provenance.BONUS  # the prefill's token
                    assert traj.unsupported_mass[0] == 0
                    continue
                if j == 0:  # a new round starts at completion index i
                    drafts = oracle.propose([traj.prompt_ids + traj.completion_ids[:i]], k)[0].tolist()
                p = logp[i].exp().double()
                if j == k:  # bonus
                    b, unsupported = p, 0.0
                else:
                    top = logits[i].topk(2)
                    z1, z2 = top.values.tolist()
                    flag = (z1 > 0 and z2 / z1 > theta) if rule == "mars" else (z1 != 0 and z2 / z1 > theta)
                    q = torch.nn.functional.one_hot(torch.tensor(drafts[j]), p.numel()).double()
                    b = reference_behavior_distribution_chain(
                        p, q, *top.indices.tolist(), flag, rule, 1.0, lam
                    )
                    unsupported = reference_unsupported_mass_chain(
                        p, q, *top.indices.tolist(), flag, rule, 1.0, lam
                    )
                assert abs(traj.behavior_logprobs[i] - b[y].log().item()) < 1e-4, (rule, i)
                assert abs(traj.unsupported_mass[i] - unsupported) < 1e-5, (rule, lam, i)
                relaxed += traj.provenance[i] == Provenance.RELAXED
                out_of_reach += unsupported
        assert relaxed > 0, f"{rule}: nothing relaxed, the test would be vacuous"
        assert (out_of_reach > 0) == (lam == 1), (rule, lam)  # a greedy draft relaxed at lam = 1 only


def test_theta_one_equals_strict(target):
    oracle = OracleDrafter.from_target(target, PROMPTS, 40)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16, seed=7, n=2)
    a = SpeculativeEngine(target, oracle, EngineConfig(rule="strict", num_draft_tokens=3)).generate(
        PROMPTS, sp
    )
    b = SpeculativeEngine(target, oracle, EngineConfig(rule="mars", theta=1.0, num_draft_tokens=3)).generate(
        PROMPTS, sp
    )
    assert [t.completion_ids for t in a] == [t.completion_ids for t in b]
    assert [t.behavior_logprobs for t in a] == [t.behavior_logprobs for t in b]


def test_relax_prob_zero_equals_strict_and_greedy_refuses_a_fraction(target):
    import pytest

    oracle = OracleDrafter.from_target(target, PROMPTS, 40)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16, seed=7, n=2)
    cfg = dict(num_draft_tokens=3, theta=0.5)
    a = SpeculativeEngine(target, oracle, EngineConfig(rule="strict", **cfg)).generate(PROMPTS, sp)
    b = SpeculativeEngine(target, oracle, EngineConfig(rule="mars", relax_prob=0.0, **cfg)).generate(
        PROMPTS, sp
    )
    for field in ("completion_ids", "provenance", "behavior_logprobs", "target_logprobs", "unsupported_mass"):
        assert [getattr(t, field) for t in a] == [getattr(t, field) for t in b], field
    assert {t.relax_prob for t in b} == {0.0}
    half = SpeculativeEngine(target, oracle, EngineConfig(rule="mars", relax_prob=0.5, **cfg))
    with pytest.raises(ValueError, match=r"relax_prob = 0\.5 needs a random draw"):
        half.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=4))


def test_same_seed_same_output_and_groups_in_order(target):
    oracle = OracleDrafter.from_target(target, PROMPTS, 40)
    eng = SpeculativeEngine(target, oracle, EngineConfig(rule="mars", num_draft_tokens=3, max_batch_size=5))
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, seed=11, n=3)
    a, b = eng.generate(PROMPTS, sp), eng.generate(PROMPTS, sp)
    assert [t.completion_ids for t in a] == [t.completion_ids for t in b]
    assert [t.prompt_ids for t in a] == [p for p in PROMPTS for _ in range(3)]
    c = eng.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=12, seed=12, n=3))
    assert [t.completion_ids for t in a] != [t.completion_ids for t in c]


def test_eos_stop_and_length_per_sequence(target):
    ref = hf_greedy(target, PROMPTS, 24)
    eos = ref[0][5]  # row 0 must stop at its 6th token
    stop = ref[2][3]
    sp = SamplingParams(temperature=0.0, max_new_tokens=24, eos_token_id=eos, stop_token_ids=(stop,))
    for drafter, cfg in [
        (None, EngineConfig()),
        (OracleDrafter.from_target(target, PROMPTS, 40), EngineConfig(num_draft_tokens=5)),
    ]:
        out = SpeculativeEngine(target, drafter, cfg).generate(PROMPTS, sp)
        for traj, r in zip(out, ref, strict=True):
            cut = next((i for i, t in enumerate(r) if t in (eos, stop)), None)
            want = r if cut is None else r[: cut + 1]
            assert traj.completion_ids == want
            reason = "length" if cut is None else ("eos" if r[cut] == eos else "stop")
            assert traj.finish_reason == reason
            assert all(
                len(v) == len(want) for v in (traj.provenance, traj.behavior_logprobs, traj.draft_position)
            )
    short = SpeculativeEngine(target).generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=3))
    assert all(len(t.completion_ids) == 3 and t.finish_reason == "length" for t in short)


def test_bad_requests_fail_fast(target):
    import pytest

    eng = SpeculativeEngine(target, config=EngineConfig(max_seq_len=32))
    sp = SamplingParams(max_new_tokens=4)
    for bad, needle in [
        ([[]], "prompt_ids[0] is empty"),
        ([[1, 2], [64]], "prompt_ids[1] has token ids outside the vocabulary [0, 64)"),
        ([[-1]], "outside"),
        ([list(range(40))], "context is 32"),
        ([], "non-empty"),
        (torch.tensor([[1, 2]]), "non-empty list of token-id lists"),
        (["a prompt"], "tokenize it first"),
    ]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            eng.generate(bad, sp)
    for kwargs, field in [
        ({"n": 0}, "n"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1}, "temperature"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)
    with pytest.raises(ValueError, match="rule"):
        EngineConfig(rule="lenient")
    with pytest.raises(ValueError, match="num_draft_tokens"):
        EngineConfig(num_draft_tokens=0)
