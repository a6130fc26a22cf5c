"""``sample_from_weights``: the one-level draw (small rows x vocab) and the two-level draw (large) pick the
same token for the same uniform, never a zero-weight token, at the weights' frequencies."""

import pytest
import torch

from marsrl.verify.dist import ONE_LEVEL_MAX, sample_from_weights


def _weights(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, vocab, generator=g) * 3).softmax(-1)
    w[:, ::5] = 0  # zero-weight tokens, including the first
    w[:, -3:] = 0  # and a zero tail: a uniform near 1 must not run past the last positive weight
    return w


@pytest.mark.parametrize("vocab", [7, 384, 8192])
def test_one_and_two_levels_draw_the_same_token(vocab):
    """seed 0, 4,096 rows: the two algorithms differ only in rounding (float32 block sums), so they may
    disagree only where u lands within ~1e-6 of a boundary; we allow 2 rows in 4,096."""
    w = _weights(4096, vocab, 0)
    u = torch.rand(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    differ = 0
    for rows in torch.arange(4096).split(128):  # 128 rows: within ONE_LEVEL_MAX at every vocab here
        assert 128 * vocab <= ONE_LEVEL_MAX
        one = sample_from_weights(w[rows], u[rows])
        two = sample_from_weights(w[rows], u[rows], block=max(2, int(vocab**0.5)))
        differ += int((one != two).sum())
        for draw in (one, two):
            assert (w[rows].gather(1, draw.unsqueeze(1)) > 0).all()
    assert differ <= 2, differ


def test_uniform_next_to_one_stays_on_a_positive_weight():
    w = _weights(64, 384, 2)
    u = torch.full((64,), 1.0 - 2.0**-53, dtype=torch.float64)
    draw = sample_from_weights(w, u)
    assert (draw < 381).all() and (w.gather(1, draw.unsqueeze(1)) > 0).all()
    # the last positive weight of each row, as the two-level draw gives it
    assert torch.equal(draw, sample_from_weights(w, u, block=19))


def test_one_level_frequencies_match_the_weights():
    """seed 3, 200k draws from one row of 12 weights: every frequency within 5 standard errors."""
    w = torch.tensor([[0.0, 0.3, 0.05, 0.0, 0.2, 0.1, 0.02, 0.08, 0.15, 0.06, 0.04, 0.0]])
    n = 200_000
    u = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    draw = sample_from_weights(w.expand(n, -1), u)
    freq = torch.bincount(draw, minlength=12).double() / n
    p = w[0].double() / w.sum()
    se = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1e-12).all(), (freq, p)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("vocab", [5, 384, 8192])
def test_small_plain_sample_equals_the_reference_bit_for_bit(temperature, vocab):
    """sample_plain's small-draw path against sample_plain_reference: same seed, every field equal
    (NaN ratios where z1 = 0 included), on 64 rows with an all-tied row and a zero-logit row."""
    import dataclasses

    from marsrl.verify.sample import sample_plain, sample_plain_reference
    from marsrl.verify.types import VerifyResult

    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(vocab)) * 4
    logits[3] = logits[3, 0]  # a row of ties
    logits[5, :] = -1.0
    logits[5, 0] = 0.0  # z1 = 0: the margin ratio is NaN
    fast = sample_plain(logits, temperature=temperature, generator=torch.Generator().manual_seed(1))
    ref = sample_plain_reference(logits, temperature, None, None, torch.Generator().manual_seed(1))
    for f in dataclasses.fields(VerifyResult):
        a, b = getattr(fast, f.name), getattr(ref, f.name)
        assert a.dtype == b.dtype and a.shape == b.shape, f.name
        assert torch.equal(a.double().nan_to_num(nan=7.0), b.double().nan_to_num(nan=7.0)), f.name
    assert torch.isnan(fast.logit_ratio[5]).all()


def test_small_plain_sample_names_bad_logits():
    from marsrl.verify.sample import sample_plain

    for bad, message in ((float("nan"), "NaN"), (float("inf"), r"\+inf")):
        logits = torch.zeros(2, 8)
        logits[1, 2] = bad
        with pytest.raises(ValueError, match=message):
            sample_plain(logits)
    with pytest.raises(ValueError, match="entirely -inf"):
        sample_plain(torch.full((1, 8), float("-inf")))
