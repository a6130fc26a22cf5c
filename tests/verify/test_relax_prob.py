"""relax_prob (lambda): mars relaxes with probability lambda once the strict test failed, reading the same
uniform.  Endpoints bit for bit (0 = strict, 1 = the paper), the closed form b = p + lam delta - lam D res
by enumeration and Monte Carlo, the importance-weight bounds, and argument checks."""

import math

import pytest
import torch

from marsrl.engine import EngineConfig
from marsrl.verify import Provenance, verify_chain, verify_tree
from marsrl.verify.dist import dist_logp, target_dist
from marsrl.verify.reference import (
    reference_behavior_distribution_chain,
    reference_behavior_distribution_tree,
)
from tests.stats import assert_distribution
from tests.verify.test_tree import NODE_LOGITS, PARENTS, ROOT, TOKENS

N = 200_000
V = 8
NEAR_TIE = torch.tensor([5.0, 4.7, 3.0, 2.5, 1.0, 0.5, 0.0, -1.0])  # z2/z1 = 0.94: relaxable
CLEAR = torch.tensor([5.0, 3.0, 2.8, 2.5, 1.0, 0.5, 0.0, -1.0])
P = torch.softmax(NEAR_TIE.double(), -1)
DRAFTS = {
    "overproposes_t2": torch.tensor([0.2, 0.6, 0.05, 0.05, 0.04, 0.03, 0.02, 0.01]),
    "overproposes_both": torch.tensor([0.55, 0.42, 0.01, 0.01, 0.005, 0.003, 0.001, 0.001]),
}


def closed_form_b(p, q, t1, t2, relaxable, lam):
    """The spec's b(y) = p(y) + lam delta(y) - lam D res(y), written out independently of the library."""
    delta = torch.zeros_like(p)
    for v in (t1, t2):
        delta[v] = float(relaxable) * max(0.0, float(q[v] - p[v]))
    res = (p - q).clamp_min(0)
    res = res / res.sum()
    return p + lam * delta - lam * delta.sum() * res


def _same(a, b, fields=None):
    for name in fields or a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x.nan_to_num(), y.nan_to_num()), name
        if x.is_floating_point():
            assert torch.equal(x.isnan(), y.isnan()), name


def _chain_inputs(seed, dense, b=256, k=4, v=12):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g) * 2 + 2.0
    logits[..., 1] = logits[..., 0] - 0.2 * torch.rand(b, k + 1, generator=g)  # many near ties
    if dense:
        q = torch.softmax(torch.randn(b, k, v, generator=g) + logits[:, :k], -1)
        x = torch.multinomial(q.view(-1, v), 1, generator=g).view(b, k)
    else:
        q = None
        x = logits[:, :k].topk(3, -1).indices.gather(-1, torch.randint(0, 3, (b, k, 1), generator=g))[..., 0]
    return logits, x, q


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, None, None), (0.7, 6, 0.95), (0.0, None, None)]
)
def test_chain_endpoints_bit_for_bit(dense, temperature, top_k, top_p):
    """relax_prob = 0 is strict and 1 is the default mars, every field, same generator seed."""
    logits, x, q = _chain_inputs(41, dense)
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)

    def run(**extra):
        return verify_chain(logits, x, q, generator=torch.Generator().manual_seed(7), **kw, **extra)

    _same(run(rule="mars", relax_prob=0.0), run(rule="strict"))
    _same(run(rule="mars", relax_prob=1.0), run(rule="mars"))
    assert (run(rule="mars").provenance == Provenance.RELAXED).any()  # so the comparison above is not vacuous


@pytest.mark.parametrize("use_q", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_tree_endpoints_bit_for_bit(use_q, temperature):
    g = torch.Generator().manual_seed(42)
    b = 512
    logits = NODE_LOGITS.expand(b, 8, V) + 0.3 * torch.randn(b, 8, V, generator=g)
    q = torch.rand(b, 7, generator=g) * 0.9 + 0.05 if use_q else None
    args = (logits, TOKENS.expand(b, 7), PARENTS.expand(b, 7), q)

    def run(**kw):
        return verify_tree(*args, temperature=temperature, generator=torch.Generator().manual_seed(8), **kw)

    _same(run(rule="mars", relax_prob=0.0), run(rule="strict"))
    _same(run(rule="mars", relax_prob=1.0), run(rule="mars"))
    assert (run(rule="mars").provenance == Provenance.RELAXED).any()


@pytest.mark.parametrize("lam", [0.25, 0.6])
@pytest.mark.parametrize("case", list(DRAFTS))
def test_chain_sampled_draft_follows_the_closed_form(case, lam):
    """First emitted token ~ b (N = 200k, seed 43); closed form = enumeration; recorded log b exact."""
    q = DRAFTS[case]
    gen = torch.Generator().manual_seed(43)
    logits = torch.stack([NEAR_TIE, CLEAR]).expand(N, 2, V).contiguous()
    draft_probs = q.expand(N, 1, V).contiguous()
    x = torch.multinomial(draft_probs.view(-1, V), 1, replacement=True, generator=gen).view(N, 1)
    res = verify_chain(logits, x, draft_probs, rule="mars", relax_prob=lam, generator=gen)
    q64 = q.double() / q.double().sum()  # the closed form assumes sum(q) = 1 exactly (float32 is 3e-8 off)
    b = closed_form_b(P, q64, 0, 1, True, lam)
    enumerated = reference_behavior_distribution_chain(P, q64, 0, 1, True, "mars", 1.0, lam)
    torch.testing.assert_close(b, enumerated, rtol=0, atol=1e-12)
    assert_distribution(res.tokens[:, 0], b, f"mars lam={lam} {case}")
    torch.testing.assert_close(
        res.behavior_logprob[:, 0].double(), b[res.tokens[:, 0]].log(), rtol=0, atol=1e-4
    )
    # strictly between strict and the paper's rule: the relaxation really is partial
    b1 = closed_form_b(P, q64, 0, 1, True, 1.0)
    assert (b - P).abs().sum() > 0.02 and (b - b1).abs().sum() > 0.02


@pytest.mark.parametrize("lam", [0.3, 0.8])
@pytest.mark.parametrize("draft", [0, 1])
def test_chain_greedy_draft_in_the_top2(draft, lam):
    """Greedy x in {t1, t2} at a near tie: b(x) = p(x) + lam (1 - p(x)), b(y) = (1 - lam) p(y) otherwise;
    RELAXED exactly on p(x) <= u < p(x) + lam (1 - p(x)) of the regenerated uniforms (N = 200k, seed 44)."""
    logits = torch.stack([NEAR_TIE, CLEAR]).expand(N, 2, V).contiguous()
    res = verify_chain(
        logits,
        torch.full((N, 1), draft),
        rule="mars",
        relax_prob=lam,
        generator=torch.Generator().manual_seed(44),
    )
    want = (1 - lam) * P
    want[draft] = P[draft] + lam * (1 - P[draft])
    torch.testing.assert_close(
        want, closed_form_b(P, torch.eye(V, dtype=torch.float64)[draft], 0, 1, True, lam)
    )
    assert_distribution(res.tokens[:, 0], want, f"greedy draft {draft}, lam={lam}")
    torch.testing.assert_close(
        res.behavior_logprob[:, 0].double(), want[res.tokens[:, 0]].log(), rtol=0, atol=1e-5
    )
    u = torch.rand((N, 2), dtype=torch.float64, generator=torch.Generator().manual_seed(44))[:, 0]
    a = dist_logp(
        target_dist(NEAR_TIE, 1.0), torch.tensor(draft)
    ).exp()  # p(x) exactly as the verifier has it
    relaxed = res.provenance[:, 0] == Provenance.RELAXED
    band = (u >= a) & (u < a + lam * (1 - a))
    assert torch.equal(relaxed, band)
    assert torch.equal(res.provenance[:, 0] == Provenance.ACCEPTED, u < a)


def test_tree_follows_enumeration_and_reaches_the_bound():
    """Root siblings t1, t2, token 4 at a near tie (N = 200k, seed 45, lam = 0.5): the first token ~ the
    enumerated b, and every token other than t1, t2 has b = (1 - lam)^2 p: the tree bound is attained."""
    lam = 0.5
    res = verify_tree(
        NODE_LOGITS.expand(N, 8, V).contiguous(),
        TOKENS.expand(N, 7),
        PARENTS.expand(N, 7),
        rule="mars",
        relax_prob=lam,
        generator=torch.Generator().manual_seed(45),
    )
    p = torch.softmax(ROOT.double(), -1)
    b = reference_behavior_distribution_tree(p, 0, 1, True, [0, 1, 4], [1.0] * 3, "mars", 1.0, lam)
    torch.testing.assert_close(b[2:], (1 - lam) ** 2 * p[2:], rtol=0, atol=1e-12)
    assert_distribution(res.tokens[:, 0], b, "tree mars lam=0.5, first token")
    torch.testing.assert_close(
        res.behavior_logprob[:, 0].double(), b[res.tokens[:, 0]].log(), rtol=0, atol=1e-4
    )
    # second token under n0 (token 0): siblings 2 and 5 nearly tied there (t1 = 2, t2 = 5)
    rows = res.path_nodes[:, 0] == 0
    p0 = torch.softmax(NODE_LOGITS[1].double(), -1)
    b0 = reference_behavior_distribution_tree(p0, 2, 5, True, [2, 5], [1.0] * 2, "mars", 1.0, lam)
    assert_distribution(res.tokens[rows, 1], b0, "tree mars lam=0.5, second token | n0")


@pytest.mark.parametrize("lam", [0.1, 0.5, 0.9])
def test_importance_weight_bounds_by_enumeration(lam):
    """b >= (1 - lam) p at every chain position and b >= (1 - lam)^2 p at every tree node (2,000 random
    instances each, seed 46, near ties, sampled and greedy drafts, random sibling lists)."""
    g = torch.Generator().manual_seed(46)
    worst_chain = worst_tree = math.inf
    for _ in range(2000):
        v = 6
        z = torch.randn(v, generator=g).double() + 3
        z[1] = z[0] - 0.1
        p = torch.softmax(z, -1)
        t1, t2 = z.topk(2).indices.tolist()
        q = torch.softmax(torch.randn(v, generator=g).double() * 2, -1)
        if torch.rand(1, generator=g) < 0.3:
            q = torch.eye(v, dtype=torch.float64)[int(torch.randint(0, 2, (1,), generator=g))]
        b = reference_behavior_distribution_chain(p, q, t1, t2, True, "mars", 1.0, lam)
        worst_chain = min(worst_chain, float((b / p).min()))
        sibs = torch.randperm(v, generator=g)[: int(torch.randint(1, v, (1,), generator=g))].tolist()
        bt = reference_behavior_distribution_tree(p, t1, t2, True, sibs, [1.0] * len(sibs), "mars", 1.0, lam)
        worst_tree = min(worst_tree, float((bt / p).min()))
    assert worst_chain >= (1 - lam) - 1e-12
    assert worst_tree >= (1 - lam) ** 2 - 1e-12
    assert worst_tree < (1 - lam) + 1e-9  # the tree really can go below the chain's bound


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.5"])
def test_relax_prob_outside_the_unit_interval_is_refused(bad):
    logits, x, _ = _chain_inputs(0, False, b=4)
    with pytest.raises(ValueError, match="relax_prob"):
        verify_chain(logits, x, rule="mars", relax_prob=bad)
    with pytest.raises(ValueError, match="relax_prob"):
        verify_tree(logits, x, torch.full_like(x, -1), rule="mars", relax_prob=bad)
    with pytest.raises(ValueError, match="relax_prob"):
        EngineConfig(rule="mars", relax_prob=bad)


def test_relax_prob_refused_for_mars_code_and_between_0_and_1_when_greedy():
    logits, x, _ = _chain_inputs(0, False, b=4)
    with pytest.raises(ValueError, match=r"relax_prob.*mars_code"):
        verify_chain(logits, x, rule="mars_code", relax_prob=0.5)
    with pytest.raises(ValueError, match=r"relax_prob.*mars_code"):
        EngineConfig(rule="mars_code", relax_prob=0.0)
    with pytest.raises(ValueError, match=r"relax_prob.*temperature 0"):
        verify_chain(logits, x, rule="mars", temperature=0.0, relax_prob=0.5)
    with pytest.raises(ValueError, match=r"relax_prob.*temperature 0"):
        verify_tree(logits, x, torch.full_like(x, -1), rule="mars", temperature=0.0, relax_prob=0.5)
    for lam in (0.0, 1.0):  # the two greedy rules
        verify_chain(logits, x, rule="mars", temperature=0.0, relax_prob=lam)
    verify_chain(logits, x, rule="strict", relax_prob=0.5)  # strict never relaxes: lam has no effect
    assert EngineConfig(rule="mars", relax_prob=0.25).relax_prob == 0.25
