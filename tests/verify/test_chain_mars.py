"""The mars rule: closed-form behaviour probabilities, when relaxation may happen, greedy form."""

import pytest
import torch

from marsrl.verify import Provenance, verify_chain
from marsrl.verify.reference import reference_behavior_distribution_chain
from tests.stats import assert_distribution

N = 200_000
V = 8
# near tie at the top: z2 / z1 = 4.7 / 5.0 = 0.94 > 0.9, with p(t1) ~ 0.5, p(t2) ~ 0.37
NEAR_TIE = torch.tensor([5.0, 4.7, 3.0, 2.5, 1.0, 0.5, 0.0, -1.0])
CLEAR = torch.tensor([5.0, 3.0, 2.8, 2.5, 1.0, 0.5, 0.0, -1.0])  # ratio 0.6: never relaxable


def _probs(z, temperature=1.0):
    return torch.softmax(z.double() / temperature, -1)


def _emitted_b(logits_row, q_row, rule, temperature=1.0, theta=0.9):
    top = logits_row.topk(2)
    t1, t2 = int(top.indices[0]), int(top.indices[1])
    z1, z2 = float(top.values[0]), float(top.values[1])
    relax = (z1 > 0 and z2 / z1 > theta) if rule == "mars" else (z1 != 0 and z2 / z1 > theta)
    p = (
        _probs(logits_row, temperature)
        if temperature > 0
        else torch.nn.functional.one_hot(torch.tensor(t1), logits_row.numel()).double()
    )
    return reference_behavior_distribution_chain(p, q_row, t1, t2, relax, rule, temperature)


DRAFTS = {
    # over-proposes the top-2 token at the near tie: relaxation moves residual mass onto it
    "q_overproposes_t2": torch.tensor([0.2, 0.6, 0.05, 0.05, 0.04, 0.03, 0.02, 0.01]),
    # over-proposes both top tokens
    "q_overproposes_both": torch.tensor([0.55, 0.42, 0.01, 0.01, 0.005, 0.003, 0.001, 0.001]),
    # under-proposes the top tokens: relaxation can never trigger (q <= p on t1 and t2), b = p
    "q_underproposes": torch.tensor([0.1, 0.1, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1]),
}


@pytest.mark.parametrize("case", list(DRAFTS))
def test_mars_first_token_matches_closed_form(case):
    """Monte Carlo frequencies of the first emitted token equal the closed-form b (N=200k, seed 11)."""
    gen = torch.Generator().manual_seed(11)
    q = DRAFTS[case]
    logits = torch.stack([NEAR_TIE, CLEAR]).expand(N, 2, V).contiguous()
    draft_probs = q.expand(N, 1, V).contiguous()
    tokens = torch.multinomial(draft_probs.view(-1, V), 1, replacement=True, generator=gen).view(N, 1)
    res = verify_chain(logits, tokens, draft_probs, rule="mars", generator=gen)
    b = _emitted_b(NEAR_TIE, q, "mars")
    assert_distribution(res.tokens[:, 0], b, f"mars {case}")
    # the recorded behaviour log-prob is log b(y) for every emitted first token
    torch.testing.assert_close(
        res.behavior_logprob[:, 0].double(), b[res.tokens[:, 0]].log(), rtol=0, atol=1e-4
    )
    if case == "q_underproposes":
        torch.testing.assert_close(b, _probs(NEAR_TIE), rtol=0, atol=1e-7)
        assert not (res.provenance == Provenance.RELAXED).any()
    else:
        assert (b - _probs(NEAR_TIE)).abs().sum() > 0.05  # the rule really is lossy here
        assert (res.provenance == Provenance.RELAXED).any()


@pytest.mark.parametrize("draft", [0, 1])  # the target's top-1 and top-2 at a near tie
def test_mars_greedy_draft_in_top2_at_near_tie_is_always_accepted(draft):
    gen = torch.Generator().manual_seed(12)
    logits = torch.stack([NEAR_TIE, CLEAR]).expand(N, 2, V).contiguous()
    res = verify_chain(logits, torch.full((N, 1), draft), rule="mars", generator=gen)
    assert (res.tokens[:, 0] == draft).all()
    assert (res.behavior_logprob[:, 0] == 0).all()  # b(x) = 1: emitted with certainty
    relaxed_share = (res.provenance[:, 0] == Provenance.RELAXED).double().mean().item()
    # relaxed exactly when strict would have rejected: share 1 - p(x)
    assert abs(relaxed_share - (1 - _probs(NEAR_TIE)[draft].item())) < 4 * (0.25 / N) ** 0.5


def test_mars_greedy_draft_outside_top2_is_strict():
    gen = torch.Generator().manual_seed(13)
    logits = torch.stack([NEAR_TIE, CLEAR]).expand(N, 2, V).contiguous()
    res = verify_chain(logits, torch.full((N, 1), 2), rule="mars", generator=gen)
    assert_distribution(res.tokens[:, 0], _probs(NEAR_TIE), "mars, draft outside the top-2")
    assert not (res.provenance == Provenance.RELAXED).any()


@pytest.mark.parametrize("theta", [1.0, 1.5, 7.0])
@pytest.mark.parametrize("dense", [False, True])
def test_theta_at_least_one_reproduces_strict_bit_for_bit(theta, dense):
    gen = torch.Generator().manual_seed(14)
    b, k, v = 512, 5, 16
    logits = torch.randn(b, k + 1, v, generator=gen) + 4.0
    logits[..., 1] = logits[..., 0] - 0.01  # many near ties
    q = torch.softmax(torch.randn(b, k, v, generator=gen) * 2, -1) if dense else None
    tokens = torch.randint(0, 2, (b, k), generator=gen)
    strict = verify_chain(logits, tokens, q, rule="strict", generator=torch.Generator().manual_seed(5))
    mars = verify_chain(
        logits, tokens, q, rule="mars", theta=theta, generator=torch.Generator().manual_seed(5)
    )
    for field in strict.__dataclass_fields__:
        assert torch.equal(getattr(strict, field), getattr(mars, field)), field
    # and with the default theta the same inputs do relax, so the comparison above is not vacuous
    relaxed = verify_chain(logits, tokens, q, rule="mars", generator=torch.Generator().manual_seed(5))
    assert (relaxed.provenance == Provenance.RELAXED).any()


@pytest.mark.parametrize("dense", [False, True])
def test_relaxed_only_where_the_rule_allows(dense):
    """RELAXED => x in {t1, t2}, z1 > 0, z2/z1 > theta, and the strict test (same uniforms) rejected."""
    seed, b, k, v, theta = 15, 4000, 4, 12, 0.9
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=gen) * 1.5 + 2.0
    logits[: b // 4] -= 6.0  # a quarter of rows with all-negative logits (z1 <= 0)
    q = torch.softmax(logits[:, :k] + torch.randn(b, k, v, generator=gen), -1) if dense else None
    if dense:
        tokens = torch.multinomial(q.view(-1, v), 1, generator=gen).view(b, k)
    else:
        tokens = (
            logits[:, :k]
            .topk(3, -1)
            .indices.gather(-1, torch.randint(0, 3, (b, k, 1), generator=gen))[..., 0]
        )
    run_gen = torch.Generator().manual_seed(99)
    res = verify_chain(logits, tokens, q, rule="mars", theta=theta, generator=run_gen)
    u = torch.rand((b, k + 1), dtype=torch.float64, generator=torch.Generator().manual_seed(99))
    top = logits.topk(2, -1)
    z1, z2 = top.values[..., 0], top.values[..., 1]
    p = torch.softmax(logits.double(), -1)
    relaxed = res.provenance[:, :k] == Provenance.RELAXED
    assert relaxed.sum() > 50, "inputs too easy: nothing relaxed"
    rows, cols = relaxed.nonzero(as_tuple=True)
    x = tokens[rows, cols]
    assert ((x == top.indices[rows, cols, 0]) | (x == top.indices[rows, cols, 1])).all()
    assert (z1[rows, cols] > 0).all()
    assert (z2[rows, cols] / z1[rows, cols] > theta).all()
    q_x = q[rows, cols, x].double() if dense else torch.ones(len(x), dtype=torch.float64)
    assert (u[rows, cols] * q_x >= p[rows, cols, x]).all(), (
        "a token the strict test accepted was labelled RELAXED"
    )
    assert not (res.provenance[: b // 4] == Provenance.RELAXED).any()  # never where z1 <= 0


def test_never_relaxes_when_top_logit_is_not_positive():
    """All-negative logits with a ratio > theta (z2/z1 = 1.05): mars must behave exactly as strict."""
    gen = torch.Generator().manual_seed(16)
    neg = NEAR_TIE - 6.0  # z1 = -1.0, z2 = -1.3: ratio 1.3
    logits = torch.stack([neg, CLEAR]).expand(N, 2, V).contiguous()
    tokens = torch.full((N, 1), 1)
    strict = verify_chain(logits, tokens, rule="strict", generator=torch.Generator().manual_seed(3))
    mars = verify_chain(logits, tokens, rule="mars", generator=torch.Generator().manual_seed(3))
    assert torch.equal(strict.tokens, mars.tokens)
    assert not (mars.provenance == Provenance.RELAXED).any()
    assert_distribution(mars.tokens[:, 0], _probs(neg), "mars with z1 <= 0")
    del gen


def test_greedy_mars():
    """T = 0: accept top-1; relax a top-2 draft only when z2/z1 > theta; otherwise emit top-1."""
    logits = torch.stack(
        [
            torch.stack([NEAR_TIE, NEAR_TIE, CLEAR]),  # row 0: drafts t1, t2 -> accepted, relaxed
            torch.stack([CLEAR, NEAR_TIE, CLEAR]),  # row 1: draft t2 at a clear margin -> rejected
            torch.stack([NEAR_TIE, NEAR_TIE, CLEAR]),  # row 2: draft outside the top-2 -> rejected
            torch.stack([NEAR_TIE - 6, NEAR_TIE, CLEAR]),  # row 3: t2 at a ratio > theta but z1 < 0
        ]
    )
    tokens = torch.tensor([[0, 1], [1, 1], [3, 0], [1, 0]])
    res = verify_chain(logits, tokens, rule="mars", temperature=0.0)
    P = Provenance
    assert res.tokens.tolist() == [[0, 1, 0], [0, -1, -1], [0, -1, -1], [0, -1, -1]]
    assert res.provenance.tolist() == [
        [P.ACCEPTED, P.RELAXED, P.BONUS],
        [P.RESAMPLED, P.PAD, P.PAD],
        [P.RESAMPLED, P.PAD, P.PAD],
        [P.RESAMPLED, P.PAD, P.PAD],
    ]
    assert res.is_top2.tolist()[0] == [False, True, False]
    assert res.behavior_logprob[0].tolist() == [0.0, 0.0, 0.0]
    assert res.target_logprob[0, 1].item() == float("-inf")  # greedy sampling never emits t2
    # strict greedy on the same inputs rejects the relaxed draft
    strict = verify_chain(logits, tokens, rule="strict", temperature=0.0)
    assert strict.tokens[0].tolist() == [0, 0, -1]


def test_greedy_mars_behaviour_with_a_full_draft():
    """At T = 0 with a full draft q the behaviour is b(t2) = q(t2) under R, b(t1) = 1 - q(t2)."""
    q = DRAFTS["q_overproposes_t2"]
    b = verify_chain(
        NEAR_TIE.expand(2, 2, V).contiguous(),
        torch.tensor([[1], [0]]),
        q.expand(2, 1, V).contiguous(),
        rule="mars",
        temperature=0.0,
    )
    expected = _emitted_b(NEAR_TIE, q, "mars", temperature=0.0)
    assert abs(expected[1].item() - q[1].item()) < 1e-7 and abs(expected[0].item() - (1 - q[1].item())) < 1e-7
    torch.testing.assert_close(b.behavior_logprob[:, 0].double(), expected[[1, 0]].log(), rtol=0, atol=1e-6)
