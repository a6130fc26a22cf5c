"""Small pure helpers shared by the chain and tree verifiers: the target's sampling distribution,
the raw-logit margin, inverse-CDF sampling and argument checks.

Nothing here owns randomness: samplers take uniforms drawn by the caller from its generator.
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


def sampling_logits(
    logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Scaled, filtered float32 logits whose softmax is the target's sampling distribution.

    logits [..., V] raw; returns [..., V] = logits / T with -inf outside top-k then top-p (HF order).
    Requires T > 0. Without filtering and with float32 input at T == 1 this returns ``logits``
    itself (no copy). top-p keeps a token iff the mass ranked strictly above it is < top_p.
    """
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    vocab = x.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, _NEG_INF)
    if top_p is not None and top_p < 1.0:
        sorted_x, order = x.sort(dim=-1, descending=True)
        probs = sorted_x.softmax(dim=-1)
        mass_above = probs.cumsum(dim=-1) - probs
        drop = torch.zeros_like(mass_above, dtype=torch.bool).scatter(-1, order, mass_above >= top_p)
        x = x.masked_fill(drop, _NEG_INF)
    return x


def top2(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-1/top-2 tokens and their raw logits: (t1, t2, z1, z2), each [...] (float32 values)."""
    top = logits.topk(2, dim=-1)
    t1, t2 = top.indices.unbind(-1)
    z1, z2 = top.values.float().unbind(-1)
    return t1, t2, z1, z2


def margin_ratio(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """r = z2 / z1 on raw logits; NaN where z1 == 0 (the ratio is undefined there)."""
    return torch.where(z1 != 0, z2 / z1, torch.full_like(z1, float("nan")))


def relaxable(z1: torch.Tensor, ratio: torch.Tensor, theta: float) -> torch.Tensor:
    """The paper's near-tie condition R: z1 > 0 and z2/z1 > theta (bool, same shape)."""
    return (z1 > 0) & (ratio > theta)


def sample_from_weights(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from unnormalised non-negative weights.

    weights [B, V], u [B] float64 in [0, 1) -> [B] int64: the first index whose cumulative weight
    exceeds u * total.  Zero-weight tokens are never drawn.  float64 cumsum keeps the error far below
    the 1e-5 level even for V = 152k.
    """
    cdf = weights.double().cumsum(dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp_(max=weights.shape[-1] - 1)


def check_scalars(rule: str, rules, temperature: float, theta: float, top_k, top_p) -> None:
    """Raise ValueError naming the argument for bad scalar settings (no tensor work)."""
    if rule not in rules:
        raise ValueError(f"rule must be one of {sorted(rules)}, got {rule!r}")
    if not isinstance(temperature, (int, float)) or temperature != temperature or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature == float("inf"):
        raise ValueError("temperature must be finite, got inf")
    if not isinstance(theta, (int, float)) or theta != theta or theta < 0:
        raise ValueError(f"theta must be a number >= 0 (use theta >= 1 to disable relaxation), got {theta!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be None or in (0, 1], got {top_p!r}")


def raise_on_flags(flags: dict[str, torch.Tensor]) -> None:
    """One host sync for all data checks: each value is a 0-d bool tensor, True meaning 'bad'."""
    if not flags:
        return
    bad = torch.stack(list(flags.values())).tolist()
    for message, is_bad in zip(flags, bad, strict=True):
        if is_bad:
            raise ValueError(message)


def logit_flags(name: str, z1: torch.Tensor) -> dict[str, torch.Tensor]:
    """Data checks on logits via their row maxima (topk propagates NaN, so no extra pass)."""
    return {
        f"{name} contains NaN": z1.isnan().any(),
        f"{name} contains +inf": (z1 == float("inf")).any(),
        f"{name} has a row that is entirely -inf": (z1 == _NEG_INF).any(),
    }


def token_range_flag(name: str, tokens: torch.Tensor, vocab: int, allow_pad: bool = False) -> dict:
    low = -1 if allow_pad else 0
    bad = ((tokens < low) | (tokens >= vocab)).any()
    return {f"{name} has ids outside [{low}, {vocab}) (the target vocabulary)": bad}
