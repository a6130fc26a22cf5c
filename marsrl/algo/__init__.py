"""The RL algorithm's arithmetic as pure tensor functions: the policy's teacher-forced token statistics,
GRPO group advantages, importance weights (TRL's modes and the exact one) and the top-1 / top-2 bias
figures.  torch only -- no models, no Ray, no TRL, no logging: each function returns
``(value, metrics)`` with metrics a dict of Python floats, computed with a host sync or two.

Shapes: N sequences, T completion positions, V vocabulary, H hidden size, G group size.  Every
function has a slow loop reference in ``tests/algo`` that the vectorised version is tested against.
"""

from .advantages import Scale, group_advantages
from .bias import bias_metrics
from .importance import Mode, importance_weights
from .intervals import wilson_interval
from .logprobs import STAT_KEYS, token_stats

__all__ = [
    "STAT_KEYS",
    "Mode",
    "Scale",
    "bias_metrics",
    "group_advantages",
    "importance_weights",
    "token_stats",
    "wilson_interval",
]
