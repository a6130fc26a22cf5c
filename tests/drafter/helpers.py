"""Tiny targets and heads shared by the drafter tests (no hub access: everything is built from configs)."""

import torch

from marsrl.drafter import Eagle3Drafter
from marsrl.testing import tiny_causal_lm

V, H, L = 64, 32, 6


def tiny_llama(vocab: int = V, hidden: int = H, layers: int = L, seed: int = 0):
    """LlamaConfig's own special tokens and context (bos 1, eos 2, 2048), the default lm_head."""
    return tiny_causal_lm(
        "llama",
        vocab=vocab,
        hidden=hidden,
        layers=layers,
        seed=seed,
        lm_head_scale=1.0,
        max_positions=2048,
        bos_token_id=1,
        eos_token_id=2,
    )


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
