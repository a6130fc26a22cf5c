"""Reductions over the unmasked entries of a tensor, without boolean indexing (no host sync), and the
one summary of importance ratios (mean / min / max / effective-sample-size share) every report uses.

Each reduction returns a 0-d tensor; an empty selection gives NaN (``masked_mean``, ``masked_std``,
``masked_min``, ``masked_max``) so a caller converts many figures with one ``.tolist()``.
"""

from __future__ import annotations

import torch


def masked_count(mask: torch.Tensor) -> torch.Tensor:
    """Number of True entries of ``mask`` as a 0-d float64 tensor."""
    return mask.sum(dtype=torch.float64)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (NaN when empty); ``x`` may be anything at masked positions."""
    return torch.where(mask, x, 0).sum() / mask.sum()


def masked_std(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (n - 1) standard deviation of ``x`` over ``mask``; NaN with fewer than two entries."""
    n = mask.sum()
    dev = torch.where(mask, x - masked_mean(x, mask), 0)
    return ((dev**2).sum() / (n - 1)).sqrt().where(n > 1, float("nan"))


def masked_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, float("inf")).min().where(mask.any(), float("nan"))


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, float("-inf")).max().where(mask.any(), float("nan"))


def ratio_summary(w: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """``is_ratio_{mean,min,max,ess_frac}`` of the ratios ``w`` over ``mask`` (0-d tensors, NaN when empty).

    ess_frac = (sum w)^2 / (n sum w^2): the effective sample size of self-normalised importance sampling
    as a share of the n tokens, 1 when every w is equal.
    """
    w = torch.where(mask, w, 0)
    return {
        "is_ratio_mean": masked_mean(w, mask),
        "is_ratio_min": masked_min(w, mask),
        "is_ratio_max": masked_max(w, mask),
        "is_ratio_ess_frac": w.sum() ** 2 / (w**2).sum() / mask.sum(),
    }


def to_floats(figures: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """0-d tensors (on any one device) and numbers -> Python floats, with one host sync."""
    keys = [k for k, v in figures.items() if isinstance(v, torch.Tensor)]
    synced = torch.stack([figures[k].double() for k in keys]).tolist() if keys else []
    values = dict(zip(keys, synced, strict=True))
    return {k: float(values[k]) if k in values else float(v) for k, v in figures.items()}
