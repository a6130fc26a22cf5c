import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config


def tiny_target(family: str = "qwen3", vocab: int = 64, layers: int = 6, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    cfg = Qwen3Config(head_dim=8, **common) if family == "qwen3" else LlamaConfig(**common)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # sharper than the default init, so sampling has structure
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def target(request):
    return tiny_target(request.param)


@pytest.fixture(scope="module")
def small():
    """A V = 8 target for exact-distribution tests."""
    return tiny_target("qwen3", vocab=8, layers=4, seed=1)
