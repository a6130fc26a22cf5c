"""Importance weights pi / b for tokens sampled from a behaviour distribution b, in TRL 1.16's
``vllm_importance_sampling_mode`` variants plus the exact, untruncated sequence weight.

TRL (``trl/trainer/grpo_trainer.py`` 1.16.0, lines 2660-2707) computes, with ``old`` the trainer's
log-probs and ``sampling`` the rollout's:
    d = nan_to_num((old - sampling) * mask, nan=0)   per token; a NaN log-prob gives ratio 1
    token_*:    r = exp(d)                           [N, T]
    sequence_*: r = exp(sum_t d)                     [N, 1], applied to every token of the sequence
    *_truncate: r = clamp(r, clip_min, clip_max)     a None bound is no bound
    *_mask:     r = 0 where r < clip_min or r > clip_max
and its logged ``importance_sampling_ratio/{min,mean,max}`` are over unmasked tokens (token modes) or
over all sequences (sequence modes, lines 2875-2878).  The weights here are those values, except that
masked positions get 0 (TRL leaves 1 there and masks in the loss).  ``"sequence"`` is exp(sum_t d)
unclipped: the exact sequence importance weight, unbiased and of unbounded variance; ``"none"`` is 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch

from .masked import masked_max, masked_mean, masked_min, to_floats

Mode = Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "sequence"]


def _per_token(d: torch.Tensor) -> torch.Tensor:
    return d  # [N, T]


def _per_sequence(d: torch.Tensor) -> torch.Tensor:
    return d.sum(dim=-1, keepdim=True)  # [N, 1]


def _ones(r: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return torch.ones_like(r)


def _keep(r: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return r


def _truncate(r: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return r.clamp(min=None if lo == -math.inf else lo, max=None if hi == math.inf else hi)


def _zero_outside(r: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return r.masked_fill((r < lo) | (r > hi), 0.0)


# mode -> (the unit a ratio is taken over, what happens to ratios outside [clip_min, clip_max])
_MODES: dict[str, tuple[Callable, Callable]] = {
    "none": (_per_token, _ones),
    "token_truncate": (_per_token, _truncate),
    "token_mask": (_per_token, _zero_outside),
    "sequence_truncate": (_per_sequence, _truncate),
    "sequence_mask": (_per_sequence, _zero_outside),
    "sequence": (_per_sequence, _keep),
}
_BOUNDED = (_truncate, _zero_outside)


def importance_weights(
    policy_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: Mode = "token_truncate",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weights [N, T] from the policy's and the behaviour's log-probs [N, T] of the emitted tokens.

    ``mask`` [N, T] marks completion tokens; masked positions get weight 0 whatever they hold (also
    -inf or NaN).  ``clip_min`` / ``clip_max`` bound the ratio in the ``*_truncate`` / ``*_mask`` modes
    (None: unbounded on that side; a truncate mode needs at least one).  metrics: ``is_ratio_mean`` /
    ``_min`` / ``_max`` of the returned ratios over unmasked tokens (token modes) or over all N
    sequences (sequence modes), 0.0 when there are none (as TRL); ``clipped_frac``: share of those
    units whose ratio fell outside [clip_min, clip_max] (0 in ``none`` and ``sequence``).
    """
    if mode not in _MODES:
        raise ValueError(f"mode: unknown importance-weight mode {mode!r}; one of {list(_MODES)}")
    if clip_min is not None and clip_max is not None and clip_max <= clip_min:
        raise ValueError(f"clip_max ({clip_max}) must be greater than clip_min ({clip_min})")
    unit, bound = _MODES[mode]
    if bound is _truncate and clip_min is None and clip_max is None:
        raise ValueError(f"mode {mode!r} truncates: set clip_min or clip_max (or both)")
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    m = mask.bool()
    d = torch.nan_to_num((policy_logp - behavior_logp) * m, nan=0.0)  # TRL: NaN (also -inf * 0) -> 0
    raw = torch.exp(unit(d))  # [N, T] or [N, 1]
    ratio = bound(raw, lo, hi)
    weights = torch.where(m, ratio.expand_as(m), 0.0)
    units = m if unit is _per_token else torch.ones_like(raw, dtype=torch.bool)
    outside = ((raw < lo) | (raw > hi)) if bound in _BOUNDED else torch.zeros_like(units)
    some = units.any()  # TRL reports 0.0 for an empty batch
    figures = {
        "is_ratio_mean": masked_mean(ratio, units).where(some, 0.0),
        "is_ratio_min": masked_min(ratio, units).where(some, 0.0),
        "is_ratio_max": masked_max(ratio, units).where(some, 0.0),
        "clipped_frac": masked_mean(outside.float(), units).where(some, 0.0),
    }
    return weights, to_floats(figures)
