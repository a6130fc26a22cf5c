"""GRPO advantages: each reward minus its group's mean, scaled by a standard deviation -- TRL 1.16's
``GRPOTrainer`` computation (``trl/trainer/grpo_trainer.py``, the ``sum_then_normalize`` branch,
lines 2759-2802 of 1.16.0) for one summed reward per completion.

As TRL: the mean is per group; std is NaN-aware and unbiased (Bessel's n - 1, ``trl.trainer.utils.nanstd``);
``eps`` is added to the std, not under a square root; a reward of NaN (unscorable) is left out of its
group's mean and std and gets advantage 0; with G = 1 the group std is 0.  Departure: TRL's logged
``frac_reward_zero_std`` with ``scale="batch"`` asks whether the batch std is 0; ``frac_zero_std_groups``
here always counts groups (a group with equal rewards gives no signal, whatever the scale).
"""

from __future__ import annotations

from typing import Literal

import torch

from .masked import to_floats

Scale = Literal["group", "batch", "none"]


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased std ignoring NaNs (NaN with fewer than two values), as ``trl.trainer.utils.nanstd``;
    over all of ``x`` when ``dim`` is None, else over ``dim`` (kept, size 1)."""
    if dim is None:
        return nanstd(x.reshape(-1), 0).reshape(())
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    bessel = (count / (count - 1)).where(count > 1, torch.nan)
    return (torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True) * bessel).sqrt()


def _by_group(r: torch.Tensor, group_std: torch.Tensor) -> torch.Tensor:
    return group_std


def _by_batch(r: torch.Tensor, group_std: torch.Tensor) -> torch.Tensor:
    """The std of every reward (0 for a single reward, as TRL), [1, 1]."""
    return nanstd(r).view(1, 1) if r.numel() > 1 else torch.zeros_like(r[:1, :1])


# scale -> the std the centred rewards [P, G] are divided by (None: not divided)
_SCALES = {"group": _by_group, "batch": _by_batch, "none": None}


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: Scale = "group", eps: float = 1e-4
) -> tuple[torch.Tensor, dict[str, float]]:
    """rewards [N] (N = P groups x G, each group's G completions consecutive) -> advantages [N].

    adv = (r - mean_group) / (std + eps), std the group's (``scale="group"``) or the batch's
    (``"batch"``); ``"none"``: r - mean_group.  Floating rewards keep their dtype (others become
    float32).  metrics: ``reward_mean``, ``reward_std`` (over all non-NaN rewards, unbiased) and
    ``frac_zero_std_groups`` (share of groups whose std is ~0, ``torch.isclose`` as TRL).
    """
    if scale not in _SCALES:
        raise ValueError(f"scale: unknown scale {scale!r}; one of {list(_SCALES)}")
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be [N] with N a multiple of group_size, got {tuple(rewards.shape)} "
            f"and group_size={group_size}"
        )
    r = rewards if rewards.is_floating_point() else rewards.float()
    r = r.view(-1, group_size)  # [P, G]
    # [P, 1]; 0 when G = 1 (TRL: "doesn't occur during training")
    group_std = nanstd(r, dim=1) if group_size > 1 else torch.zeros_like(r[:, :1])
    adv = r - torch.nanmean(r, dim=1, keepdim=True)
    if _SCALES[scale] is not None:
        adv = adv / (_SCALES[scale](r, group_std) + eps)
    adv = torch.nan_to_num(adv, nan=0.0).view(-1)
    zero = torch.isclose(group_std, torch.zeros_like(group_std)).float().mean()
    figures = {"reward_mean": torch.nanmean(r), "reward_std": nanstd(r), "frac_zero_std_groups": zero}
    return adv, to_floats(figures)
