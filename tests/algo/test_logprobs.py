"""token_stats against a loop over positions (random logits / hidden states, right padding, several
seeds), its hidden-state path against its logits path, chunking, gradients and its errors."""

import pytest
import torch

from marsrl.algo import token_stats
from tests.algo.helpers import padded_mask
from tests.algo.reference import token_stats_loop

KEYS = ("logp", "is_t1", "is_t2", "p_t1", "p_t2")


def _batch(seed, n=5, t=7, v=19, h=6):
    gen = torch.Generator().manual_seed(seed)
    mask = padded_mask(n, t, gen)
    ids = torch.randint(0, v, (n, t), generator=gen)
    # make every rank visited: some tokens are the argmax / second argmax of their logits
    logits = 3 * torch.randn(n, t, v, generator=gen)
    order = logits.argsort(-1, descending=True)
    pick = torch.randint(0, 3, (n, t), generator=gen)
    ids = torch.where(pick < 2, order.gather(-1, pick[..., None]).squeeze(-1), ids)
    hidden = torch.randn(n, t, h, generator=gen)
    weight = torch.randn(v, h, generator=gen)
    return ids, logits, hidden, weight, mask


def _assert_matches(stats, ref, mask):
    for k in ("is_t1", "is_t2"):
        assert torch.equal(stats[k], ref[k]), k
    for k in ("logp", "p_t1", "p_t2"):
        assert stats[k].dtype == torch.float32
        torch.testing.assert_close(stats[k].double(), ref[k], rtol=1e-5, atol=1e-5, msg=k)
    for k in KEYS:
        assert not stats[k][~mask].any(), f"{k} is not 0 / False at masked positions"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_logits_path_matches_the_loop(seed, temperature):
    ids, logits, _, _, mask = _batch(seed)
    stats, metrics = token_stats(ids, temperature, logits=logits, mask=mask, chunk_size=4)
    _assert_matches(stats, token_stats_loop(ids, temperature, logits=logits, mask=mask), mask)
    assert metrics["tokens"] == mask.sum().item()
    assert metrics["logp_mean"] == pytest.approx(stats["logp"][mask].double().mean().item(), rel=1e-6)
    assert stats["is_t1"][mask].any() and stats["is_t2"][mask].any()  # both ranks were exercised


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hidden_path_matches_the_loop_and_the_logits_path(seed, dtype):
    ids, _, hidden, weight, mask = _batch(seed)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    stats, _ = token_stats(ids, 0.8, hidden=hidden, weight=weight, mask=mask, chunk_size=3)
    _assert_matches(stats, token_stats_loop(ids, 0.8, hidden=hidden, weight=weight, mask=mask), mask)
    via_logits, _ = token_stats(ids, 0.8, logits=hidden.float() @ weight.float().T, mask=mask)
    for k in KEYS:
        torch.testing.assert_close(stats[k], via_logits[k], rtol=1e-6, atol=1e-6)


def test_chunk_size_does_not_change_the_result():
    ids, logits, _, _, mask = _batch(5, n=6, t=9)
    one, _ = token_stats(ids, logits=logits, mask=mask, chunk_size=1)
    whole, _ = token_stats(ids, logits=logits, mask=mask)
    for k in KEYS:
        torch.testing.assert_close(one[k], whole[k], rtol=0, atol=0)


def test_default_mask_is_every_position():
    ids, logits, _, _, _ = _batch(6)
    stats, metrics = token_stats(ids, logits=logits)
    _assert_matches(stats, token_stats_loop(ids, logits=logits), torch.ones_like(ids, dtype=torch.bool))
    assert metrics["tokens"] == ids.numel()


def test_logp_gradient_is_that_of_log_softmax():
    ids, _, hidden, weight, mask = _batch(7)
    hidden.requires_grad_(True)
    stats, _ = token_stats(ids, 0.7, hidden=hidden, weight=weight, mask=mask, chunk_size=4)
    (grad,) = torch.autograd.grad(stats["logp"].sum(), hidden)
    h2 = hidden.detach().clone().requires_grad_(True)
    logp = torch.log_softmax((h2 @ weight.T) / 0.7, -1).gather(-1, ids[..., None]).squeeze(-1)
    (expected,) = torch.autograd.grad((logp * mask).sum(), h2)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
    assert not stats["p_t1"].requires_grad and not stats["p_t2"].requires_grad


def test_temperature_zero_is_a_near_one_hot_softmax():
    ids, logits, _, _, mask = _batch(8)
    stats, _ = token_stats(ids, 0.0, logits=logits, mask=mask)
    assert torch.all(stats["p_t1"][mask] > 0.999) and torch.all(stats["logp"][mask & stats["is_t1"]] > -1e-3)


def test_nothing_unmasked_gives_zeros():
    ids, logits, _, _, mask = _batch(9)
    stats, metrics = token_stats(ids, logits=logits, mask=torch.zeros_like(mask))
    assert all(not v.any() for v in stats.values()) and metrics["tokens"] == 0


def test_errors_name_what_is_wrong():
    ids, logits, hidden, weight, _ = _batch(0)
    with pytest.raises(ValueError, match="exactly one"):
        token_stats(ids, logits=logits, hidden=hidden, weight=weight)
    with pytest.raises(ValueError, match="exactly one"):
        token_stats(ids)
    with pytest.raises(ValueError, match="weight"):
        token_stats(ids, hidden=hidden)
    with pytest.raises(ValueError, match="disagree"):
        token_stats(ids[:, :3], logits=logits)
    with pytest.raises(ValueError, match="chunk_size"):
        token_stats(ids, logits=logits, chunk_size=0)
