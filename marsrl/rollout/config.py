"""Rollout worker and pool settings: the one place their defaults live. Invariants fail at construction,
naming the field to change. ``PoolConfig.from_dict`` builds the nested config from YAML-style mappings
(unknown keys are errors)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ..config import ConfigError, build_config
from ..engine import EngineConfig, TreeConfig

Device = Literal["auto", "cpu", "cuda"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


@dataclass(frozen=True)
class WorkerConfig:
    """What one rollout worker loads and how its engine runs."""

    target: str | None = None  # folder or hub id of the policy (None: a module is passed in code)
    drafter: str | None = None  # EAGLE-3 head folder or hub id; None: plain sampling (or a module in code)
    engine: EngineConfig = field(default_factory=EngineConfig)
    device: Device = "auto"  # "auto": cuda when available, else cpu (in a pool with 0 GPUs per actor: cpu)
    dtype: Dtype = "auto"  # "auto": the checkpoint's (or the module's) dtype
    torch_threads: int | None = None  # torch.set_num_threads in the worker's process; None: leave as is

    def __post_init__(self):
        if not isinstance(self.engine, EngineConfig):
            raise ValueError(f"engine must be an EngineConfig, got {type(self.engine).__name__}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto / float32 / bfloat16 / float16, got {self.dtype!r}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be None or >= 1, got {self.torch_threads}")


@dataclass(frozen=True)
class PoolConfig:
    """How many rollout actors run, what each may use, and how a batch is cut into requests."""

    worker: WorkerConfig = field(default_factory=WorkerConfig)
    num_actors: int = 1
    num_cpus_per_actor: float = 1.0  # Ray resources of each actor (fractions allowed)
    # 0: the actors run on the CPU (device "auto" resolves there; "cuda" is refused at pool start);
    # 0 < g < 1: each actor may allocate that share of its GPU's memory
    num_gpus_per_actor: float = 0.0
    placement_strategy: Strategy | None = "PACK"  # one placement-group bundle per actor; None: no group
    address: str | None = None  # a running cluster ("auto", "ray://host:port") if Ray is not started yet
    prompts_per_request: int | None = None  # None: one request per actor; else fixed-size requests
    max_attempts: int = 3  # tries per request when its actor dies (a Python error is never retried)
    start_timeout_s: float = 600.0  # actors and placement group must be ready within this
    # a request with no result this long after dispatch is treated as a dead actor: the actor is killed
    # and replaced (latest weights) and the request re-run, as one of its max_attempts; None: no timeout
    request_timeout_s: float | None = None

    def __post_init__(self):
        if not isinstance(self.worker, WorkerConfig):
            raise ValueError(f"worker must be a WorkerConfig, got {type(self.worker).__name__}")
        if self.num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {self.num_actors}")
        if self.num_cpus_per_actor < 0 or self.num_gpus_per_actor < 0:
            raise ValueError("num_cpus_per_actor and num_gpus_per_actor must be >= 0")
        if self.placement_strategy not in (None, "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(
                "placement_strategy must be None, PACK, SPREAD, STRICT_PACK or STRICT_SPREAD, "
                f"got {self.placement_strategy!r}"
            )
        if self.prompts_per_request is not None and self.prompts_per_request < 1:
            raise ValueError(f"prompts_per_request must be None or >= 1, got {self.prompts_per_request}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not self.start_timeout_s > 0:
            raise ValueError(f"start_timeout_s must be > 0, got {self.start_timeout_s}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(
                f"request_timeout_s must be None (no timeout) or > 0, got {self.request_timeout_s}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "pool config") -> PoolConfig:
        """Nested mappings (``worker: {engine: {tree: {...}}}``) onto the defaults; unknown keys raise."""
        values = dict(values)
        worker = dict(values.pop("worker", None) or {})
        engine = dict(worker.pop("engine", None) or {})
        tree = engine.pop("tree", None)
        if tree is not None:
            if not isinstance(tree, dict):
                raise ConfigError(f"{where}: worker.engine.tree must be a mapping")
            engine["tree"] = build_config(TreeConfig, tree, f"{where} (worker.engine.tree)")
        eng = _build(EngineConfig, engine, f"{where} (worker.engine)")
        wrk = _build(WorkerConfig, worker, f"{where} (worker)", engine=eng)
        return _build(cls, values, where, worker=wrk)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (for wandb configs and logs)."""
        return dataclasses.asdict(self)


def _build(cls, values: dict[str, Any], where: str, **objects):
    """build_config for the scalar fields, then attach already-built nested configs."""
    cfg = build_config(cls, values, where)
    return dataclasses.replace(cfg, **objects) if objects else cfg
