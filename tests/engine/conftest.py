import pytest

from marsrl.testing import tiny_causal_lm


def tiny_target(family: str = "qwen3", vocab: int = 64, layers: int = 6, seed: int = 0):
    return tiny_causal_lm(family, vocab=vocab, layers=layers, seed=seed)


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def target(request):
    return tiny_target(request.param)


@pytest.fixture(scope="module")
def small():
    """A V = 8 target for exact-distribution tests."""
    return tiny_target("qwen3", vocab=8, layers=4, seed=1)


@pytest.fixture(scope="module")
def qwen():
    """A V = 64, 4-layer Qwen3 with room for long prompts (the cache and planner tests)."""
    return tiny_causal_lm("qwen3", vocab=64, layers=4, max_positions=1200, seed=0)
