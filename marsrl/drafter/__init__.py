"""EAGLE-3 draft head: the target-feature taps, the one-layer head with its KV cache, loading / saving the
published checkpoint layouts, and training (training-time test, offline and online refresh) in
``train.py``.  The draft tree / chain loop lives in the engine.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
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
_FROM = {"Eagle3Config": ".config", "Eagle3Drafter": ".eagle3", "build_vocab_maps": ".eagle3"}
_FROM.update(FeatureTap=".taps", default_aux_layer_ids=".taps")
__getattr__, __dir__ = lazy_exports(__name__, {n: _FROM.get(n, ".train") for n in __all__})
