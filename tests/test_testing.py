"""The tiny-model factory every test and benchmark builds its random targets with."""

import pytest
import torch

from marsrl.testing import tiny_causal_lm


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_same_arguments_same_model_and_the_asked_shape(family):
    a = tiny_causal_lm(family, vocab=40, hidden=16, layers=3, seed=5)
    b = tiny_causal_lm(family, vocab=40, hidden=16, layers=3, seed=5)
    c = tiny_causal_lm(family, vocab=40, hidden=16, layers=3, seed=6)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    cfg = a.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (40, 16, 3, 32)
    assert cfg.head_dim == 4 and cfg.eos_token_id is None and not a.training


def test_lm_head_scale_and_config_overrides():
    plain = tiny_causal_lm(lm_head_scale=1.0, seed=2)
    sharp = tiny_causal_lm(lm_head_scale=8.0, seed=2, eos_token_id=3)
    torch.testing.assert_close(sharp.lm_head.weight, 8.0 * plain.lm_head.weight)
    torch.testing.assert_close(sharp.model.embed_tokens.weight, plain.model.embed_tokens.weight)
    assert sharp.config.eos_token_id == 3


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="family must be"):
        tiny_causal_lm("gpt2")
    with pytest.raises(ValueError, match="hidden \\(30\\) must divide by heads"):
        tiny_causal_lm(hidden=30)
