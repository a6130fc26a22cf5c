"""Attention implementations the engine refuses (``attention.py``)."""

import pytest

from marsrl.engine import SpeculativeEngine
from marsrl.testing import tiny_causal_lm


def test_flash_attention_targets_are_refused():
    model = tiny_causal_lm("qwen3", vocab=64, layers=2)
    model.config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(ValueError, match=r"attn_implementation='flash_attention_2'.*sdpa"):
        SpeculativeEngine(model, None)
