"""wilson_interval against scipy's Wilson interval (the reference implementation)."""

import pytest
from scipy.stats import binomtest

from marsrl.algo import wilson_interval


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (113, 200), (200, 200), (1, 1)])
def test_matches_scipy(k, n):
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = wilson_interval(k, n, z=1.959963984540054)
    assert lo == pytest.approx(ref.low, abs=1e-12) and hi == pytest.approx(ref.high, abs=1e-12)
