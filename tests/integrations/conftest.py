"""Fixtures of the integration tests: the same session-wide Ray cluster as tests/rollout (start_ray is
idempotent, so the two fixture definitions share one cluster)."""

import os

import pytest
import torch

from tests.rollout.helpers import start_ray, stop_ray

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="session")
def ray_cluster():
    start_ray()
    yield
    stop_ray()


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
