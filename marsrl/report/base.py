"""What every reader of an experiment shares: the error a bad input raises and what counts as a number.

It imports nothing from the report, so that both ``load`` (arm folders) and ``wandb_read`` (wandb run
folders) stand on it without importing each other both ways.
"""

from __future__ import annotations

import math
from typing import Any


class ReportError(ValueError):
    """An input the report cannot use; the message is one line naming the file (and line)."""


def finite(value: Any) -> bool:
    """True for a real number that is not NaN or infinite (bools and None are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
