"""Test-wide settings: no hub access, tool caches inside a temporary folder, one torch thread.

One thread: the suite runs Ray actors and training beside each other on a 2-core machine, and an
oversubscribed second thread made a small training step 30x slower (17 s vs 0.5 s, measured).
"""

import os
import tempfile

import pytest
import torch

_TMP = tempfile.mkdtemp(prefix="marsrl-tests-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HOME", os.path.join(_TMP, "hf"))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_DIR", os.path.join(_TMP, "wandb"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(_TMP, "torch_extensions"))
torch.set_num_threads(1)
os.environ.setdefault("MARSRL_CACHE", os.path.join(_TMP, "marsrl-cache"))  # tiny worlds built once per run


@pytest.fixture(scope="session")
def ray_cluster():
    """The run's one local Ray cluster (tests/rollout and tests/integrations share it)."""
    from tests.rollout.helpers import start_ray, stop_ray

    start_ray()
    yield
    stop_ray()


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Workers built in-process set torch's thread count from their config; put it back after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
