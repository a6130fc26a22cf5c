"""group_advantages against a loop over groups and against TRL 1.16's own advantage code (executed from
the installed grpo_trainer.py), for every scale, with NaN (unscorable) rewards and G = 1."""

import math
from types import SimpleNamespace

import pytest
import torch

from marsrl.algo import group_advantages
from tests.algo.helpers import trl_nanstd, trl_source
from tests.algo.reference import group_advantages_loop

SCALES = ("group", "batch", "none")


def _rewards(seed, groups=6, g=4, nan_frac=0.0):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (groups * g,), generator=gen).float()  # ties: some groups have std 0
    r[:g] = 1.0  # one all-equal group for sure
    r[torch.rand(r.shape, generator=gen) < nan_frac] = float("nan")
    return r


def trl_advantages(rewards, group_size, scale):
    """TRL's ``sum_then_normalize`` branch run on one reward function's outputs."""
    namespace = {
        "torch": torch,
        "nanstd": trl_nanstd(),
        "self": SimpleNamespace(
            multi_objective_aggregation="sum_then_normalize",
            reward_weights=torch.ones(1),
            scale_rewards=scale,
        ),
        "device": "cpu",
        "rewards_per_func": rewards[:, None].clone(),
        "num_generations": group_size,
    }
    code = trl_source(
        "trainer/grpo_trainer.py",
        "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
        "# Slice to keep only the local part of the data",
    )
    exec(code, namespace)
    return namespace["advantages"], namespace["is_std_zero"]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("nan_frac", [0.0, 0.2])
def test_matches_the_loop(seed, scale, nan_frac):
    rewards = _rewards(seed, nan_frac=nan_frac)
    adv, _ = group_advantages(rewards, 4, scale)
    torch.testing.assert_close(adv.double(), group_advantages_loop(rewards, 4, scale), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize(("groups", "g", "nan_frac"), [(6, 4, 0.0), (5, 3, 0.25), (4, 1, 0.0), (1, 1, 0.0)])
def test_equals_trl(seed, scale, groups, g, nan_frac):
    rewards = _rewards(seed, groups, g, nan_frac)
    adv, metrics = group_advantages(rewards, g, scale)
    expected, is_std_zero = trl_advantages(rewards, g, scale)
    torch.testing.assert_close(adv, expected, rtol=0, atol=0)
    if scale != "batch":  # with "batch", TRL's flag is about the batch's std (module docstring)
        assert metrics["frac_zero_std_groups"] == pytest.approx(is_std_zero.float().mean().item())
    nanstd = trl_nanstd()
    assert metrics["reward_mean"] == pytest.approx(torch.nanmean(rewards).item(), nan_ok=True)
    assert metrics["reward_std"] == pytest.approx(nanstd(rewards).item(), nan_ok=True)


def test_metrics_and_a_zero_signal_group():
    adv, metrics = group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), group_size=2)
    assert adv[:2].sum().abs() < 1e-6 and adv[0] > 0 and torch.all(adv[2:] == 0)
    assert metrics == pytest.approx(
        {"reward_mean": 1.25, "reward_std": math.sqrt(11 / 12), "frac_zero_std_groups": 0.5}
    )
    assert all(type(v) is float for v in metrics.values())


def test_integer_rewards_become_float32_and_floats_keep_their_dtype():
    assert group_advantages(torch.tensor([1, 0, 1, 1]), 2)[0].dtype == torch.float32
    assert group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), 2)[0].dtype == torch.float64


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="'grup'"):
        group_advantages(torch.zeros(4), 2, scale="grup")
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(4, 1), 2)
