"""Rollouts on Ray: ``RolloutWorker`` (a plain class owning a SpeculativeEngine), ``RolloutActor`` (its
Ray shell) and ``RolloutPool`` (N actors, weight sync with versions, fault tolerance).

Using the pool from any trainer (no TRL needed)::

    from marsrl.engine import SamplingParams
    from marsrl.rollout import PoolConfig, RolloutPool, WorkerConfig

    pool = RolloutPool(PoolConfig(worker=WorkerConfig(target="path/or/hub-id", drafter="eagle3/head"),
                                  num_actors=2))
    for step in range(steps):
        trajs = pool.generate(prompt_ids, SamplingParams(n=8, max_new_tokens=256, seed=step))
        # trajs[i * 8 : (i + 1) * 8] are prompt i's group; each has completion_ids, behavior_logprobs
        # (the probability the rollout REALLY emitted each token), provenance, policy_version ...
        loss = ...  # your loss, with exp(logp_policy - behavior_logprobs) as the importance ratio
        pool.update_weights(model, draft=drafter)   # once per step; trajectories then carry version + 1
    pool.shutdown()

``recipes/grpo_plain.py`` is a complete GRPO loop written this way.
"""

from ..prompts import check_prompts
from .actor import RolloutActor
from .config import PoolConfig, WorkerConfig
from .local import LocalPool
from .placement import resolve_device
from .pool import RolloutError, RolloutPool, batch_metrics
from .requests import RolloutRequest, plan_requests, request_seed
from .weights import (
    PackedState,
    StateSpec,
    gather_zero3_state_dict,
    load_weights_,
    pack_state,
    state_spec,
    to_state_dict,
)
from .worker import RolloutWorker, check_drafter_matches

__all__ = [
    "LocalPool",
    "PackedState",
    "PoolConfig",
    "RolloutActor",
    "RolloutError",
    "RolloutPool",
    "RolloutRequest",
    "RolloutWorker",
    "StateSpec",
    "WorkerConfig",
    "batch_metrics",
    "check_drafter_matches",
    "check_prompts",
    "gather_zero3_state_dict",
    "load_weights_",
    "pack_state",
    "plan_requests",
    "request_seed",
    "resolve_device",
    "state_spec",
    "to_state_dict",
]
