"""Test-wide settings: no hub access, tool caches inside a temporary folder, one torch thread.

One thread: the suite runs Ray actors and training beside each other on a 2-core machine, and an
oversubscribed second thread made a small training step 30x slower (17 s vs 0.5 s, measured).

Parallel: ``pytest -q`` runs on pytest-xdist workers (``-n auto``, capped below), one torch thread
each. The settings above are made in the controller before the workers start, so all workers share
one cache: a tiny world is built once (under a file lock) and reused. Scheduling is by
``xdist_group``: every test that uses the Ray cluster runs on one worker (one cluster per run), and
every other module stays whole on one worker, so that its module-scoped fixtures are built once and
its tests run in file order (the DeepSpeed launches among them, one at a time). ``pytest -n 0`` runs
the suite in one process.
"""

import atexit
import os
import shutil
import tempfile

import pytest
import torch

if "MARSRL_TESTS_TMP" in os.environ:  # an xdist worker: the controller's folder (inherited env)
    _TMP = os.environ["MARSRL_TESTS_TMP"]
else:  # the run's first process makes the folder and removes it at exit
    _TMP = os.environ["MARSRL_TESTS_TMP"] = tempfile.mkdtemp(prefix="marsrl-tests-")
    atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HOME", os.path.join(_TMP, "hf"))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_DIR", os.path.join(_TMP, "wandb"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(_TMP, "torch_extensions"))
torch.set_num_threads(1)
os.environ.setdefault("MARSRL_CACHE", os.path.join(_TMP, "marsrl-cache"))  # tiny worlds built once per run


_MAX_WORKERS = 4  # each worker holds torch, transformers and its module's models (~1-3 GB)


def pytest_xdist_auto_num_workers(config):
    return max(1, min(_MAX_WORKERS, os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    """Give every test an ``xdist_group`` (used by ``--dist loadgroup``; harmless without xdist)."""
    root = config.rootpath
    for item in items:
        module = item.path.relative_to(root).as_posix()
        group = "ray" if "ray_cluster" in item.fixturenames else module
        item.add_marker(pytest.mark.xdist_group(group))


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
