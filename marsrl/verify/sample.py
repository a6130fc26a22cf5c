"""Plain sampling from the target with the same per-token record as verification: the reference path
(no draft) of the engine.  Every token is a BONUS draw from p, so b = p."""

from __future__ import annotations

import torch

from .dist import (
    check_scalars,
    dist_logp,
    dist_probs,
    logit_flags,
    margin_ratio,
    raise_on_flags,
    sample_from_weights,
    target_dist,
)
from .types import Provenance, VerifyResult


def sample_plain(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Draw one token per row from the target's sampling distribution.

    logits [B, V] raw. Returns a VerifyResult with fields [B, 1] (num_emitted all ones, provenance BONUS).
    At T > 0 exactly one ``torch.rand((B, 1), float64)`` is drawn; T = 0 takes the argmax.
    """
    check_scalars("strict", ("strict",), temperature, 0.0, top_k, top_p)
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got {list(logits.shape)}")
    bsz = logits.shape[0]
    d = target_dist(logits, temperature, top_k, top_p)
    raise_on_flags(logit_flags("logits", d.z1))
    if temperature == 0:
        y = d.t1
    else:
        u = torch.rand((bsz, 1), dtype=torch.float64, device=logits.device, generator=generator)
        y = sample_from_weights(dist_probs(d, (torch.arange(bsz, device=logits.device),)), u[:, 0])
    logp = dist_logp(d, y).float()
    col = lambda t: t.unsqueeze(1)  # noqa: E731
    return VerifyResult(
        tokens=col(y),
        num_emitted=torch.ones(bsz, dtype=torch.long, device=logits.device),
        provenance=torch.full((bsz, 1), int(Provenance.BONUS), dtype=torch.int8, device=logits.device),
        target_logprob=col(logp),
        behavior_logprob=col(logp),
        logit_ratio=col(margin_ratio(d.z1, d.z2)),
        is_top2=col(y == d.t2),
        unsupported_mass=torch.zeros(bsz, 1, device=logits.device),  # b = p
    )
