"""Tiny targets and heads shared by the drafter tests (no hub access: everything is built from configs)."""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from marsrl.drafter import Eagle3Drafter

V, H, L = 64, 32, 6


def tiny_llama(vocab: int = V, hidden: int = H, layers: int = L, seed: int = 0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return AutoModelForCausalLM.from_config(cfg).eval()


def randomize_(drafter: Eagle3Drafter, seed: int) -> Eagle3Drafter:
    """Give every trained parameter a distinct random value (norm weights near 1) so tests see them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name == "embed_tokens.weight":
                continue
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)
    return drafter


def make_head(target, seed: int = 1, **kwargs) -> Eagle3Drafter:
    """A random head for ``target`` with a 40-token draft vocabulary (sorted random target ids)."""
    g = torch.Generator().manual_seed(seed)
    token_ids = torch.randperm(V, generator=g)[:40].sort().values
    return randomize_(Eagle3Drafter.from_target(target, token_ids=token_ids, **kwargs), seed)


def run_head(drafter: Eagle3Drafter, seed: int = 5, batch: int = 2, steps: int = 5):
    """fuse + one cached forward on fixed random inputs -> (logits, hidden_out)."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    cfg = drafter.config
    feats = torch.randn(batch, steps, cfg.fc_in_features, generator=g)
    ids = torch.randint(0, cfg.vocab_size, (batch, steps), generator=g)
    pos = torch.arange(steps).expand(batch, steps)
    with torch.no_grad():
        return drafter(ids, drafter.fuse(feats), pos, DynamicCache())
