"""What the drafter reads from an HF causal-LM target: its text config, decoder-layer list, final norm
and input embedding.  Supports the ``target.model.layers`` / ``target.model.norm`` layout of Llama,
Qwen2, Qwen3 and Mistral (and a bare base model with ``.layers`` / ``.norm``).

Leaves out: multimodal wrappers whose decoder lives elsewhere, pipeline-parallel shards.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def _base(target: nn.Module) -> nn.Module:
    inner = getattr(target, "model", None)
    if isinstance(inner, nn.Module) and isinstance(getattr(inner, "layers", None), nn.ModuleList):
        return inner
    if isinstance(getattr(target, "layers", None), nn.ModuleList):
        return target
    raise ValueError(
        f"target ({type(target).__name__}) has no decoder-layer list at target.model.layers; "
        "EAGLE-3 features can only be tapped from Llama/Qwen2/Qwen3/Mistral-style causal LMs"
    )


def decoder_layers(target: nn.Module) -> nn.ModuleList:
    """The target's decoder layers (``target.model.layers``)."""
    return _base(target).layers


def final_norm(target: nn.Module) -> nn.Module:
    """The norm applied after the last decoder layer (``target.model.norm``)."""
    norm = getattr(_base(target), "norm", None)
    if not isinstance(norm, nn.Module):
        raise ValueError(
            f"target ({type(target).__name__}) has no final norm at target.model.norm; "
            "aux layer index == num_layers (the input of the final norm) cannot be tapped"
        )
    return norm


def num_layers(target: nn.Module) -> int:
    """L, the number of decoder layers."""
    return len(decoder_layers(target))


def text_config(target: nn.Module) -> Any:
    """The target's (text) config object: hidden_size, vocab_size, heads, rms_norm_eps, ..."""
    cfg = getattr(target, "config", None)
    if cfg is None:
        raise ValueError(f"target ({type(target).__name__}) has no .config; pass an HF causal LM")
    get_text = getattr(cfg, "get_text_config", None)
    return get_text() if callable(get_text) else cfg


def input_embedding(target: nn.Module) -> nn.Embedding:
    """The target's input embedding module (``get_input_embeddings()``)."""
    get = getattr(target, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    if not isinstance(emb, nn.Embedding):
        raise ValueError(f"target ({type(target).__name__}) has no nn.Embedding at get_input_embeddings()")
    return emb
