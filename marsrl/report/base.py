"""What every reader of an experiment shares: the error a bad input raises, what counts as a number and
an arm's before/after held-out comparison.

It imports nothing from the report, so that ``load`` (arm folders), ``wandb_read`` (wandb run folders),
``table`` and ``verdict`` stand on it without importing each other both ways.
"""

from __future__ import annotations

import math
from typing import Any


class ReportError(ValueError):
    """An input the report cannot use; the message is one line naming the file (and line)."""


def finite(value: Any) -> bool:
    """True for a real number that is not NaN or infinite (bools and None are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def learning(evaluation: dict | None) -> dict[str, dict]:
    """eval.json's ``comparison``: after − before on the same held-out problems for each evaluation
    setting ({"t1": {diff, ci_low, ci_high, p_two_sided, n, before, after, ...}, ...}); only the settings
    with a finite difference."""
    got = (evaluation or {}).get("comparison") or {}
    return {k: v for k, v in got.items() if isinstance(v, dict) and finite(v.get("diff"))}
