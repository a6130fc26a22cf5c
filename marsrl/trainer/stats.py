"""Rollout-side figures the trainer logs beside the bias family: acceptance per draft position and whether
a batch came from a lossy rule. Pure functions; the trainer's loop logs them."""

from __future__ import annotations

import torch

from ..verify import Provenance


def acceptance_by_position(
    provenance: torch.Tensor, draft_position: torch.Tensor, mask: torch.Tensor, max_position: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """Share of drafts accepted at each draft position (accepted or relaxed / verified there).

    provenance, draft_position, mask: [N, T]. A token at draft position i that is ACCEPTED or RELAXED
    means draft i passed; RESAMPLED at i means draft i was rejected; BONUS tokens verify no draft.
    Returns (rate [max_position], {"acceptance_pos_{i}": rate}); NaN where no draft was verified at i.
    """
    prov = provenance.long()
    passed = mask & ((prov == Provenance.ACCEPTED) | (prov == Provenance.RELAXED))
    verified = passed | (mask & (prov == Provenance.RESAMPLED))
    pos = draft_position.long().clamp(0, max_position - 1)
    num = torch.zeros(max_position, dtype=torch.float64).index_add_(
        0, pos[verified], passed[verified].double()
    )
    den = torch.zeros(max_position, dtype=torch.float64).index_add_(
        0, pos[verified], torch.ones_like(pos[verified], dtype=torch.float64)
    )
    rate = torch.where(den > 0, num / den.clamp_min(1), torch.full_like(num, float("nan")))
    return rate, {f"acceptance_pos_{i}": float(r) for i, r in enumerate(rate.tolist())}


def is_lossy(rule: str, theta: float, relax_prob: float) -> bool:
    """True when the rule can emit a token strict verification would not (a biased rollout)."""
    return rule != "strict" and (rule == "mars_code" or (theta < 1.0 and relax_prob > 0.0))
