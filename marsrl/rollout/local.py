"""``LocalPool``: the ``RolloutPool`` interface over one in-process ``RolloutWorker`` (no Ray).

For a single-process trainer, debugging, and tests that need the exact pool contract without a
cluster: ``generate`` / ``update_weights`` / ``last_batch`` / ``info`` / ``shutdown`` behave as the Ray
pool's with one actor (one request per call, trajectories stamped with the version)."""

from __future__ import annotations

import contextlib
import time

from ..engine import SamplingParams
from ..prompts import check_prompts
from .config import WorkerConfig
from .pool import batch_metrics
from .requests import plan_requests
from .worker import RolloutWorker


class LocalPool:
    """One RolloutWorker in this process behind the RolloutPool interface.

    Args:
        config: the worker's config (models, engine); ``target`` / ``drafter``: already-built modules
            (taken over: ``update_weights`` writes into them).
    """

    def __init__(self, config: WorkerConfig | None = None, *, target=None, drafter=None):
        with outside_zero3():
            self.worker = RolloutWorker(config, target=target, drafter=drafter)
        self.info = self.worker.info()
        self.version = 0
        self._last: dict = {}

    def generate(self, prompt_ids, sampling: SamplingParams | None = None):
        sampling = sampling or SamplingParams()
        prompts = check_prompts(prompt_ids, self.info["vocab_size"], self.info["max_seq_len"])
        start = time.perf_counter()
        trajs = self.worker.generate(plan_requests(prompts, sampling, num_requests=1))
        self._last = batch_metrics(trajs, time.perf_counter() - start)
        return trajs

    def update_weights(self, policy=None, draft=None, version: int | None = None) -> dict:
        out = self.worker.update_weights(policy, draft, version)
        self.version = out["version"]
        return out

    @property
    def last_batch(self) -> dict:
        return dict(self._last, version=self.version)

    def shutdown(self) -> None:
        """Nothing to release (the pool interface's lifetime call)."""


@contextlib.contextmanager
def outside_zero3():
    """Load the rollout models whole: a ZeRO-3 trainer config built earlier in this process would
    otherwise make ``from_pretrained`` partition them (transformers' global DeepSpeed config)."""
    try:
        from transformers.integrations import deepspeed as hf_ds
    except ImportError:  # transformers without its DeepSpeed integration
        yield
        return
    saved = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved
