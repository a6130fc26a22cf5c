"""Strict chain verification is lossless: sampling matches the target exactly, greedy follows argmax."""

import pytest
import torch

from marsrl.verify import Provenance, verify_chain
from marsrl.verify.reference import reference_sampling_probs
from tests.stats import assert_distribution

N = 200_000  # Monte Carlo rows per case (one batched call)
V = 8
# two positions of fixed target logits (the second position's distribution is independent of the first)
Z = torch.tensor(
    [
        [2.0, 1.6, 1.1, 0.4, 0.0, -0.5, -1.0, -2.0],
        [0.3, 1.9, -0.2, 1.2, 0.8, -1.0, 0.5, 0.1],
        [1.0, 0.0, 0.5, 2.0, -1.0, 0.2, 0.9, -0.3],
    ]
)


def _draft_cases():
    far = torch.tensor([0.001, 0.001, 0.001, 0.002, 0.005, 0.19, 0.4, 0.4])  # mass where p is small
    close = torch.softmax(Z[:2] + 0.3 * torch.tensor([1.0, -1, 0.5, 0, -0.5, 1, 0, -1]), -1)
    return {
        "q_far_from_p": far.expand(2, V),
        "q_close_to_p": close,
        "q_uniform": torch.full((2, V), 1.0 / V),
    }


def _run(q0: torch.Tensor, q1: torch.Tensor, seed: int, **kw):
    """N rows of the same logits; draft j sampled from q_j [V] (K = 2); strict verification."""
    gen = torch.Generator().manual_seed(seed)
    logits = Z.expand(N, 3, V).contiguous()
    draft_probs = torch.stack([q0, q1]).expand(N, 2, V).contiguous()
    tokens = torch.multinomial(draft_probs.view(-1, V), 1, replacement=True, generator=gen).view(N, 2)
    return verify_chain(logits, tokens, draft_probs, rule="strict", generator=gen, **kw)


def _point_mass(token: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), V).float()


@pytest.mark.parametrize("case", list(_draft_cases()))
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, None, None), (0.7, 5, 0.9)])
def test_strict_sampling_matches_target(case, temperature, top_k, top_p):
    q = _draft_cases()[case]
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    p = [reference_sampling_probs(Z[j], temperature, top_k, top_p) for j in range(3)]
    # first emitted token, with this draft at both positions
    res = _run(q[0], q[1], seed=1, **kw)
    assert_distribution(res.tokens[:, 0], p[0], f"{case}: first token")
    assert not (res.provenance == Provenance.RELAXED).any()
    emitted = res.provenance != Provenance.PAD
    torch.testing.assert_close(res.behavior_logprob[emitted], res.target_logprob[emitted])
    # second emitted token given the first draft was accepted: draft 0 proposes the argmax (accepted
    # often, so the conditional sample is large), draft 1 comes from the case's q
    res = _run(_point_mass(0), q[1], seed=2, **kw)
    first_accepted = res.num_emitted >= 2
    assert first_accepted.sum() > 50_000
    assert_distribution(res.tokens[first_accepted, 1], p[1], f"{case}: second token | first accepted")


@pytest.mark.parametrize("draft_token", [0, 3, 7])  # the target's argmax, a middling token, the least likely
def test_strict_one_hot_draft_matches_target(draft_token):
    gen = torch.Generator().manual_seed(2)
    logits = Z.expand(N, 3, V).contiguous()
    res = verify_chain(logits, torch.full((N, 2), draft_token), None, rule="strict", generator=gen)
    p = [torch.softmax(Z[j].double(), -1) for j in range(2)]
    assert_distribution(res.tokens[:, 0], p[0], "one-hot draft: first token")
    # acceptance rate of a one-hot draft is p(x)
    rate = (res.num_emitted >= 2).double().mean().item()
    assert abs(rate - p[0][draft_token].item()) < 4 * (0.25 / N) ** 0.5
    # the second token given an accepted first draft (draft 0 = argmax, so the sample is large)
    tokens = torch.stack([torch.zeros(N, dtype=torch.long), torch.full((N,), draft_token)], 1)
    res = verify_chain(logits, tokens, None, rule="strict", generator=gen)
    accepted = res.num_emitted >= 2
    assert_distribution(res.tokens[accepted, 1], p[1], "one-hot draft: second token | first accepted")


def test_strict_greedy_follows_argmax_path():
    gen = torch.Generator().manual_seed(3)
    b, k, v = 64, 6, 50
    logits = torch.randn(b, k + 1, v, generator=gen) * 3
    argmax = logits.argmax(-1)  # [B, K+1]
    # drafts agree with the argmax path for a random prefix, then diverge
    agree = torch.randint(0, k + 1, (b,), generator=gen)
    tokens = torch.where(torch.arange(k) < agree[:, None], argmax[:, :k], (argmax[:, :k] + 1) % v)
    res = verify_chain(logits, tokens, rule="strict", temperature=0.0)
    assert torch.equal(res.num_emitted, agree + 1)
    for i in range(b):
        n = int(res.num_emitted[i])
        assert res.tokens[i, :n].tolist() == argmax[i, :n].tolist()
        assert (res.tokens[i, n:] == -1).all()
    close = res.provenance[torch.arange(b), agree]
    assert torch.equal(close == Provenance.BONUS, agree == k)
    assert ((close == Provenance.RESAMPLED) == (agree < k)).all()
    emitted = res.provenance != Provenance.PAD
    assert (res.behavior_logprob[emitted] == 0).all() and (res.target_logprob[emitted] == 0).all()


def test_same_generator_seed_same_result():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(32, 5, 30, generator=gen)
    tokens = torch.randint(0, 30, (32, 4), generator=gen)
    a = verify_chain(logits, tokens, generator=torch.Generator().manual_seed(9))
    b = verify_chain(logits, tokens, generator=torch.Generator().manual_seed(9))
    c = verify_chain(logits, tokens, generator=torch.Generator().manual_seed(10))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.behavior_logprob, b.behavior_logprob)
    assert not torch.equal(a.tokens, c.tokens)


def test_records_under_filters_and_raw_ratio():
    """target_logprob is under the filtered, tempered distribution; logit_ratio on the raw logits."""
    gen = torch.Generator().manual_seed(5)
    b, k, v = 40, 3, 20
    logits = torch.randn(b, k + 1, v, generator=gen) * 2 + 1
    tokens = logits[:, :k].topk(3, -1).indices[..., 2]  # the third-best token: often outside top_k=2
    res = verify_chain(logits, tokens, rule="strict", temperature=0.5, top_k=2, top_p=0.95, generator=gen)
    for i in range(b):
        for j in range(int(res.num_emitted[i])):
            y = int(res.tokens[i, j])
            p = reference_sampling_probs(logits[i, j], 0.5, 2, 0.95)
            assert p[y] > 0, "a token outside top-k/top-p was emitted"
            assert abs(res.target_logprob[i, j].item() - p[y].log().item()) < 1e-5
            top = logits[i, j].topk(2).values
            assert abs(res.logit_ratio[i, j].item() - (top[1] / top[0]).item()) < 1e-6
            assert bool(res.is_top2[i, j]) == (y == int(logits[i, j].topk(2).indices[1]))
