"""Strict speculative sampling through the whole engine is exact: the distribution of whole 3-token
completions matches the target's enumerated joint distribution (V = 8, 512 sequences)."""

import itertools

import pytest
import torch

from marsrl.engine import EngineConfig, OracleDrafter, SamplingParams, SpeculativeEngine
from tests.engine.conftest import tiny_target
from tests.stats import assert_distribution

V, NEW, N = 8, 3, 60_000  # vocabulary, completion length, sampled completions per case (seed 21)
PROMPT = [3, 1, 4]


@pytest.fixture(scope="module")
def small():
    return tiny_target("qwen3", vocab=V, layers=4, seed=1)


def exact_joint(target) -> torch.Tensor:
    """P(y1 y2 y3 | prompt) for all V**3 completions, by teacher forcing, index = y1*V*V + y2*V + y3."""
    seqs = torch.tensor([PROMPT + list(c) for c in itertools.product(range(V), repeat=NEW)])
    with torch.no_grad():
        logp = torch.log_softmax(target(seqs).logits[:, len(PROMPT) - 1 : -1].double(), -1)
    return logp.gather(2, seqs[:, len(PROMPT) :, None])[..., 0].sum(1).exp()


def sample_index(engine) -> torch.Tensor:
    out = engine.generate([PROMPT], SamplingParams(temperature=1.0, max_new_tokens=NEW, n=N, seed=21))
    comp = torch.tensor([t.completion_ids for t in out])
    assert comp.shape == (N, NEW)
    return comp[:, 0] * V * V + comp[:, 1] * V + comp[:, 2]


def test_exact_joint_is_a_distribution(small):
    assert abs(exact_joint(small).sum().item() - 1) < 1e-9


@pytest.mark.parametrize("mode", ["plain", "oracle_chain_k2", "oracle_chain_k1"])
def test_strict_completions_follow_the_target(small, mode):
    drafter, cfg = None, EngineConfig(max_batch_size=N)
    if mode != "plain":
        k = int(mode[-1])
        drafter = OracleDrafter.from_target(small, [PROMPT], 8)
        cfg = EngineConfig(num_draft_tokens=k, max_batch_size=N)
    assert_distribution(sample_index(SpeculativeEngine(small, drafter, cfg)), exact_joint(small), mode)
