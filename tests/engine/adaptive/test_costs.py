"""The cost model (``adaptive/costs.py``): interpolation, levels, context slopes and lines."""

import pytest

from marsrl.engine.adaptive import CostModel


def test_interpolation_keeps_two_curves_in_order_in_floating_point():
    """Two curves through batch sizes 1 and 4 that meet at 4 (a flat line at 4 rows, a rising one at 1):
    at 4 rows they must read equal and between the sizes never cross.  These three figures made
    ``y0 + (y1 - y0) * t`` read the lower curve one ulp above the higher at 4 rows, the flake of
    ``test_calibrate_measures_every_batch_and_width`` (slot cost at k = 1 above k = 2's); 2000 random
    triples (seed 0) besides."""
    import random

    from marsrl.engine.adaptive.costs import _interp

    cases = [(5.833820394550312e-05, 0.00014914949246503664, 5.046868558173903e-05)]
    rng = random.Random(0)
    for _ in range(2000):
        low = rng.random() * 1e-4
        cases.append((low, low + rng.random() * 1e-4, rng.random() * 1e-4))
    for low, high, meet in cases:
        assert _interp([1, 4], [low, meet], 4) == meet == _interp([1, 4], [high, meet], 4)
        for rows in (1, 2, 3, 3.5):
            assert _interp([1, 4], [low, meet], rows) <= _interp([1, 4], [high, meet], rows)


def test_measured_rounds_set_the_level_not_the_shape():
    costs = CostModel(rounds={1: {0: 1.0, 1: 1.0}, 4: {0: 2.0, 1: 2.0}})
    # one call: two k = 1 rounds near 4 rows, one plain round at 1 row; the 3-row round counts at 4 rows,
    # rescaled by model(4, 1) / model(3, 1) = 2 / (1 + 2 / 3); each round against its k's calibrated
    # figure, one ratio per size (the median)
    call = [[0.0, 4, 1, 4.0, 0], [0.1, 1, 0, 1.0, 0], [0.2, 3, 1, 3.0, 0]]  # no per_slot: width is moot
    scaled = 3.0 * 2.0 / (1 + 2 / 3)
    costs.observe(call)
    assert costs.levels == {4: [pytest.approx((4.0 / 2.0 + scaled / 2.0) / 2)], 1: [1.0]}
    assert costs.level(4) == 1.0 and costs.round_seconds(4, 1) == 2.0  # one slow call: seeds hold it
    assert 4 not in costs.runs  # the calibration's runs are the calibration's alone
    # calls that keep measuring it slower take over within a dozen: the level follows the rounds
    for _ in range(9):
        costs.observe([[0.0, 4, 1, 4.0, 0]])
    assert costs.level(4) == pytest.approx((2.0 + scaled / 2.0) / 2)
    for _ in range(40):
        costs.observe([[0.0, 4, 1, 4.0, 0]])
    assert costs.level(4) == 2.0 and len(costs.levels[4]) == costs.keep  # the seeds have aged out
    # every k at that size moves alike (the plain step was never observed there), and sizes between
    # measured ones interpolate the levelled figures
    assert costs.round_seconds(4, 1) == 4.0 and costs.round_seconds(4, 0) == 4.0
    assert costs.round_seconds(2, 1) == pytest.approx(1.0 + (4.0 - 1.0) / 3)
    # and a single fast outlier does not pull it down
    costs.observe([[0.0, 4, 1, 0.5, 0]])
    assert costs.level(4) == 2.0
    again = CostModel.from_dict(costs.to_dict())
    assert again.levels == costs.levels and again.round_seconds(2, 1) == costs.round_seconds(2, 1)
    assert CostModel.from_dict({"rounds": {"1": {"0": 1.0}}}).level(1) == 1.0  # an older dict


def test_rounds_of_the_chosen_k_do_not_steepen_the_line():
    """The planner drafts mostly one k, in the workload's conditions (longer prompts, a busier machine)
    rather than the calibration's.  Calibrated rounds cost 1 + k (k = 1..7); 40 calls whose k = 6 and
    k = 7 rounds run 50% slower: every k's figure scales by 1.5 and the ratios between k's stay the
    calibration's, so the longer chain is judged as the shorter ones are.  (Folded in per k, the two
    figures alone rose, the line through k = 1..7 steepened, and the planner drafted ever shorter.)"""
    calibrated = {k: 1.0 + k for k in range(8)}
    costs = CostModel(rounds={1: dict(calibrated)})
    for _ in range(40):
        costs.observe([[0.0, 1, 6, 1.5 * 7.0, 0], [0.1, 1, 7, 1.5 * 8.0, 0], [0.2, 1, 6, 1.5 * 7.0, 0]])
    seconds = costs.round_seconds_upto(1, 7)
    assert seconds == pytest.approx([1.5 * t for t in calibrated.values()])
    assert seconds[7] / seconds[5] == pytest.approx(8.0 / 6.0)


def test_calibration_figures_are_the_lower_quartile_of_their_runs():
    costs = CostModel()
    for t in (3.0, 1.0, 2.0):
        costs.add_run(8, 2, t)
    assert costs.rounds[8][2] == 1.0  # the least of three
    for t in (5.0, 6.0):
        costs.add_run(8, 2, t)
    assert costs.rounds[8][2] == 2.0  # the second of five


def test_context_slope_is_the_median_slope_within_each_group():
    from marsrl.engine.adaptive import context_slope

    # two runs at 2 ms a slot, the second 50 ms slower throughout (a slow spell): the level is no slope
    fast = [(w, 0.010 + 0.002 * w) for w in (10, 20, 30, 40)]
    slow = [(w, 0.060 + 0.002 * w) for w in (10, 20, 30)]
    assert context_slope([fast, slow]) == pytest.approx(0.002)
    # one slow round among them tilts a least-squares fit, not the median of the 9 pairwise slopes
    assert context_slope([[*fast[:3], (40, 0.5)], slow]) == pytest.approx(0.002)
    # pairs across groups are never taken: a run at 10 and 20 slots and a slower one at 30 and 40, pooled
    # as one group, read the slower run's level as 4.1 ms a slot
    early = [(w, 0.010 + 0.002 * w) for w in (10, 20)]
    late = [(w, 0.060 + 0.002 * w) for w in (30, 40)]
    assert context_slope([early, late]) == pytest.approx(0.002)
    assert context_slope([early + late]) == pytest.approx((0.11 / 30 + 0.09 / 20) / 2)
    # time falling with width (noise) reads as no slope; no two widths apart, no slope either
    assert context_slope([[(10, 0.05), (20, 0.04)]]) == 0.0
    assert context_slope([[(10, 0.05), (10, 0.04)], []]) == 0.0


def test_context_line_fits_every_k_at_once_and_survives_one_unlucky_k():
    """Seed 0, 3 runs of 3 rounds a k, k = 0 .. 7, each round timed with +-1% noise on a true slot
    cost of (1 + k / 2) us at k >= 1 and 0.8 us at k = 0; then k = 7's rounds read flat (a slow
    spell on its early rounds).  The joint line must stay within 10% of the truth at every k >= 1 and
    the plain step keep its own figure; the line through each k's own median (the model read that
    before) is pulled below the truth at k = 7 by more than 10%, so the test tells the two apart."""
    import random

    from marsrl.engine.adaptive.costs import _line, context_line, context_slope

    rng = random.Random(0)

    def slot_us(k: int) -> float:
        return 0.8 if k == 0 else 1.0 + k / 2

    groups = {
        k: [
            [(w, (1000 + slot_us(k) * w) * 1e-6 * (1 + rng.uniform(-0.01, 0.01))) for w in (100, 180, 260)]
            for _ in range(3)
        ]
        for k in range(8)
    }
    groups[7] = [[(w, 2000e-6) for w in (100, 180, 260)] for _ in range(3)]
    joint = context_line(groups)
    assert joint[0] == pytest.approx(context_slope(groups[0]))
    for k in range(1, 8):
        assert joint[k] == pytest.approx(slot_us(k) * 1e-6, rel=0.10), k
    own = {k: context_slope(g) for k, g in groups.items()}
    a, b = _line(list(range(1, 8)), [own[k] for k in range(1, 8)])
    assert a + 7 * b < 0.9 * slot_us(7) * 1e-6
    # one k with pairs: its own figure; none: no figure but 0
    assert context_line({0: groups[0], 3: groups[3]})[3] == pytest.approx(context_slope(groups[3]))
    assert context_line({1: [[(10, 0.05)]]}) == {1: 0.0}


def test_cost_model_adds_each_slot_of_context_per_k():
    costs = CostModel(
        rounds={1: {0: 1.0, 1: 2.0, 2: 3.0}, 4: {0: 2.0, 1: 4.0, 2: 6.0}},
        per_slot={1: {0: 0.01, 1: 0.02, 2: 0.04}, 4: {0: 0.03, 1: 0.05, 2: 0.05}},
    )
    # k = 0 its own figure, k >= 1 on the line through theirs, interpolated between batch sizes
    assert costs.slot_seconds_upto(1, 2) == pytest.approx([0.01, 0.02, 0.04])
    assert costs.slot_seconds_upto(2, 3) == pytest.approx(
        [0.02 / 3 + 0.01, 0.03, 0.04 + 0.01 / 3, 0.06 - 0.01 / 3]
    )
    assert costs.round_seconds(1, 2, width=100) == pytest.approx(3.0 + 4.0)
    assert costs.round_seconds(4, 0, width=50) == pytest.approx(2.0 + 1.5)
    assert costs.round_seconds(4, 1) == 4.0  # at width 0, the empty-cache figures alone
    again = CostModel.from_dict(costs.to_dict())
    assert again.per_slot == costs.per_slot and again.round_seconds(3, 2, 70) == costs.round_seconds(3, 2, 70)
    # a model without per_slot (an older dict) is the same at every width
    old = CostModel.from_dict({"rounds": {"1": {"0": 1.0, "1": 2.0}}})
    assert old.round_seconds(1, 1, width=10**6) == 2.0


def test_observed_rounds_are_judged_at_their_context():
    def observed(trace, rounds=None, per_slot=None) -> list[float]:
        costs = CostModel(
            rounds=rounds or {4: {0: 2.0, 1: 3.0}}, per_slot=per_slot or {4: {0: 0.01, 1: 0.02}}
        )
        costs.observe(trace)
        return costs.levels[4]

    # k = 1 rounds at 100 and at 300 slots against 3 + 2 and 3 + 6 s: 6 / 5 and 10 / 9, the median of two
    assert observed([[0.0, 4, 1, 6.0, 100], [0.1, 4, 1, 10.0, 300]]) == [pytest.approx((1.2 + 10 / 9) / 2)]
    assert observed([[0.2, 4, 0, 2.0 + 0.5, 50]]) == [pytest.approx(1.0)]  # the plain step's own 10 ms a slot
    # a figure near 0 at an empty cache, where the context is nearly the whole round (a plain step at
    # many rows): 10% slower rounds read as 1.1, not as the 1.5 / 0.1 = 15 of the empty part
    near_zero = dict(rounds={4: {0: 0.001, 1: 3.0}}, per_slot={4: {0: 0.01, 1: 0.02}})
    assert observed([[0.0, 4, 0, 1.1 * (0.001 + 0.01 * 150), 150]], **near_zero) == [pytest.approx(1.1)]
    # and the level scales the whole round, its context included
    costs = CostModel(**near_zero, levels={4: [1.1] * 32})
    assert costs.round_seconds(4, 0, width=150) == pytest.approx(1.1 * (0.001 + 1.5))
