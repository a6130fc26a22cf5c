"""Fixtures of the rollout tests: the session's one Ray cluster, torch's thread count restored after
every test (workers built in-process set it from their config)."""

import os

import pytest
import torch

from tests.rollout.helpers import start_ray, stop_ray

os.environ.setdefault("HF_HUB_OFFLINE", "1")


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
