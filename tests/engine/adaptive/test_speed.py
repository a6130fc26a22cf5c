"""The speed check (``adaptive/speed.py``): measured over predicted per kind and size, catch-up rounds,
near ties, the price of a plain step's pair."""

import pytest

from marsrl.engine.adaptive import CostModel, KPlanner


def test_speed_check_is_measured_over_predicted_per_kind_and_size():
    from marsrl.engine.adaptive import SpeedCheck

    check = SpeedCheck(window=16, least=4, cap=3.0)
    for _ in range(3):
        check.add(128, False, 2.0, 2.0)
        check.add(128, True, 6.0, 5.0)
    assert check.factor(128) == 1.0  # under `least` rounds of each kind: no word yet
    check.add(128, False, 2.0, 2.0)
    check.add(128, True, 6.0, 5.0)
    assert check.factor(128) == pytest.approx(1.2)
    assert check.factor(64) == 1.0  # sizes are apart
    # a stall counts at most `cap` times its prediction: 4 plain rounds of 2 s predicted, one of them 100 s
    check.add(128, False, 100.0, 2.0)
    assert check.ratio(128, False) == pytest.approx((4 * 2.0 + 6.0) / (5 * 2.0))
    # sums, not medians: one slow round of five moves the ratio by its share
    for _ in range(16):  # the window keeps only the last 16 of a kind
        check.add(128, True, 5.0, 5.0)
    assert check.ratio(128, True) == pytest.approx(1.0)
    carried = check.carried()
    check.add(128, True, 50.0, 5.0)
    assert carried.ratio(128, True) == pytest.approx(1.0)  # a copy, not a view
    assert set(check.to_dict()) == {"128"} and check.to_dict()["128"]["rounds"] == [5, 16]


def test_speed_check_leaves_out_catch_up_rounds_and_a_near_tie_measures_a_second_round():
    """A speculative round right after plain steps first absorbs their pairs: no sample of a steady
    speculative round (what the calibration models), so the check leaves it out.  So that a near tie
    still measures speculative rounds where plain steps are chosen, its speculative round after plain
    steps runs twice in a row, the second one timed."""
    from marsrl.engine.adaptive import AcceptanceEstimates, SpeedCheck

    check = SpeedCheck(window=16, least=4, cap=3.0)
    for _ in range(4):
        check.add(128, False, 2.0, 2.0)
        check.add(128, True, 6.0, 5.0)
    check.add(128, True, 15.0, 5.0, after_plain=12)  # a catch-up round: not counted
    assert check.ratio(128, True) == pytest.approx(1.2) and len(check.rounds[128, True]) == 4
    assert check.ratio(128, False) == pytest.approx(1.0)
    check.add(128, False, 2.0, 2.0, after_plain=3)  # only speculative rounds catch up
    assert len(check.rounds[128, False]) == 5

    # the near tie of the planner test below, speculative rounds 1.12x their prediction (k = 2 at 0.98
    # tokens/s against the plain step's 1.0), and each plain step leaving 0.5 s for the next speculative
    # round to catch up on.  Seed 0, 400 rounds of one row at acceptance 0.7
    import random

    class ChargedToRound(SpeedCheck):  # the check with catch-up rounds counted in
        def add(self, size, speculative, seconds, predicted, after_plain=0, pairs=0):
            super().add(size, speculative, seconds, predicted)

    costs = CostModel(rounds={1: {0: 1.0, 1: 1.6, 2: 2.0, 3: 2.4}})
    for speed in (SpeedCheck(), ChargedToRound()):
        rng = random.Random(0)
        est = AcceptanceEstimates(3)
        est.accepted, est.reached = [70.0, 70.0, 70.0], [100.0, 100.0, 100.0]
        planner = KPlanner(costs, 3, estimates=est, speed=speed)
        ks, pending = [], 0
        for _ in range(400):
            k = planner.choose(1, 0)
            accepted = 0
            while accepted < k and rng.random() < 0.7:
                accepted += 1
            planner.observe([k], [accepted])
            planner.timed(costs.round_seconds(1, k) * 1.12 + 0.5 * pending if k else 1.0)
            pending = 0 if k else pending + 1
            ks.append(k)
        if isinstance(speed, ChargedToRound):  # the catch-up read as speculative seconds
            assert speed.factor(1) > 1.25, speed.to_dict()  # against a true 1.12
            continue
        assert speed.factor(1) == pytest.approx(1.12), speed.to_dict()  # the true ratio, catch-up aside
        late = ks[200:]
        assert sum(k == 0 for k in late) > 0.7 * len(late)  # plain is chosen, near a tie
        starts = [i for i in range(1, len(late) - 1) if late[i] and not late[i - 1]]
        pairs = sum(1 for i in starts if late[i + 1])  # the tie's rounds: catch-up, then the sample
        # measured ever more rarely while plain stays ahead (SpeedCheck.tie_due): every 64th tie by now
        assert speed.ties[1][1] == 64 and 2 <= pairs <= 5, (speed.ties, late)
        assert len(starts) - pairs <= 3, late  # the rest are probes, after 64 and 128 plain rounds


def test_near_tie_measuring_rounds_thin_out_while_they_confirm_the_ranking():
    """A near tie measures the runner-up at its 8th round; once the factor acts (both kinds have
    ``least`` rounds) each measurement that finds the same winner doubles the gap to the next, up to 64,
    and one that finds the other winner sets it back to 8.  The count carries over calls with the
    check (``carried``), per batch size."""
    from marsrl.engine.adaptive import SpeedCheck

    def due_rounds(check, size, winners):
        return [i for i, w in enumerate(winners) if check.tie_due(size, w, every=8, most=64)]

    check = SpeedCheck(least=2)
    # not measured yet: every 8th tie, whatever the winner
    assert due_rounds(check, 128, [True] * 24) == [7, 15, 23]
    for _ in range(2):
        check.add(128, False, 1.0, 1.0)
        check.add(128, True, 1.0, 1.0)
    # measured: plain ahead at each measurement, so gaps of 16, 32, 64, 64 follow the 8 left
    assert due_rounds(check, 128, [True] * 200) == [7, 23, 55, 119, 183]
    assert check.to_dict()["128"]["tie_gap"] == 64
    carried = check.carried()  # a new call goes on counting: 48 ties left of the gap
    assert due_rounds(carried, 128, [True] * 50) == [47]
    # the winner changed at a measurement (62 ties on): back to 8, then doubling while it holds
    assert due_rounds(carried, 128, [False] * 64) == [61]
    assert due_rounds(carried, 128, [False] * 40) == [5, 21]
    assert check.ties[128] != carried.ties[128]  # a copy, not a view
    assert due_rounds(carried, 32, [True] * 16) == [7, 15]  # another batch size counts on its own


def test_speed_check_prices_a_plain_step_pair_from_catch_up_rounds():
    """A catch-up round's seconds past a steady round's (the prediction times the size's measured
    speculative ratio), per plain-step pair it absorbed; the median of the last ``window``, from
    ``least`` rounds on."""
    from marsrl.engine.adaptive import SpeedCheck

    check = SpeedCheck(window=16, least=4, cap=3.0)
    for _ in range(4):
        check.add(128, True, 6.0, 5.0)  # steady speculative rounds at 1.2x their prediction
    for pairs in (100, 200, 300):
        check.add(128, True, 6.0 + 0.01 * pairs, 5.0, after_plain=3, pairs=pairs)
    assert check.pair_seconds() is None  # 3 of least = 4
    check.add(128, True, 1000.0, 5.0, after_plain=3, pairs=100)  # a stall
    assert check.pair_seconds() == pytest.approx(0.01)  # the median: 0.01, 0.01, 0.01, ~10
    assert len(check.rounds[128, True]) == 4  # catch-up rounds stay out of the ratios
    check.add(128, True, 6.0, 5.0, after_plain=1, pairs=0)  # nothing absorbed: no price sample
    assert len(check.catchups) == 4
    carried = check.carried()
    for _ in range(8):  # 0.5 s under a steady round's 6 s: a negative price, read as 0
        check.add(128, True, 5.5, 5.0, after_plain=1, pairs=50)
    assert check.pair_seconds() == 0.0 and carried.pair_seconds() == pytest.approx(0.01)  # a copy
