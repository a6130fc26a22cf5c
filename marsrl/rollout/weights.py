"""Weights on their way from a trainer to rollout workers: a plain CPU state dict out of whatever the
trainer holds (a module, a wrapped module, a DeepSpeed ZeRO-3 engine whose parameters are sharded), and
loading one into a live model in place (storage kept, so views such as a drafter's shared embedding stay
valid).

Leaves out: bucketed or collective (NCCL) transfer; on GPU a ``ray.util.collective`` broadcast from the
trainer's rank 0 could replace the object-store hop without changing these functions' contracts.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / DeepSpeed, torch.compile


def is_zero3(module: nn.Module) -> bool:
    """True when DeepSpeed ZeRO-3 has partitioned this module's parameters."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def gather_zero3_state_dict(model_engine, *, rank0_only: bool = False) -> dict[str, torch.Tensor] | None:
    """The full state dict of a ZeRO-3 model (a DeepSpeed engine or its ``.module``), on the CPU.

    A collective: EVERY rank must call it (each parameter is all-gathered in turn, so the peak extra
    memory is one parameter). Returns the dict on every rank, or only on rank 0 when ``rank0_only``
    (None elsewhere). Tied parameters appear under each of their names, sharing one tensor. Works for a
    module that is not partitioned too (it is then a CPU copy of ``state_dict``).
    """
    import deepspeed
    import torch.distributed as dist

    module = getattr(model_engine, "module", model_engine)
    keep = not rank0_only or not dist.is_initialized() or dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    done: dict[int, torch.Tensor] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) in done:  # a tied alias: gather once
            out[name] = done[id(tensor)]
            continue
        if hasattr(tensor, "ds_id"):
            with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
                full = tensor.detach().to("cpu", copy=True) if keep else None
        else:
            full = tensor.detach().to("cpu", copy=True) if keep else None
        done[id(tensor)] = full
        out[name] = full
    return out if keep else None


def to_state_dict(weights) -> dict[str, torch.Tensor]:
    """A CPU, contiguous, detached name -> tensor dict from a Mapping, an nn.Module, a wrapped module
    (``.module``) or a DeepSpeed ZeRO-3 engine (gathered: call it on every rank). Wrapper prefixes
    (``module.``, ``_orig_mod.``) are stripped from the keys."""
    if isinstance(weights, Mapping):
        state = dict(weights)
    else:
        module = getattr(weights, "module", weights)
        if not isinstance(module, nn.Module):
            raise TypeError(
                "weights must be a state dict, an nn.Module or a DeepSpeed engine, "
                f"got {type(weights).__name__}"
            )
        state = gather_zero3_state_dict(module) if is_zero3(module) else module.state_dict()
    out = {}
    for key, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {key!r} is a {type(tensor).__name__}, not a tensor")
        out[_strip(key)] = tensor.detach().to("cpu").contiguous()
    return out


def match_state(module: nn.Module, state: Mapping[str, torch.Tensor], what: str, skip=()) -> list[tuple]:
    """Pair every tensor of ``state`` with the module's tensor it will overwrite, checking first: keys
    must match the module's state dict exactly, except names in ``skip`` (ignored if sent) and a tied
    alias whose twin was sent; shapes must agree. Raises ValueError naming ``what`` and the keys."""
    own = {k: v for k, v in module.state_dict(keep_vars=True).items() if k not in skip}
    state = {_strip(k): v for k, v in state.items() if _strip(k) not in skip}
    sent_ids = {id(own[k]) for k in state if k in own}
    unexpected = sorted(set(state) - set(own))
    missing = sorted(k for k in own if k not in state and id(own[k]) not in sent_ids)
    if unexpected or missing:
        raise ValueError(
            f"{what} weights do not match the model: missing {_short(missing)}, "
            f"unexpected {_short(unexpected)}"
        )
    wrong = [
        f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items() if v.shape != own[k].shape
    ]
    if wrong:
        raise ValueError(f"{what} weights have wrong shapes (sent vs model): {_short(wrong)}")
    return [(own[k], v) for k, v in state.items()]


def copy_pairs_(pairs: list[tuple]) -> int:
    """Copy each source into its destination in place (dtype / device cast on the way); returns bytes."""
    copied = 0
    with torch.no_grad():
        for dest, src in pairs:
            dest.copy_(src)
            copied += src.numel() * src.element_size()
    return copied


def load_weights_(module: nn.Module, state: Mapping[str, torch.Tensor], what: str, skip=()) -> int:
    """``match_state`` then ``copy_pairs_``: all checks pass before any tensor is written. Storage is
    kept, so views of the module's tensors (a drafter's shared embedding) see the new values."""
    return copy_pairs_(match_state(module, state, what, skip))


def _strip(key: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        while key.startswith(prefix):
            key = key[len(prefix) :]
    return key


def _short(keys: list[str], limit: int = 6) -> str:
    if not keys:
        return "none"
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more
