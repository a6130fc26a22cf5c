"""Tree verification: strict is lossless over a small tree; mars / mars_code follow their enumerated
behaviour distributions; greedy walks the argmax path."""

import pytest
import torch

from marsrl.verify import Provenance, verify_chain, verify_tree
from marsrl.verify.reference import reference_behavior_distribution_tree
from tests.stats import assert_distribution

N = 200_000
V = 8
# Tree (node: token, parent):  root -> n0 (tok 0), n1 (tok 1), n2 (tok 4)
#                              n0 -> n3 (tok 2), n4 (tok 5);  n1 -> n5 (tok 0);  n3 -> n6 (tok 1)
TOKENS = torch.tensor([0, 1, 4, 2, 5, 0, 1])
PARENTS = torch.tensor([-1, -1, -1, 0, 0, 1, 3])
ROOT = torch.tensor([5.0, 4.7, 3.0, 2.5, 1.0, 0.5, 0.0, -1.0])  # near tie between tokens 0 and 1
NODE_LOGITS = torch.stack(
    [
        ROOT,
        torch.tensor([1.0, 0.2, 2.5, 0.0, -1.0, 2.4, 0.3, 0.1]),  # at n0: tokens 2 and 5 nearly tied
        torch.tensor([3.0, 0.0, 1.0, 2.0, -0.5, 0.1, 0.7, 0.2]),  # at n1
        torch.tensor([0.0, 1.0, 0.5, 0.2, 2.0, 0.0, -1.0, 0.3]),  # at n2 (leaf)
        torch.tensor([0.5, 2.2, 0.1, 0.9, 0.0, 1.0, 0.3, -0.4]),  # at n3
        torch.tensor([1.0, 0.0, 0.0, 0.5, 0.5, 1.5, 0.2, 0.1]),  # at n4 (leaf)
        torch.tensor([0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6]),  # at n5 (leaf)
        torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, 0.5, 0.5, 0.5]),  # at n6 (leaf)
    ]
)


def _run(rule, seed, temperature=1.0, draft_probs=None, **kw):
    logits = NODE_LOGITS.expand(N, 8, V).contiguous()
    q = None if draft_probs is None else draft_probs.expand(N, 7).contiguous()
    return verify_tree(
        logits,
        TOKENS.expand(N, 7),
        PARENTS.expand(N, 7),
        q,
        rule=rule,
        temperature=temperature,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, None), (0.8, 6)])
def test_strict_tree_is_lossless(temperature, top_k):
    """First token ~ p(root); given the first token is child c's token, the second ~ p(c) (N=200k)."""
    res = _run("strict", seed=31, temperature=temperature, top_k=top_k)

    def p(row):
        x = NODE_LOGITS[row].double() / temperature
        if top_k is not None:
            x = x.masked_fill(x < x.topk(top_k).values[-1], float("-inf"))
        return torch.softmax(x, -1)

    assert_distribution(res.tokens[:, 0], p(0), "tree strict: first token")
    for node, tok in [(0, 0), (1, 1)]:  # the root's children with their own children
        rows = res.tokens[:, 0] == tok
        assert (res.path_nodes[rows, 0] == node).all()
        assert_distribution(res.tokens[rows, 1], p(node + 1), f"tree strict: second token | node {node}")
    emitted = res.provenance != Provenance.PAD
    torch.testing.assert_close(res.behavior_logprob[emitted], res.target_logprob[emitted])
    assert not (res.provenance == Provenance.RELAXED).any()


def _node_b(rule, node_row, sibling_tokens, sibling_q, theta=0.9):
    z = NODE_LOGITS[node_row]
    top = z.topk(2)
    z1, z2 = float(top.values[0]), float(top.values[1])
    relax = (z1 > 0 and z2 / z1 > theta) if rule == "mars" else (z2 / z1 > theta)
    p = torch.softmax(z.double(), -1)
    return reference_behavior_distribution_tree(
        p, int(top.indices[0]), int(top.indices[1]), relax, sibling_tokens, sibling_q, rule, 1.0
    )


@pytest.mark.parametrize("rule", ["mars", "mars_code"])
def test_lossy_tree_rules_match_enumeration(rule):
    """First token at the root (near tie) and second token under n0 follow the enumerated b (N=200k)."""
    q = torch.tensor([0.45, 0.35, 0.1, 0.5, 0.3, 0.9, 0.7])  # draft probabilities of the nodes
    res = _run(rule, seed=32, draft_probs=q)
    b_root = _node_b(rule, 0, [0, 1, 4], q[[0, 1, 2]].tolist())
    assert_distribution(res.tokens[:, 0], b_root, f"tree {rule}: first token")
    torch.testing.assert_close(
        res.behavior_logprob[:, 0].double(), b_root[res.tokens[:, 0]].log(), rtol=0, atol=1e-4
    )
    assert (b_root - torch.softmax(ROOT.double(), -1)).abs().sum() > 0.05  # lossy at this near tie
    rows = res.path_nodes[:, 0] == 0
    if rows.sum() > 1000:
        b_n0 = _node_b(rule, 1, [2, 5], q[[3, 4]].tolist())
        assert_distribution(res.tokens[rows, 1], b_n0, f"tree {rule}: second token | n0")
    assert (res.provenance == Provenance.RELAXED).any()


def test_mars_tree_relaxes_the_first_top2_sibling():
    """At the root near tie, mars always accepts n0 (token 0 = t1, the first sibling in the top-2)."""
    res = _run("mars", seed=33)
    assert (res.path_nodes[:, 0] == 0).all()
    relaxed = (res.provenance[:, 0] == Provenance.RELAXED).double().mean().item()
    assert abs(relaxed - (1 - torch.softmax(ROOT, -1)[0].item())) < 4 * (0.25 / N) ** 0.5


def test_greedy_tree_walks_the_argmax_path():
    gen = torch.Generator().manual_seed(34)
    b = 200
    logits = torch.randn(b, 8, V, generator=gen) * 3
    res = verify_tree(logits, TOKENS.expand(b, 7), PARENTS.expand(b, 7), rule="strict", temperature=0.0)
    children = {-1: [0, 1, 2], 0: [3, 4], 1: [5], 3: [6]}
    for i in range(b):
        node, path = -1, []
        while True:
            want = int(logits[i, node + 1].argmax())
            path.append(want)
            nxt = [c for c in children.get(node, []) if int(TOKENS[c]) == want]
            if not nxt:
                break
            node = nxt[0]
        n = int(res.num_emitted[i])
        assert res.tokens[i, :n].tolist() == path
        assert (res.tokens[i, n:] == -1).all()


def test_chain_shaped_tree_agrees_with_verify_chain():
    """A tree with one child per node is a chain: same greedy tokens, same distribution of outcomes."""
    gen = torch.Generator().manual_seed(35)
    b, k = 300, 4
    logits = torch.randn(b, k + 1, V, generator=gen) + 2.0
    logits[..., 1] = logits[..., 0] - 0.1  # near ties
    drafts = torch.where(torch.rand(b, k, generator=gen) < 0.7, logits[:, :k].argmax(-1), 1)
    parents = torch.arange(-1, k - 1).expand(b, k)
    for rule in ["strict", "mars"]:
        chain = verify_chain(logits, drafts, rule=rule, temperature=0.0)
        tree = verify_tree(logits, drafts, parents, rule=rule, temperature=0.0)
        for field in ("tokens", "num_emitted", "provenance", "behavior_logprob", "is_top2", "logit_ratio"):
            assert torch.equal(getattr(chain, field), getattr(tree, field)), (rule, field)
    # sampling: identical first-token behaviour probabilities whatever the randomness
    big = 100_000
    row = torch.tensor([[5.0, 4.7, 3.0, 2.5, 1.0, 0.5, 0.0, -1.0]] * 2)
    for rule in ["strict", "mars"]:
        c = verify_chain(row.expand(big, 2, V), torch.full((big, 1), 1), rule=rule, generator=gen)
        t = verify_tree(
            row.expand(big, 2, V), torch.full((big, 1), 1), torch.full((big, 1), -1), rule=rule, generator=gen
        )
        for tok in range(V):
            bc, bt = (
                c.behavior_logprob[:, 0][c.tokens[:, 0] == tok],
                t.behavior_logprob[:, 0][t.tokens[:, 0] == tok],
            )
            if len(bc) and len(bt):
                assert abs(bc[0].item() - bt[0].item()) < 1e-5
        assert abs((c.tokens[:, 0] == 1).double().mean() - (t.tokens[:, 0] == 1).double().mean()) < 0.01


def test_ragged_trees_and_padding_nodes():
    """Rows with fewer nodes (token -1) and an empty tree (only padding) verify independently."""
    logits = NODE_LOGITS.expand(3, 8, V).contiguous()
    tokens = torch.stack([TOKENS, TOKENS.masked_fill(torch.arange(7) >= 3, -1), torch.full((7,), -1)])
    res = verify_tree(logits, tokens, PARENTS.expand(3, 7), rule="strict", temperature=0.0)
    assert res.tokens[0].tolist()[:3] == [0, 2, 1] and res.num_emitted[0] == 4  # n0 -> n3 -> n6 -> bonus
    assert res.tokens[1].tolist()[:2] == [0, 2] and res.num_emitted[1] == 2  # n0 is now a leaf
    assert res.provenance[1, 1] == Provenance.BONUS
    assert res.tokens[2, 0] == 0 and res.num_emitted[2] == 1 and res.provenance[2, 0] == Provenance.BONUS
