"""Masked grouped-query attention for the target's verify forwards, without repeated KV heads.

transformers' SDPA path (5.x) gives grouped-query attention to torch only when no mask is passed; with
the engine's 4D chain / tree mask and more than one query it calls ``repeat_kv``, writing K and V at every
query head in every layer, every round (4x the cache's bytes for Qwen3-8B / Llama-3.1-8B).  Here each KV
head's G query heads are folded into the query axis instead:

    q [B, H, T, hd] -> [B, Hkv, G*T, hd]     (row g*T + t is query head kv*G + g at position t)
    mask [B, 1, T, S] -> [B, 1, G*T, S]      (the same rows repeated G times: B*G*T*S, no head dim)
    out = sdpa(q, K, V, mask) [B, Hkv, G*T, hd] -> [B, T, H, hd]

K and V are read once, at their own heads, from the cache's buffers (views, never copied).  A single
query (plain decoding) goes to transformers' own path, which packs the heads the same way.

``target_attention(model)`` switches a model to this function for the duration of a forward and back;
``check_attention(model)`` refuses implementations that would read the engine's 4D mask wrongly.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

NAME = "marsrl_sdpa"
SUPPORTED = ("sdpa", "eager", NAME)


def gqa_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """query [B, H, T, hd], key / value [B, Hkv, S, hd], attention_mask [B, 1, T, S] additive.

    Returns (output [B, T, H, hd], None) like transformers' attention functions."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    bsz, heads, t, hd = query.shape
    if groups == 1 or t == 1 or attention_mask is None or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    kv_heads = key.shape[1]
    q = query.reshape(bsz, kv_heads, groups * t, hd)
    s = attention_mask.shape[-1]
    mask = attention_mask.unsqueeze(2).expand(attention_mask.shape[0], 1, groups, t, s)
    mask = mask.reshape(attention_mask.shape[0], 1, groups * t, s)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )  # [B, Hkv, G*T, hd]
    return out.reshape(bsz, heads, t, hd).transpose(1, 2).contiguous(), None


def _register() -> None:
    """Make NAME known to transformers (on first use: importing its model utilities costs seconds)."""
    from transformers import AttentionInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, gqa_sdpa_attention)


def check_attention(model) -> None:
    """Raise unless the model's attention reads a 4D additive mask as one (sdpa or eager)."""
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED:
        raise ValueError(
            f"the target uses attn_implementation={impl!r}, which takes the engine's 4D chain / tree mask "
            "as a padding mask and would attend wrongly without an error: load it with "
            "attn_implementation='sdpa' (or 'eager')"
        )


@contextmanager
def target_attention(model):
    """Run the model's sdpa layers through ``gqa_sdpa_attention`` inside the block; eager stays eager."""
    cfg = model.config
    before = cfg._attn_implementation
    if before != "sdpa":
        yield
        return
    _register()
    # the private field, not the property: its setter walks every sub-config, twice per forward
    cfg._attn_implementation_internal = NAME
    try:
        yield
    finally:
        cfg._attn_implementation_internal = before
