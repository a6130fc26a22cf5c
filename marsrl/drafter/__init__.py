"""EAGLE-3 draft head: the target-feature taps, the one-layer head with its KV cache, and loading /
saving the published checkpoint layouts.  The draft tree / chain loop lives in the engine; training
(training-time test) lives elsewhere.
"""

from .config import Eagle3Config
from .eagle3 import Eagle3Drafter, build_vocab_maps
from .taps import FeatureTap, default_aux_layer_ids

__all__ = ["Eagle3Config", "Eagle3Drafter", "FeatureTap", "build_vocab_maps", "default_aux_layer_ids"]
