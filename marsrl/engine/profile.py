"""Phase profiling of the decode loop (``EngineConfig(profile=True)``), behind one hook.

The loop wraps each phase of a round in ``with phase("draft"):`` and never asks whether profiling is on:
``PhaseClock`` synchronises the device around the phase and adds its seconds to ``stats["time"]`` (and a
target forward's, by width, to ``stats["forward_by_width"]``); ``NO_PHASES`` does nothing and reads no
clock, so an unprofiled round has no extra device syncs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

PHASES = ("prefill", "draft", "target_forward", "verify", "commit", "record")


class PhaseClock:
    """Times phases into ``totals`` (the engine's stats of one call), device-synchronised on CUDA."""

    def __init__(self, totals: dict, device: torch.device):
        self.totals, self.device = totals, device
        totals.update(time=dict.fromkeys(PHASES, 0.0), forward_by_width={})

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def __call__(self, phase: str, width: int | None = None, rows: int = 0) -> Iterator[None]:
        """Time one ``phase``; ``width`` (a target forward's tokens a row) and ``rows`` also count the
        forward under ``forward_by_width``."""
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        dt = time.perf_counter() - t0
        self.totals["time"][phase] += dt
        if width is not None:
            entry = self.totals["forward_by_width"].setdefault(str(width), dict(calls=0, seconds=0.0, rows=0))
            entry["calls"] += 1
            entry["seconds"] += dt
            entry["rows"] += rows


class _NoPhases:
    _nothing = contextlib.nullcontext()

    def __call__(self, phase: str, width: int | None = None, rows: int = 0) -> contextlib.nullcontext:
        return self._nothing


NO_PHASES = _NoPhases()
"""The hook when profiling is off: every phase is a shared no-op context."""
