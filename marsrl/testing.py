"""Tiny random causal LMs built from configs (nothing from the hub), for tests and benchmarks."""

from __future__ import annotations

import torch


def tiny_causal_lm(
    family: str = "qwen3",
    *,
    vocab: int = 64,
    hidden: int = 32,
    layers: int = 6,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 256,
    seed: int = 0,
    lm_head_scale: float = 8.0,
    **config,
):
    """A random Qwen3 (``family`` "qwen3") or Llama ("llama") model in eval mode.

    Weights come from ``torch.manual_seed(seed)`` then the family's default init, so the same arguments
    give the same model.  The MLP is 2 * hidden wide and head_dim = hidden / heads.  The lm_head is
    multiplied by ``lm_head_scale``: the default init gives near-uniform outputs, and a sharper head
    gives sampling some structure (scale 8: mean top-1 probability ~0.1 on random contexts at V = 64;
    32: ~0.55).  No special tokens unless passed in ``config`` (any other config field goes there too).
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    if family not in ("qwen3", "llama"):
        raise ValueError(f"family must be 'qwen3' or 'llama', got {family!r}")
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}), heads by kv_heads ({kv_heads})")
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    fields.update(config)
    cfg = Qwen3Config(head_dim=hidden // heads, **fields) if family == "qwen3" else LlamaConfig(**fields)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    if lm_head_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(lm_head_scale)
    return model
