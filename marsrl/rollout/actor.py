"""``RolloutActor``: the Ray actor around a RolloutWorker. Every method is a one-line delegation; all
logic lives in the plain class (``worker.py``), and the resources an actor gets (CPUs, GPUs, placement)
are chosen by the pool from ``PoolConfig`` through ``.options(...)``, never written here."""

from __future__ import annotations

import ray

from .config import WorkerConfig
from .worker import RolloutWorker


class _RolloutShell:
    """Holds one RolloutWorker in the actor's process. ``target`` / ``drafter``: modules or ``propose``
    objects (or None), resolved by Ray from object refs before the constructor runs; ``num_gpus``: the
    GPUs this actor was given (the worker resolves its device from it)."""

    def __init__(self, config: WorkerConfig, target=None, drafter=None, num_gpus: float | None = None):
        self.worker = RolloutWorker(config, target=target, drafter=drafter, num_gpus=num_gpus)

    def info(self) -> dict:
        return self.worker.info()

    def generate(self, requests, expect_version=None):
        return self.worker.generate(requests, expect_version=expect_version)

    def update_weights(self, policy=None, draft=None, version=None) -> dict:
        return self.worker.update_weights(policy, draft, version=version)

    def weight_spec(self) -> dict:
        return self.worker.weight_spec()

    def sleep(self, level: int = 1) -> dict:
        return self.worker.sleep(level)

    def wake(self) -> dict:
        return self.worker.wake()

    def stats(self) -> dict:
        return self.worker.stats()


RolloutActor = ray.remote(_RolloutShell)
