"""The speculative rollout engine: batched chain / tree drafting over Hugging Face targets, verified by
``marsrl.verify`` with a per-token record."""

from ..trajectory import Trajectory  # re-exported: it lives in marsrl.trajectory (no engine needed)
from .config import EngineConfig, SamplingParams, TreeConfig
from .engine import SpeculativeEngine
from .oracle import OracleDrafter

__all__ = ["EngineConfig", "OracleDrafter", "SamplingParams", "SpeculativeEngine", "Trajectory", "TreeConfig"]
