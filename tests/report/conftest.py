"""One report built from the three-arm synthetic experiment, shared by the tests that only read it."""

import pytest

from marsrl.report import build_report

from .helpers import write_experiment


@pytest.fixture(scope="package")
def built(tmp_path_factory):
    """(experiment folder, Report) for arms strict, mars, mars_code (written mars first)."""
    out = write_experiment(tmp_path_factory.mktemp("exp"), arms=("mars", "mars_code", "strict"))
    return out, build_report(out)
