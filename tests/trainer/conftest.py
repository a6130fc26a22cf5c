"""Settings of the trainer tests (the test-wide ones are in tests/conftest.py)."""

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
