"""The embedded CPU world: task, tokenizer, tiny target and trained EAGLE-3 head (see ``build.py``)."""

from .build import PRESETS, TinyWorldConfig, build_tinyworld, load_tinyworld, world_dir

__all__ = ["PRESETS", "TinyWorldConfig", "build_tinyworld", "load_tinyworld", "world_dir"]
