"""Plain sampling from the target with the same per-token record as verification: the reference path
(no draft) of the engine.  Every token is a BONUS draw from p, so b = p."""

from __future__ import annotations

import torch

from .dist import (
    ONE_LEVEL_MAX,
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
    vocab = logits.shape[-1]
    unfiltered = (top_k is None or top_k >= vocab) and (top_p is None or top_p >= 1.0)
    if temperature > 0 and unfiltered and logits.numel() <= ONE_LEVEL_MAX:
        return _sample_small(logits, temperature, generator)
    return sample_plain_reference(logits, temperature, top_k, top_p, generator)


def sample_plain_reference(logits, temperature, top_k, top_p, generator) -> VerifyResult:
    """``sample_plain`` through the verification core's general pieces (any temperature and filter)."""
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


def _sample_small(logits: torch.Tensor, temperature: float, generator) -> VerifyResult:
    """``sample_plain`` at T > 0 without filters for a small draw (rows x V <= ONE_LEVEL_MAX): the
    reference's arithmetic, op for op, without its cache blocking, index copies and per-flag checks
    (one finiteness check, the three messages only when it fails): fewer kernels, and an output equal
    to the reference's bit for bit (tested).  At batch 1 a token's sampling runs right after the forward, with
    cold caches, where each kernel launch costs more than its work."""
    bsz, dev = logits.shape[0], logits.device
    top = logits.topk(2, dim=-1)
    vals = top.values.float()
    z1, z2 = vals[:, 0], vals[:, 1]
    if bool((~z1.isfinite()).any()):  # the one sync, as the reference's
        raise_on_flags(logit_flags("logits", z1))
    rows = logits.float()
    shifted = rows - vals[:, :1]
    if temperature != 1.0:
        shifted.div_(temperature)
        rows = rows / temperature
    lse = z1 / temperature + shifted.exp_().sum(dim=-1).log()
    probs = (rows - lse.unsqueeze(-1)).exp_()
    u = torch.rand((bsz, 1), dtype=torch.float64, device=dev, generator=generator)
    y = sample_from_weights(probs, u[:, 0])  # one level at this size, as in the reference
    picked = logits.gather(1, y.unsqueeze(1)).float()
    if temperature != 1.0:
        picked = picked / temperature
    logp = picked - lse.unsqueeze(1)
    return VerifyResult(
        tokens=y.unsqueeze(1),
        num_emitted=torch.ones(bsz, dtype=torch.long, device=dev),
        provenance=torch.full((bsz, 1), int(Provenance.BONUS), dtype=torch.int8, device=dev),
        target_logprob=logp,
        behavior_logprob=logp,
        logit_ratio=margin_ratio(z1, z2).unsqueeze(1),
        is_top2=(y == top.indices[:, 1]).unsqueeze(1),
        unsupported_mass=torch.zeros(bsz, 1, device=dev),  # b = p
    )
