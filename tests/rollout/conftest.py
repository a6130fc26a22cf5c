"""The rollout tests use ``ray_cluster`` and the thread-count guard from ``tests/conftest.py``."""
