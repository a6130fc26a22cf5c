"""Settings of the integration tests; ``ray_cluster`` comes from ``tests/conftest.py``."""

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
