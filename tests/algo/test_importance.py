"""importance_weights against a loop over sequences and tokens, and against TRL 1.16's own
vllm_importance_sampling code (executed from the installed grpo_trainer.py) in its four modes; masked
positions hold 0, never NaN, whatever they held."""

import math
from types import SimpleNamespace

import pytest
import torch

from marsrl.algo import importance_weights
from tests.algo.helpers import padded_mask, trl_source
from tests.algo.reference import importance_weights_loop

TRL_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
MODES = ("none", *TRL_MODES, "sequence")
CLIPS = [(None, 3.0), (0.5, 2.0), (0.8, None), (None, 1.05)]


def _batch(seed, n=6, t=8, spread=0.3, nan_unmasked=False):
    gen = torch.Generator().manual_seed(seed)
    mask = padded_mask(n, t, gen)
    behavior = -3 * torch.rand(n, t, generator=gen)
    policy = behavior + spread * torch.randn(n, t, generator=gen)
    # garbage where masked: what a padded batch may hold
    junk = torch.tensor([float("nan"), float("-inf"), float("inf"), 7.0])
    pick = torch.randint(0, 4, (n, t), generator=gen)
    policy = torch.where(mask, policy, junk[pick])
    behavior = torch.where(mask, behavior, junk[(pick + 1) % 4])
    if nan_unmasked:  # a rollout that could not score a token (TRL: ratio 1 there)
        behavior[0, 1] = float("nan")
    return policy, behavior, mask


def trl_ratio(policy, behavior, mask, mode, clip_min, clip_max):
    """TRL's importance-sampling block; returns its ratio ([N, T] or [N, 1]) and min / mean / max."""
    namespace = {
        "torch": torch,
        "math": math,
        "self": SimpleNamespace(
            use_vllm=True,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode=mode,
            vllm_importance_sampling_clip_min=clip_min,
            vllm_importance_sampling_clip_max=clip_max,
        ),
        "old_per_token_logps": policy,
        "sampling_per_token_logps": behavior,
        "completion_mask": mask.long(),
        "tool_mask": None,
    }
    code = trl_source(
        "trainer/grpo_trainer.py",
        "# Compute the importance sampling ratio when using vLLM",
        "# Compute the per-token log probabilities for the reference model",
    )
    exec(code, namespace)
    ratio = namespace["vllm_importance_sampling_ratio"]
    # the logged figures (grpo_trainer.py 1.16.0 lines 2875-2887), transcribed
    flat = ratio.flatten() if namespace["sequence_level_is"] else ratio[mask]
    figures = {"is_ratio_min": flat.min(), "is_ratio_mean": flat.mean(), "is_ratio_max": flat.max()}
    return ratio, {k: v.item() for k, v in figures.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("clip_min", "clip_max"), CLIPS)
def test_matches_the_loop(seed, mode, clip_min, clip_max):
    policy, behavior, mask = _batch(seed, nan_unmasked=seed == 2)
    w, _ = importance_weights(policy, behavior, mask, mode, clip_min, clip_max)
    expected = importance_weights_loop(policy, behavior, mask, mode, clip_min, clip_max)
    torch.testing.assert_close(w.double(), expected, rtol=1e-5, atol=1e-6)
    assert not w.isnan().any() and torch.all(w[~mask] == 0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", TRL_MODES)
@pytest.mark.parametrize(("clip_min", "clip_max"), CLIPS)
def test_equals_trl(seed, mode, clip_min, clip_max):
    policy, behavior, mask = _batch(seed, spread=0.5 if seed % 2 else 0.1, nan_unmasked=seed == 3)
    w, metrics = importance_weights(policy, behavior, mask, mode, clip_min, clip_max)
    ratio, figures = trl_ratio(policy, behavior, mask, mode, clip_min, clip_max)
    torch.testing.assert_close(w, torch.where(mask, ratio.expand_as(mask), 0.0), rtol=0, atol=0)
    for k, v in figures.items():
        assert metrics[k] == pytest.approx(v, rel=1e-6), k


def test_sequence_is_the_product_of_the_token_ratios():
    policy, behavior, mask = _batch(4, spread=1.0)
    w, metrics = importance_weights(policy, behavior, mask, "sequence")
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        product = math.prod(math.exp(policy[i, j] - behavior[i, j]) for j in range(n))
        assert torch.allclose(w[i, :n].double(), torch.tensor(product, dtype=torch.float64), rtol=1e-5)
    assert metrics["clipped_frac"] == 0.0


def test_clipped_frac_counts_the_units_outside_the_bounds():
    mask = torch.tensor([[True, True, True], [True, True, False]])
    behavior = torch.zeros(2, 3)
    policy = torch.log(torch.tensor([[0.2, 1.0, 5.0], [1.0, 1.0, 9.0]]))
    _, token = importance_weights(policy, behavior, mask, "token_truncate", 0.5, 2.0)
    assert token["clipped_frac"] == pytest.approx(2 / 5) and token["is_ratio_max"] == pytest.approx(2.0)
    _, seq = importance_weights(policy, behavior, mask, "sequence_mask", 0.5, 2.0)
    assert seq["clipped_frac"] == 0.0 and seq["is_ratio_mean"] == pytest.approx(1.0)  # 0.2 * 5 = 1, 1 * 1 = 1
    w, none = importance_weights(policy, behavior, mask, "none")
    assert torch.equal(w, mask.float()) and none["is_ratio_max"] == 1.0 and none["clipped_frac"] == 0.0


def test_an_empty_batch_reports_zeros_as_trl():
    policy, behavior, mask = _batch(0)
    w, metrics = importance_weights(policy, behavior, torch.zeros_like(mask), "token_mask")
    assert not w.any() and set(metrics.values()) == {0.0}


def test_errors_name_what_is_wrong():
    policy, behavior, mask = _batch(0)
    with pytest.raises(ValueError, match="'tokn_mask'"):
        importance_weights(policy, behavior, mask, "tokn_mask")
    with pytest.raises(ValueError, match="clip_max"):
        importance_weights(policy, behavior, mask, "token_mask", clip_min=2.0, clip_max=2.0)
    with pytest.raises(ValueError, match="clip_min or clip_max"):
        importance_weights(policy, behavior, mask, "sequence_truncate", None, None)
    importance_weights(policy, behavior, mask, "token_mask", None, None)  # masks nothing, as TRL
