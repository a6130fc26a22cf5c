"""EAGLE-3 draft head: the target-feature taps, the one-layer head with its KV cache, loading / saving the
published checkpoint layouts, and training (training-time test, offline and online refresh) in
``train.py``.  The draft tree / chain loop lives in the engine.
"""

from .config import Eagle3Config
from .eagle3 import Eagle3Drafter, build_vocab_maps
from .taps import FeatureTap, default_aux_layer_ids
from .train import (
    DraftBatch,
    DraftTrainer,
    ResumeError,
    capture_batch,
    refresh_draft,
    select_draft_vocab,
    train_offline,
    ttt_loss,
)

__all__ = [
    "DraftBatch",
    "DraftTrainer",
    "Eagle3Config",
    "Eagle3Drafter",
    "FeatureTap",
    "ResumeError",
    "build_vocab_maps",
    "capture_batch",
    "default_aux_layer_ids",
    "refresh_draft",
    "select_draft_vocab",
    "train_offline",
    "ttt_loss",
]
