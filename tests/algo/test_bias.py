"""bias_metrics against a loop over tokens (random batches with padding, several seeds), and the
trajectory-level wrapper ``marsrl.metrics.bias_metrics`` against the code it replaced."""

import math

import pytest
import torch

from marsrl import metrics
from marsrl.algo import bias_metrics
from marsrl.trajectory import Trajectory
from marsrl.verify import Provenance
from tests.algo import legacy
from tests.algo.helpers import padded_mask
from tests.algo.reference import bias_metrics_loop


def _batch(seed, n=6, t=9, relaxed=True):
    gen = torch.Generator().manual_seed(seed)
    mask = padded_mask(n, t, gen)
    behavior = -2 * torch.rand(n, t, generator=gen)
    policy = behavior + 0.4 * torch.randn(n, t, generator=gen)
    p_t1 = 0.3 + 0.6 * torch.rand(n, t, generator=gen)
    p_t2 = (1 - p_t1) * torch.rand(n, t, generator=gen)
    rank = torch.randint(0, 3, (n, t), generator=gen)
    prov = torch.randint(1, 5 if relaxed else 2, (n, t), generator=gen)
    unsupported = 0.1 * torch.rand(n, t, generator=gen)
    # padding as a collated batch holds it: zeros, PAD, and -inf log-probs
    policy = policy.masked_fill(~mask, float("-inf"))
    prov = prov.masked_fill(~mask, Provenance.PAD)
    return {
        "policy_logp": policy,
        "behavior_logp": behavior,
        "is_t1": (rank == 0) & mask,
        "is_t2": (rank == 1) & mask,
        "p_t1": p_t1 * mask,
        "p_t2": p_t2 * mask,
        "provenance": prov,
        "mask": mask,
        "unsupported_mass": unsupported,
    }


def _assert_figures(got, expected, tol=1e-6):
    assert set(got) == set(expected)
    for k, v in expected.items():
        assert type(got[k]) is float, k
        assert got[k] == pytest.approx(v, rel=tol, abs=tol, nan_ok=True), k


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("with_unsupported", [True, False])
def test_matches_the_loop(seed, with_unsupported):
    batch = _batch(seed)
    if not with_unsupported:
        batch["unsupported_mass"] = None
    w, figures = bias_metrics(**batch)
    _assert_figures(figures, bias_metrics_loop(*batch.values()))
    m = batch["mask"]
    expected = torch.exp(batch["policy_logp"] - batch["behavior_logp"])
    torch.testing.assert_close(w[m], expected[m])
    assert w.dtype == torch.float32 and torch.all(w[~m] == 0) and not w.isnan().any()


def test_relaxed_figures_are_nan_without_relaxed_tokens():
    _, figures = bias_metrics(**_batch(5, relaxed=False))
    assert figures["relaxed_frac"] == 0.0
    assert all(math.isnan(figures[f"is_ratio_{k}_relaxed"]) for k in ("mean", "min", "max", "ess_frac"))
    assert math.isfinite(figures["is_ratio_mean"])


def test_equal_policy_and_behaviour_give_unit_ratios():
    batch = _batch(6)
    batch["behavior_logp"] = batch["policy_logp"].where(batch["mask"], 0.0)
    _, figures = bias_metrics(**batch)
    for k in ("is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_ratio_ess_frac"):
        assert figures[k] == pytest.approx(1.0)
    assert figures["kl_behavior"] == 0.0


def _trajectories(seed, n=7):
    """Trajectories with their teacher-forced records, ragged lengths (at least one token)."""
    gen = torch.Generator().manual_seed(seed)
    trajs, forced = [], []
    for _ in range(n):
        k = int(torch.randint(1, 12, (1,), generator=gen))
        behavior = -2 * torch.rand(k, generator=gen)
        p1 = 0.3 + 0.6 * torch.rand(k, generator=gen)
        rank = torch.randint(0, 3, (k,), generator=gen)
        trajs.append(
            Trajectory(
                prompt_ids=[1, 2],
                completion_ids=torch.randint(0, 50, (k,), generator=gen).tolist(),
                provenance=torch.randint(1, 5, (k,), generator=gen).tolist(),
                target_logprobs=behavior.tolist(),
                behavior_logprobs=behavior.tolist(),
                logit_ratio=[0.5] * k,
                is_top2=(rank == 1).tolist(),
                draft_position=list(range(k)),
                finish_reason="length",
                rule="mars",
                theta=0.9,
            )
        )
        forced.append(
            {
                "logp": (behavior + 0.3 * torch.randn(k, generator=gen)).float(),
                "is_t1": rank == 0,
                "is_t2": rank == 1,
                "p_t1": p1,
                "p_t2": (1 - p1) * torch.rand(k, generator=gen),
            }
        )
    return trajs, forced


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trajectory_wrapper_equals_the_code_it_replaced(seed):
    trajs, forced = _trajectories(seed)
    old = legacy.bias_metrics(trajs, forced)
    new = metrics.bias_metrics(trajs, forced)
    for k, v in old.items():
        assert abs(new[k] - v) <= 1e-6 * max(1.0, abs(v)), k
    assert new["unsupported_mass"] == 0.0  # a record without it reads as zeros


def test_trajectory_wrapper_reads_unsupported_mass_when_recorded():
    trajs, forced = _trajectories(3)
    for t in trajs:
        t.unsupported_mass = [0.25] * len(t.provenance)
    assert metrics.bias_metrics(trajs, forced)["unsupported_mass"] == pytest.approx(0.25)
