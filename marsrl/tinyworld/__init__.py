"""The embedded CPU world: task, tokenizer, tiny target and trained EAGLE-3 head (see ``build.py``)."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .build import PRESETS, TinyWorldConfig, build_tinyworld, load_tinyworld, world_dir

__all__ = ["PRESETS", "TinyWorldConfig", "build_tinyworld", "load_tinyworld", "world_dir"]
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, ".build"))
