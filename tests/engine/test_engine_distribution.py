"""Strict speculative sampling through the whole engine is exact: the distribution of whole 3-token
completions matches the target's enumerated joint distribution (V = 8, 512 sequences)."""

import pytest

from marsrl.engine import EngineConfig, OracleDrafter, SpeculativeEngine
from tests.engine.helpers import PROMPT, N, exact_joint, sample_index
from tests.stats import assert_distribution


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
