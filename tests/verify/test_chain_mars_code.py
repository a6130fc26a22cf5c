"""mars_code: the released code's sampling branch, with its documented departures from the paper."""

import pytest
import torch

from marsrl.verify import Provenance, verify_chain
from marsrl.verify.reference import reference_behavior_distribution_chain
from tests.stats import assert_distribution

N = 200_000
V = 8
NEAR_TIE = torch.tensor([5.0, 4.7, 3.0, 2.5, 1.0, 0.5, 0.0, -1.0])  # ratio 0.94
CLEAR = torch.tensor([5.0, 3.0, 2.8, 2.5, 1.0, 0.5, 0.0, -1.0])  # ratio 0.6


def _run(row, q, seed, greedy_token=None):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.stack([row, CLEAR]).expand(N, 2, V).contiguous()
    if greedy_token is not None:
        return verify_chain(logits, torch.full((N, 1), greedy_token), rule="mars_code", generator=gen), None
    draft_probs = q.expand(N, 1, V).contiguous()
    tokens = torch.multinomial(draft_probs.view(-1, V), 1, replacement=True, generator=gen).view(N, 1)
    return verify_chain(logits, tokens, draft_probs, rule="mars_code", generator=gen), draft_probs


def _b(row, q, relax):
    top = row.topk(2)
    p = torch.softmax(row.double(), -1)
    return reference_behavior_distribution_chain(
        p, q, int(top.indices[0]), int(top.indices[1]), relax, "mars_code", 1.0
    )


@pytest.mark.parametrize("draft", [0, 1])
def test_top2_draft_above_threshold_is_accepted_without_a_draw(draft):
    res, _ = _run(NEAR_TIE, None, seed=21, greedy_token=draft)
    assert (res.tokens[:, 0] == draft).all()
    assert (res.provenance[:, 0] == Provenance.RELAXED).all()
    assert (res.behavior_logprob[:, 0] == 0).all()


def test_non_top2_draft_above_threshold_closes_from_full_p():
    """The draft (token 3) is not in the top-2 at a near tie: the next token ~ full p, token 3 included."""
    res, _ = _run(NEAR_TIE, None, seed=22, greedy_token=3)
    assert (res.provenance[:, 0] == Provenance.RESAMPLED).all()
    assert_distribution(res.tokens[:, 0], torch.softmax(NEAR_TIE.double(), -1), "mars_code closes from p")
    assert (res.tokens[:, 0] == 3).any()  # strict would never re-emit a rejected one-hot draft


@pytest.mark.parametrize("row_name", ["near_tie", "clear"])
def test_full_draft_matches_enumerated_behaviour(row_name):
    """Monte Carlo (N=200k, seed 23) of the first token against the enumerated behaviour distribution."""
    row = NEAR_TIE if row_name == "near_tie" else CLEAR
    q = torch.tensor([0.2, 0.6, 0.05, 0.05, 0.04, 0.03, 0.02, 0.01])
    res, _ = _run(row, q, seed=23)
    b = _b(row, q, relax=row_name == "near_tie")
    assert_distribution(res.tokens[:, 0], b, f"mars_code {row_name}")
    torch.testing.assert_close(
        res.behavior_logprob[:, 0].double(), b[res.tokens[:, 0]].log(), rtol=0, atol=1e-4
    )
    if row_name == "clear":
        # below the threshold the single-entry residual is NOT lossless for a full draft q
        assert (b - torch.softmax(row.double(), -1)).abs().sum() > 0.02


def test_greedy_draft_below_threshold_is_strict():
    res, _ = _run(CLEAR, None, seed=24, greedy_token=1)
    assert_distribution(res.tokens[:, 0], torch.softmax(CLEAR.double(), -1), "mars_code one-hot, below theta")
    assert not (res.provenance == Provenance.RELAXED).any()


def test_temperature_zero_is_strict():
    gen = torch.Generator().manual_seed(25)
    logits = torch.randn(256, 5, 20, generator=gen) + 3
    logits[..., 1] = logits[..., 0] - 0.05
    tokens = torch.randint(0, 3, (256, 4), generator=gen)
    a = verify_chain(logits, tokens, rule="mars_code", temperature=0.0)
    b = verify_chain(logits, tokens, rule="strict", temperature=0.0)
    for field in a.__dataclass_fields__:
        assert torch.equal(getattr(a, field), getattr(b, field)), field


def test_no_positive_logit_guard():
    """Documented departure: with z1 < 0 the ratio exceeds 1, so mars_code relaxes even at theta = 1."""
    neg = NEAR_TIE - 6.0
    res = verify_chain(
        torch.stack([neg, CLEAR]).expand(1000, 2, V).contiguous(),
        torch.full((1000, 1), 1),
        rule="mars_code",
        theta=1.0,
        generator=torch.Generator().manual_seed(26),
    )
    assert (res.provenance[:, 0] == Provenance.RELAXED).all()
