"""Test-wide settings: no hub access, tool caches inside a temporary folder."""

import os
import tempfile

_TMP = tempfile.mkdtemp(prefix="marsrl-tests-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HOME", os.path.join(_TMP, "hf"))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_DIR", os.path.join(_TMP, "wandb"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(_TMP, "torch_extensions"))
