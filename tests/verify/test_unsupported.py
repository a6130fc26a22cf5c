"""unsupported_mass: the target's mass at a position on tokens the procedure can never emit there.

Monte Carlo: with every reachable token's b large enough to be seen in N draws (checked from the
enumerated b: N * min b > 20, so a miss has chance < e^-20), the tokens never seen must carry exactly the
recorded mass; a wrong closed form fails by its error.  Enumeration: the closed forms against the
reference's reachability walk on random instances built to hit the nonzero cases."""

import pytest
import torch

from marsrl.verify import verify_chain, verify_tree
from marsrl.verify.reference import (
    reference_behavior_distribution_chain,
    reference_behavior_distribution_tree,
    reference_sampling_probs,
    reference_top2,
    reference_unsupported_mass_chain,
)
from tests.verify.test_tree import NODE_LOGITS, PARENTS, ROOT, TOKENS

N = 200_000
V = 8
NEAR_TIE = torch.tensor([5.0, 4.7, 3.0, 2.5, 1.0, 0.5, 0.0, -1.0])  # t1 = 0, t2 = 1, ratio 0.94
CLEAR = torch.tensor([5.0, 3.0, 2.8, 2.5, 1.0, 0.5, 0.0, -1.0])  # ratio 0.6
P = torch.softmax(NEAR_TIE.double(), -1)  # ~ [.50, .37, .068, .041, .009, .006, .003, .001]


def _assert_unseen_mass(tokens, p, b, recorded, what):
    """tokens: N draws at one position; p the target's distribution there; b the enumerated behaviour."""
    assert float(b[b > 0].min()) * tokens.numel() > 20, f"{what}: N too small to see every reachable token"
    seen = torch.bincount(tokens, minlength=p.numel()) > 0
    assert torch.equal(seen, b > 0), f"{what}: seen {seen.tolist()} but b > 0 on {(b > 0).tolist()}"
    assert (recorded == recorded[0]).all()
    assert abs(float(p[~seen].sum()) - float(recorded[0])) < 1e-6, (what, float(recorded[0]))


ONE_HOT_CASES = [  # (draft, rule, relax_prob, expected mass)
    (0, "mars", 1.0, 1 - P[0]),  # t1 relaxed for sure: every other token is out of reach
    (1, "mars", 1.0, 1 - P[1]),
    (2, "mars", 1.0, 0.0),  # outside the top-2: strict
    (0, "mars", 0.5, 0.0),  # b >= (1 - lam) p
    (1, "mars_code", 1.0, 1 - P[1]),
    (1, "strict", 1.0, 0.0),
]


@pytest.mark.parametrize(("draft", "rule", "lam", "expected"), ONE_HOT_CASES)
def test_chain_greedy_draft_monte_carlo(draft, rule, lam, expected):
    """N = 200k rounds of one greedy draft at a near tie (seed 51)."""
    logits = torch.stack([NEAR_TIE, CLEAR]).expand(N, 2, V).contiguous()
    res = verify_chain(
        logits,
        torch.full((N, 1), draft),
        rule=rule,
        relax_prob=lam,
        generator=torch.Generator().manual_seed(51),
    )
    q = torch.eye(V, dtype=torch.float64)[draft]
    b = reference_behavior_distribution_chain(P, q, 0, 1, True, rule, 1.0, lam)
    assert abs(float(res.unsupported_mass[0, 0]) - float(expected)) < 1e-6
    _assert_unseen_mass(res.tokens[:, 0], P, b, res.unsupported_mass[:, 0], f"{rule} lam={lam} x={draft}")
    assert (res.unsupported_mass[:, 1:][res.provenance[:, 1:] != 0] == 0).all()  # the bonus: b = p


DENSE_CASES = {  # name: (q, rule, expected mass)
    # over-proposes t1 and t2 only: every strict failure is relaxed, tokens 4..7 (q = 0) are out of reach
    "mars_top_only": ([0.55, 0.38, 0.05, 0.02, 0, 0, 0, 0], "mars", float(P[4:].sum())),
    # also over-proposes token 2 (outside T): rejections happen, every token is reachable
    "mars_spill": ([0.45, 0.4, 0.15, 0, 0, 0, 0, 0], "mars", 0.0),
    "code_top_only": ([0.55, 0.45, 0, 0, 0, 0, 0, 0], "mars_code", float(1 - P[0] - P[1])),
    "code_spill": ([0.5, 0.4, 0.1, 0, 0, 0, 0, 0], "mars_code", 0.0),
}


@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_chain_sampled_draft_monte_carlo(case):
    """N = 200k rounds with x ~ q at a near tie (seed 52)."""
    q_list, rule, expected = DENSE_CASES[case]
    q = torch.tensor(q_list)
    gen = torch.Generator().manual_seed(52)
    logits = torch.stack([NEAR_TIE, CLEAR]).expand(N, 2, V).contiguous()
    draft_probs = q.expand(N, 1, V).contiguous()
    x = torch.multinomial(draft_probs.view(-1, V), 1, replacement=True, generator=gen).view(N, 1)
    res = verify_chain(logits, x, draft_probs, rule=rule, generator=gen)
    b = reference_behavior_distribution_chain(P, q, 0, 1, True, rule, 1.0)
    assert abs(float(res.unsupported_mass[0, 0]) - expected) < 1e-6
    _assert_unseen_mass(res.tokens[:, 0], P, b, res.unsupported_mass[:, 0], case)


def test_chain_greedy_verification_with_a_full_draft():
    """T = 0 with a full q: mars relaxes t2 for sure; t1 (all of p) is out of reach iff q proposes only t2."""
    logits = NEAR_TIE.expand(3, 2, V).contiguous()
    q = torch.zeros(3, 1, V)
    q[0, 0, 1] = 1.0  # only t2
    q[1, 0, :2] = torch.tensor([0.3, 0.7])
    q[2, 0, [1, 5]] = torch.tensor([0.9, 0.1])  # a token outside T: mars rejects it and emits t1
    res = verify_chain(logits, torch.tensor([[1], [1], [1]]), q, rule="mars", temperature=0.0)
    assert res.unsupported_mass[:, 0].tolist() == [1.0, 0.0, 0.0]
    strict = verify_chain(logits, torch.tensor([[1], [1], [1]]), q, rule="strict", temperature=0.0)
    assert (strict.unsupported_mass == 0).all()


@pytest.mark.parametrize(("rule", "lam"), [("mars", 1.0), ("mars", 0.5), ("mars_code", 1.0)])
@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_chain_closed_form_matches_enumeration(rule, lam, temperature):
    """1,500 random positions (seed 53): near ties, drafts on a random subset of tokens (often only the
    top-2, sometimes one-hot), closed form vs the reference's reachability walk."""
    if temperature == 0 and (lam != 1 or rule == "mars_code"):
        pytest.skip("greedy: mars_code is strict, and lam must be 0 or 1")
    g = torch.Generator().manual_seed(53)
    b, v = 1500, 10
    z = torch.randn(b, 2, v, generator=g) * 2 + 3
    z[:, 0, 1] = z[:, 0, 0] - 0.3 * torch.rand(b, generator=g)
    keep = torch.rand(b, v, generator=g) < 0.3
    keep[:, :2] |= torch.rand(b, 1, generator=g) < 0.8
    q = torch.softmax(torch.randn(b, v, generator=g) * 2, -1) * keep
    q[q.sum(-1) == 0, 0] = 1.0
    q = q / q.sum(-1, keepdim=True)
    x = torch.multinomial(q, 1, generator=g)
    kw = dict(rule=rule, temperature=temperature, relax_prob=lam, theta=0.8)
    fast = verify_chain(z, x, q.unsqueeze(1), generator=torch.Generator().manual_seed(1), **kw)
    one_hot = verify_chain(z, x, generator=torch.Generator().manual_seed(1), **kw)  # the same x, greedy
    nonzero = 0
    for i in range(b):
        t1, t2, z1, z2 = reference_top2(z[i, 0])
        relax = (z1 > 0 and z2 / z1 > 0.8) if rule == "mars" else (z2 / z1 > 0.8)
        p = reference_sampling_probs(z[i, 0], temperature)
        want = reference_unsupported_mass_chain(p, q[i], t1, t2, relax, rule, temperature, lam)
        assert abs(float(fast.unsupported_mass[i, 0]) - want) < 1e-6, (i, want)
        onehot_q = torch.eye(v, dtype=torch.float64)[int(x[i])]
        want1 = reference_unsupported_mass_chain(p, onehot_q, t1, t2, relax, rule, temperature, lam)
        assert abs(float(one_hot.unsupported_mass[i, 0]) - want1) < 1e-6, (i, want1)
        nonzero += (want > 0) + (want1 > 0)
    assert (nonzero > 50) == (lam == 1), nonzero  # the nonzero cases really were exercised


def _tree(rule, lam, q=None, seed=54, logits=NODE_LOGITS, tokens=TOKENS, parents=PARENTS):
    n = tokens.numel()
    return verify_tree(
        logits.expand(N, n + 1, V).contiguous(),
        tokens.expand(N, n),
        parents.expand(N, n),
        None if q is None else q.expand(N, n).contiguous(),
        rule=rule,
        relax_prob=lam,
        generator=torch.Generator().manual_seed(seed),
    )


@pytest.mark.parametrize(
    ("lam", "expected"), [(1.0, float(1 - torch.softmax(ROOT.double(), -1)[0])), (0.5, 0.0)]
)
def test_tree_root_monte_carlo(lam, expected):
    """Root siblings t1, t2, token 4 at a near tie (N = 200k, seed 54): at lam = 1 t1 (the first sibling)
    is taken for sure, so everything but t1 is out of reach; at 0.5 every token is reachable."""
    res = _tree("mars", lam)
    p = torch.softmax(ROOT.double(), -1)
    b = reference_behavior_distribution_tree(p, 0, 1, True, [0, 1, 4], [1.0] * 3, "mars", 1.0, lam)
    assert abs(float(res.unsupported_mass[0, 0]) - expected) < 1e-6
    _assert_unseen_mass(res.tokens[:, 0], p, b, res.unsupported_mass[:, 0], f"tree root lam={lam}")


def test_tree_mars_code_cuts_off_below_the_threshold():
    """mars_code's sibling test uses the draft's probability: a sibling with p(s) >= q(s) is taken for
    certain with no near tie at all (N = 200k, seed 55); the rest of p is then out of reach."""
    logits = torch.stack([CLEAR, NEAR_TIE])  # root: ratio 0.6 (no relaxation); the child's row unused
    res = _tree("mars_code", 1.0, q=torch.tensor([0.3]), seed=55, logits=logits, tokens=torch.tensor([0]),
                parents=torch.tensor([-1]))  # fmt: skip
    p = torch.softmax(CLEAR.double(), -1)
    b = reference_behavior_distribution_tree(p, 0, 1, False, [0], [0.3], "mars_code", 1.0)
    assert abs(float(res.unsupported_mass[0, 0]) - float(1 - p[0])) < 1e-6
    _assert_unseen_mass(res.tokens[:, 0], p, b, res.unsupported_mass[:, 0], "tree mars_code q = 0.3")
    strict = _tree(
        "strict", 1.0, seed=55, logits=logits, tokens=torch.tensor([0]), parents=torch.tensor([-1])
    )
    assert (strict.unsupported_mass == 0).all()
