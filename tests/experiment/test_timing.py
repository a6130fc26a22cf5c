"""The interleaved rollout timing: the arms' order rotates every repeat, each call is timed alone, and the
non-rollout step time is the median of step_seconds x (1 - rollout share)."""

from __future__ import annotations

import pytest

from marsrl.experiment.timing import measure, rotation, train_seconds, whole_rotations


class _Traj:
    def __init__(self, n: int):
        self.completion_ids = [0] * n


class _Pool:
    def __init__(self, name: str, log: list, cost: float, clock: list):
        self.name, self.log, self.cost, self.clock = name, log, cost, clock

    def generate(self, prompt_ids, sampling):
        self.log.append(self.name)
        self.clock[0] += self.cost  # the fake clock advances by this pool's cost
        return [_Traj(3) for _ in prompt_ids]


def test_rotation_puts_every_arm_first_in_turn():
    names = ["strict", "mars", "strict (A/A)"]
    assert [rotation(names, r)[0] for r in range(3)] == names
    assert rotation(names, 4) == ["mars", "strict (A/A)", "strict"]


def test_whole_rotations_put_every_arm_in_every_position_equally_often():
    names = ["strict", "mars", "strict (A/A)"]
    assert [whole_rotations(r, 3) for r in (0, 1, 3, 8, 9)] == [0, 3, 3, 9, 9]
    assert whole_rotations(8, 4) == 8
    for repeats in (whole_rotations(8, 3), whole_rotations(5, 3)):
        positions = {n: [rotation(names, r).index(n) for r in range(repeats)] for n in names}
        for n in names:  # each name in each position the same number of times
            assert sorted(positions[n]) == sorted(positions["strict"])
    # 8 raw repeats of 3 names: unbalanced (the reason for rounding up)
    raw = {n: [rotation(names, r).index(n) for r in range(8)].count(0) for n in names}
    assert len(set(raw.values())) > 1
    with pytest.raises(ValueError, match="n_arms"):
        whole_rotations(3, 0)


def test_measure_times_each_call_round_robin():
    log: list[str] = []
    clock = [0.0]
    pools = {n: _Pool(n, log, c, clock) for n, c in (("strict", 2.0), ("mars", 1.5), ("strict (A/A)", 2.0))}
    out = measure(pools, [[1, 2], [3]], sampling=None, repeats=3, clock=lambda: clock[0])
    assert log == ["strict", "mars", "strict (A/A)", "mars", "strict (A/A)", "strict",
                   "strict (A/A)", "strict", "mars"]  # fmt: skip
    assert out["strict"]["seconds"] == [2.0, 2.0, 2.0] and out["mars"]["seconds"] == [1.5, 1.5, 1.5]
    assert out["mars"]["tokens"] == [6, 6, 6]


def test_train_seconds_is_the_median_non_rollout_time():
    rows = [
        {"train/step_seconds": 10.0, "train/rollout/share_of_step": 0.4},  # 6
        {"train/step_seconds": 4.0, "train/rollout/share_of_step": 0.5},  # 2
        {"train/step_seconds": 8.0, "train/rollout/share_of_step": 0.5},  # 4
        {"train/step_seconds": None, "train/rollout/share_of_step": 0.5},
    ]
    assert train_seconds(rows) == pytest.approx(4.0)
    assert train_seconds(rows[:2]) == pytest.approx(4.0)  # even count: the mean of the middle two
    assert train_seconds([]) is None
