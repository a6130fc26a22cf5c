"""Fixtures for the drafter tests.  Nothing here may reach the hub (tests/conftest.py also sets this)."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.drafter.helpers import tiny_llama


@pytest.fixture(scope="module")
def target():
    """A 6-layer Llama with V = 64, H = 32, 4 heads / 2 kv heads."""
    return tiny_llama()
