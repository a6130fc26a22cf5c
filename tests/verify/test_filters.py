"""Sampling filters (top-k / top-p) and the margin rules: T = {t1, t2} is taken within the filtered
support, so a token the filters removed is never relaxed to and no emitted token has p = 0 at T > 0."""

import pytest
import torch

from marsrl.verify import Provenance, verify_chain, verify_tree
from marsrl.verify.dist import sampling_logits
from marsrl.verify.reference import (
    reference_behavior_distribution_chain,
    reference_behavior_distribution_tree,
)
from marsrl.verify.reference import reference_sampling_probs as ref_p
from tests.stats import assert_distribution

# ratio 27.5 / 30 = 0.917 > 0.9 and p(t1) = 0.92 at T = 1: top_p = 0.9 keeps t1 alone
REPRO = torch.tensor([30.0, 27.5, 5.0, 0.0])


@pytest.mark.parametrize(("rule", "lam"), [("mars", 1.0), ("mars", 0.5), ("mars_code", 1.0)])
def test_a_filtered_top2_draft_is_not_relaxed(rule, lam):
    """The reported case: greedy draft [1] (t2, removed by top_p) used to be RELAXED with log p = -inf."""
    res = verify_chain(
        REPRO.expand(1, 2, 4), torch.tensor([[1]]), rule=rule, relax_prob=lam, top_p=0.9,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert res.tokens[0].tolist() == [0, -1]  # rejected; the residual is the point mass on t1
    assert res.provenance[0, 0] == Provenance.RESAMPLED
    assert res.target_logprob[0, 0] == 0 and res.behavior_logprob[0, 0] == 0
    assert res.unsupported_mass[0, 0] == 0
    # a greedy draft of t1 is kept (p(t1) = 1 here; mars_code labels its margin branch RELAXED)
    t1 = verify_chain(REPRO.expand(1, 2, 4), torch.tensor([[0]]), rule=rule, relax_prob=lam, top_p=0.9)
    want = Provenance.RELAXED if rule == "mars_code" else Provenance.ACCEPTED
    assert t1.tokens[0, 0] == 0 and t1.provenance[0, 0] == want


@pytest.mark.parametrize(("rule", "lam"), [("mars", 1.0), ("mars", 0.5), ("mars_code", 1.0)])
def test_a_filtered_top2_sibling_is_not_relaxed(rule, lam):
    """Tree: siblings t2 (filtered) then t1 at the root; the path must go through t1."""
    logits = torch.stack([REPRO, torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([4.0, 3.0, 2.0, 1.0])])
    res = verify_tree(
        logits.unsqueeze(0), torch.tensor([[1, 0]]), torch.tensor([[-1, -1]]), torch.tensor([[0.6, 0.3]]),
        rule=rule, relax_prob=lam, top_p=0.9, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert res.tokens[0, 0] == 0 and res.path_nodes[0, 0] == 1
    assert torch.isfinite(res.target_logprob[res.provenance != Provenance.PAD]).all()


FILTERS = [(1.0, 1, None), (1.0, 2, None), (0.7, 3, 0.8), (1.0, None, 0.5), (1.0, None, 0.9), (0.8, 5, 0.95)]


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), FILTERS)
@pytest.mark.parametrize("dense", [False, True])
def test_no_emitted_token_has_zero_probability(temperature, top_k, top_p, dense):
    """20,000 rows of 4 drafts (seed 61): near ties, drafts from the raw top-3 (greedy) or q ~ softmax;
    every rule; no emitted token (chain or tree) may have target log-prob -inf, and the case that used to
    go wrong (a drafted t2 the filters removed, at a relaxable position) must actually occur."""
    g = torch.Generator().manual_seed(61)
    b, k, v = 20_000, 4, 10
    z = torch.randn(b, k + 1, v, generator=g) * 2 + 4
    z[..., 1] = z[..., 0] - 0.3 * torch.rand(b, k + 1, generator=g)
    if dense:
        q = torch.softmax(z[:, :k] / temperature + torch.randn(b, k, v, generator=g), -1)
        x = torch.multinomial(q.view(-1, v), 1, generator=g).view(b, k)
    else:
        q = None
        x = z[:, :k].topk(3, -1).indices.gather(-1, torch.randint(0, 3, (b, k, 1), generator=g))[..., 0]
    top = z[:, :k].topk(2, -1)
    filt = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    removed_t2 = sampling_logits(z[:, :k], **filt).gather(-1, top.indices[..., 1:]).isinf()[..., 0]
    if top_k != 2:  # top_k = 2 always keeps t2 (the control setting)
        assert ((x == top.indices[..., 1]) & removed_t2).sum() > 100, "the filtered-t2 case is not exercised"
    parents = torch.arange(-1, k - 1).expand(b, k)  # a chain-shaped tree
    for rule, lam in (("mars", 1.0), ("mars", 0.5), ("mars_code", 1.0)):
        kw = dict(rule=rule, relax_prob=lam, generator=torch.Generator().manual_seed(62), **filt)
        chain = verify_chain(z, x, q, **kw)
        tree = verify_tree(z, x, parents, None if q is None else q.gather(-1, x.unsqueeze(-1))[..., 0], **kw)
        for name, res in (("chain", chain), ("tree", tree)):
            emitted = res.provenance != Provenance.PAD
            assert torch.isfinite(res.target_logprob[emitted]).all(), (name, rule, lam)
            assert torch.isfinite(res.behavior_logprob[emitted]).all(), (name, rule, lam)
        if top_k != 1:  # top_k = 1 leaves p a point mass: only mars_code labels anything RELAXED there
            assert (chain.provenance == Provenance.RELAXED).any()


NEAR_TIE = torch.tensor([5.0, 4.7, 3.0, 2.5, 1.0, 0.5, 0.0, -1.0])


@pytest.mark.parametrize("rule", ["mars", "mars_code"])
def test_filtered_sampled_draft_follows_the_enumeration(rule):
    """top_k = 3 keeps t1, t2 and token 2; q over-proposes t2 and the filtered token 3 (N = 200k, seed 63):
    the first token follows the enumerated b over the filtered p, and never lands outside the top 3."""
    n, v = 200_000, 8
    q = torch.tensor([0.2, 0.5, 0.05, 0.2, 0.02, 0.01, 0.01, 0.01])
    gen = torch.Generator().manual_seed(63)
    logits = NEAR_TIE.expand(n, 2, v).contiguous()
    x = torch.multinomial(q.expand(n, v), 1, replacement=True, generator=gen)
    res = verify_chain(logits, x, q.expand(n, 1, v).contiguous(), rule=rule, top_k=3, generator=gen)
    p = ref_p(NEAR_TIE, 1.0, 3)
    assert (p[3:] == 0).all()
    b = reference_behavior_distribution_chain(p, q, 0, 1, True, rule, 1.0)
    assert_distribution(res.tokens[:, 0], b, f"{rule} with top_k = 3")
    assert (res.tokens[:, 0] < 3).all()
    torch.testing.assert_close(
        res.behavior_logprob[:, 0].double(), b[res.tokens[:, 0]].log(), rtol=0, atol=1e-4
    )


def test_filtered_tree_follows_the_enumeration():
    """Root siblings [4, 2, 1] at a near tie with top_k = 3 (token 4 filtered, 2 outside T, 1 = t2),
    mars at relax_prob 0.5 (N = 200k, seed 64): the first token follows the enumerated b."""
    n, v, lam = 200_000, 8, 0.5
    tokens = torch.tensor([4, 2, 1])
    logits = torch.cat([NEAR_TIE.unsqueeze(0), torch.randn(3, v, generator=torch.Generator().manual_seed(0))])
    res = verify_tree(
        logits.expand(n, 4, v).contiguous(), tokens.expand(n, 3), torch.full((n, 3), -1), rule="mars",
        top_k=3, relax_prob=lam, generator=torch.Generator().manual_seed(64),
    )  # fmt: skip
    p = ref_p(NEAR_TIE, 1.0, 3)
    b = reference_behavior_distribution_tree(p, 0, 1, True, [4, 2, 1], [1.0] * 3, "mars", 1.0, lam)
    assert b[3:].sum() == 0 and b[:3].min() > 0.05
    assert_distribution(res.tokens[:, 0], b, "tree mars with top_k = 3")
    torch.testing.assert_close(
        res.behavior_logprob[:, 0].double(), b[res.tokens[:, 0]].log(), rtol=0, atol=1e-4
    )
