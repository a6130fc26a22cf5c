"""The trainer: MARS-aware GRPO on TRL (``MarsGRPOConfig``, ``MarsGRPOTrainer``).

Nothing below this package imports it: the verification core, the engine, the rollout pool and
``marsrl.algo`` stand without it."""

from .config import IS_CORRECTIONS, MarsGRPOConfig
from .trainer import MarsGRPOTrainer

__all__ = ["IS_CORRECTIONS", "MarsGRPOConfig", "MarsGRPOTrainer"]
