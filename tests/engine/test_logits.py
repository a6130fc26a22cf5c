"""Verify logits in float32 for half-precision targets (``logits.py``)."""

import torch

from marsrl.engine import EngineConfig, SpeculativeEngine
from marsrl.engine.logits import fp32_linear
from marsrl.testing import tiny_causal_lm
from marsrl.verify import DEFAULT_THETA


def test_fp32_verify_logits_decide_near_ties_like_an_fp32_reference():
    """A bf16 head on bf16 hidden states: the margin decision z2/z1 > theta at positions whose reference
    ratio lies within 0.02 of theta (seed 0, 4,096 positions, V = 1,024) must equal float64's, and the
    plain bf16 GEMM (the control) must get some of them wrong."""
    torch.manual_seed(0)
    hidden = torch.randn(4096, 256).to(torch.bfloat16)
    weight = (torch.randn(1024, 256) / 4).to(torch.bfloat16)
    ref = hidden.double() @ weight.double().t()
    top = ref.topk(2, -1).values
    ratio = top[:, 1] / top[:, 0]
    near = (top[:, 0] > 0) & ((ratio - DEFAULT_THETA).abs() < 0.02)
    assert near.sum() > 300, int(near.sum())

    def decide(logits):
        v = logits.double().topk(2, -1).values
        return (v[:, 1] / v[:, 0] > DEFAULT_THETA)[near]

    want = decide(ref)
    assert torch.equal(decide(fp32_linear(hidden, weight)), want)
    bf16 = torch.nn.functional.linear(hidden, weight).float()
    assert not torch.equal(decide(bf16), want), "the control should flip some near-tie decisions"


def test_bf16_engine_verifies_with_fp32_logits():
    model = tiny_causal_lm("qwen3", vocab=64, layers=2, seed=3).to(torch.bfloat16)
    eng = SpeculativeEngine(model, None)
    h = torch.randn(3, model.config.hidden_size).to(torch.bfloat16)
    assert torch.equal(eng._lm_head(h), fp32_linear(h, model.lm_head.weight))
    off = SpeculativeEngine(model, None, EngineConfig(fp32_logits=False))
    assert torch.equal(off._lm_head(h), model.lm_head(h).float())
