"""Adaptive speculation (``EngineConfig(num_draft_tokens="auto", max_draft_tokens=K)``): each round the
engine drafts the k in {0, ..., K} that maximises expected tokens per second for the live batch,

    k* = argmax_k  rows * E[tokens | k] / t_round(rows, k, width)

    E[tokens | k] = 1 + sum_{j=1..k} prod_{i<=j} a_i        (a_i: P(draft i accepted | drafts < i were))

k = 0 is a plain step (one target forward, no drafter: the drafter absorbs the run's pairs with the next
speculative round, every one of them or each row's last ``EngineConfig.drafter_window``).

- ``costs.py``: t_round, a ``CostModel`` measured on the engine's own models (whole rounds timed at each
  k over a grid of live batch sizes, so drafting, verification and the host's bookkeeping are all in
  it) and taken at the round's context (each slot of cache width adds a cost, a line in k).  Later
  calls set each batch size's level, all k alike, never the ratios between k's.
- ``acceptance.py``: the a_i, running estimates from the current call's rounds (``AcceptanceEstimates``)
  and from the rows still live (``RowAcceptance``), each row's tokens capped by what it may still make.
- ``speed.py``: the workload's check on the one ratio the calibration can get wrong where it decides,
  speculative rounds against plain steps (``SpeedCheck``), and the price of the pairs a switch from
  plain steps to drafting owes the drafter.
- ``planner.py``: ``KPlanner`` (the choice, with exploration: a probe after a run of plain steps, and
  every ``explore_every``-th speculative round past the best k), ``FixedK``, ``CycleK`` (the
  calibration's plan) and ``Carried`` (what one call's planner hands the next).
- ``calibration.py``: the measuring of a ``CostModel`` on an engine.

With ``EngineConfig(adapt_costs=False)`` nothing is carried between calls and the clock is never read,
so the choice is a pure function of the cost model, the call's own outcomes and its seed.  Exactness
does not depend on k: every round is verified by the same rule, and a chain of any length (0 included)
is lossless under strict.  Left out: per-row k (the target forward's width is the batch's largest k
anyway), trees.  The design in full: docs/engine.md.
"""

from .acceptance import AcceptanceEstimates, RowAcceptance
from .costs import CostModel, context_line, context_slope, lower_quartile, nearest_size
from .planner import Carried, CycleK, FixedK, KPlanner, Lengths
from .speed import SpeedCheck

__all__ = [
    "AcceptanceEstimates",
    "Carried",
    "CostModel",
    "CycleK",
    "FixedK",
    "KPlanner",
    "Lengths",
    "RowAcceptance",
    "SpeedCheck",
    "context_line",
    "context_slope",
    "lower_quartile",
    "nearest_size",
]
