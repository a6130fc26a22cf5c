"""Counting the operations that force a device -> host sync on a GPU, on any device.

A ``TorchFunctionMode`` sees every tensor method and torch function; the ones below return host values
(or data-dependent shapes), so on CUDA each waits for the queued work (``numpy()`` needs a host tensor
first, so it is never the sync itself).  Host -> device copies of host
tensors count too (``.to`` / ``torch.tensor(..., device=)`` from the host: synchronous unless pinned)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.cpu,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.equal,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.Tensor.unique,
    torch.unique,
    torch.masked_select,
    torch.Tensor.masked_select,
}


class SyncCounter(TorchFunctionMode):
    """Counts sync-forcing calls on tensors (``count``) and names them (``where``)."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.where: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READS:
            self._hit(getattr(func, "__name__", str(func)))
        elif func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor):
            targets = (*args[1:], kwargs.get("device"))
            dev = next((a for a in targets if isinstance(a, (str, torch.device))), None)
            if dev is not None and torch.device(dev).type == "cpu" and args[0].device.type != "cpu":
                self._hit("to(cpu)")
        return func(*args, **kwargs)

    def _hit(self, name: str) -> None:
        self.count += 1
        self.where[name] = self.where.get(name, 0) + 1
