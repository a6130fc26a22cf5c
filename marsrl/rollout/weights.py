"""Weights on their way from a trainer to rollout workers: a plain CPU state dict out of whatever the
trainer holds (a module, a wrapped module, a DeepSpeed ZeRO-3 engine whose parameters are sharded), and
loading one into a live model in place (storage kept, so views such as a drafter's shared embedding stay
valid).

For a transfer through the Ray object store, ``pack_state`` prepares exactly what a worker will load,
described by its ``StateSpec``: every tensor cast to the worker's dtype on the trainer's side (an fp32
trainer sends a bf16 worker half the bytes), the keys the worker would skip left out (a drafter's shared
embedding, the second name of a tied weight), and each tensor as a flat uint8 numpy view. Ray pickles
numpy arrays out of band (pickle protocol 5), so ``ray.put`` writes each buffer into the object store
once and an actor on the same node reads it there without a copy; torch tensors, by contrast, are
pickled by copy unless RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1 is set in the serialising process before
``import ray`` (ray_constants.py reads it once at import; the actors need nothing, their deserialiser
is named in the pickle). The packed form works whatever that variable says.

Leaves out: bucketed or collective (NCCL) transfer; on GPU a ``ray.util.collective`` broadcast from the
trainer's rank 0 could replace the object-store hop without changing these functions' contracts.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
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
    (``.module``), a DeepSpeed ZeRO-3 engine (gathered: call it on every rank) or a PackedState. Wrapper
    prefixes (``module.``, ``_orig_mod.``) are stripped from the keys."""
    if isinstance(weights, PackedState):
        return weights.tensors()
    return {key: tensor.to("cpu").contiguous() for key, tensor in _raw_state(weights).items()}


@dataclass(frozen=True)
class StateSpec:
    """What a module loads from a state dict, without its tensors (small; travels to the driver).

    shapes / dtypes: every key of the module's state dict but ``skip``; aliases: a tied name -> the first
    name of the same tensor (either may be sent alone); skip: names ignored when sent (a drafter's
    embedding shared with the target)."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    aliases: dict[str, str]
    skip: frozenset[str]

    def check(self, shapes: Mapping[str, tuple[int, ...]], what: str) -> None:
        """Keys (wrapper prefixes stripped, ``skip`` removed) and their shapes against the module's: the
        checks ``match_state`` makes, on shapes alone. Raises ValueError naming ``what`` and the keys."""
        sent = {k: tuple(v) for k, v in shapes.items() if k not in self.skip}
        groups = {self.aliases.get(k, k) for k in sent if k in self.shapes}
        unexpected = sorted(set(sent) - set(self.shapes))
        missing = sorted(k for k in self.shapes if k not in sent and self.aliases.get(k, k) not in groups)
        if unexpected or missing:
            raise ValueError(
                f"{what} weights do not match the model: missing {_short(missing)}, "
                f"unexpected {_short(unexpected)}"
            )
        wrong = [f"{k} {v} vs {self.shapes[k]}" for k, v in sent.items() if v != self.shapes[k]]
        if wrong:
            raise ValueError(f"{what} weights have wrong shapes (sent vs model): {_short(wrong)}")


def state_spec(module: nn.Module, skip=()) -> StateSpec:
    """The StateSpec of ``module``'s state dict (``skip``: names it ignores when sent)."""
    shapes, dtypes, aliases, first = {}, {}, {}, {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        if key in skip:
            continue
        shapes[key], dtypes[key] = tuple(tensor.shape), tensor.dtype
        if id(tensor) in first:
            aliases[key] = first[id(tensor)]
        else:
            first[id(tensor)] = key
    return StateSpec(shapes, dtypes, aliases, frozenset(skip))


@dataclass(frozen=True)
class PackedState:
    """A state dict ready for the object store: per key its dtype, its shape and its bytes as a flat
    uint8 numpy array (pickled out of band by Ray, read in place by the receiver). Build it with
    ``pack_state``; ``tensors()`` gives the name -> tensor dict back without copying."""

    dtypes: dict[str, torch.dtype]
    shapes: dict[str, tuple[int, ...]]
    buffers: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())

    def tensors(self) -> dict[str, torch.Tensor]:
        """Tensors viewing the buffers (read-only memory when they come from the object store: copy
        from them, never write into them)."""
        out = {}
        with warnings.catch_warnings():  # from_numpy warns on the object store's read-only buffers
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for key, buf in self.buffers.items():
                out[key] = torch.from_numpy(buf).view(self.dtypes[key]).reshape(self.shapes[key])
        return out


def pack_state(weights, spec: StateSpec, what: str) -> PackedState:
    """``weights`` (anything ``to_state_dict`` takes) as a PackedState of what ``spec``'s module loads:
    checked against the spec first (keys and shapes, ValueError naming ``what``), names in ``spec.skip``
    and tied aliases whose first name is present dropped, each tensor cast to the module's dtype for its
    key (on the trainer's device, before the copy to the CPU) and made contiguous. A CPU tensor already
    in that dtype is not copied: its buffer views the trainer's memory until ``ray.put`` copies it."""
    state = {k: v for k, v in _raw_state(weights).items() if k not in spec.skip}
    spec.check({k: tuple(v.shape) for k, v in state.items()}, what)
    dtypes, shapes, buffers = {}, {}, {}
    for key, tensor in state.items():
        first = spec.aliases.get(key)
        if first is not None and first in state:
            continue  # the same tensor goes under its first name
        tensor = tensor.to(spec.dtypes[key]).to("cpu").contiguous()
        dtypes[key], shapes[key] = tensor.dtype, tuple(tensor.shape)
        buffers[key] = tensor.reshape(-1).view(torch.uint8).numpy()
    return PackedState(dtypes, shapes, buffers)


def match_state(module: nn.Module, state: Mapping[str, torch.Tensor], what: str, skip=()) -> list[tuple]:
    """Pair every tensor of ``state`` with the module's tensor it will overwrite, checking first: keys
    must match the module's state dict exactly, except names in ``skip`` (ignored if sent) and a tied
    alias whose twin was sent; shapes must agree. Raises ValueError naming ``what`` and the keys."""
    state = {_strip(k): v for k, v in state.items() if _strip(k) not in skip}
    state_spec(module, skip).check({k: tuple(v.shape) for k, v in state.items()}, what)
    own = module.state_dict(keep_vars=True)
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


def _raw_state(weights) -> dict[str, torch.Tensor]:
    """Detached name -> tensor from a Mapping, a (wrapped) module or a ZeRO-3 engine, on the device they
    live on, wrapper prefixes stripped."""
    if isinstance(weights, Mapping):
        state = dict(weights)
    else:
        module = getattr(weights, "module", weights)
        if not isinstance(module, nn.Module):
            raise TypeError(
                "weights must be a state dict, an nn.Module, a DeepSpeed engine or a PackedState, "
                f"got {type(weights).__name__}"
            )
        state = gather_zero3_state_dict(module) if is_zero3(module) else module.state_dict()
    out = {}
    for key, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {key!r} is a {type(tensor).__name__}, not a tensor")
        out[_strip(key)] = tensor.detach()
    return out


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
