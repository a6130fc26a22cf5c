"""The vectorised verifiers agree with the slow loop-based reference, token for token, on random inputs
with near ties, negative logits, full and greedy drafts, temperatures and filters."""

import pytest
import torch

from marsrl.verify import RULES, Provenance, verify_chain, verify_tree
from marsrl.verify.reference import reference_verify_chain, reference_verify_tree

SETTINGS = [(1.0, None, None), (0.7, None, None), (0.0, None, None), (1.0, 5, 0.8)]


def _assert_same(fast, slow, tag):
    assert torch.equal(fast.tokens, slow.tokens), tag
    assert torch.equal(fast.num_emitted, slow.num_emitted), tag
    assert torch.equal(fast.provenance, slow.provenance), tag
    assert torch.equal(fast.is_top2, slow.is_top2), tag
    for field in ("target_logprob", "behavior_logprob", "logit_ratio"):
        torch.testing.assert_close(
            getattr(fast, field), getattr(slow, field), rtol=0, atol=1e-4, equal_nan=True
        )
    # closed form (fast) against enumerated reachability (slow); float32 logits: p agrees to ~1e-7
    torch.testing.assert_close(fast.unsupported_mass, slow.unsupported_mass, rtol=0, atol=1e-6, msg=str(tag))
    assert (
        fast.unsupported_mass.dtype == torch.float32
        and (fast.unsupported_mass[fast.provenance == 0] == 0).all()
    )


def _chain_inputs(seed, dense):
    g = torch.Generator().manual_seed(seed)
    b, k, v = 16, 4, 12
    logits = torch.randn(b, k + 1, v, generator=g) * 2 + (2.0 if seed % 3 else -3.0)
    logits[:, :, :3] += 3.0  # a crowded top: frequent near ties
    if dense:
        q = torch.softmax(torch.randn(b, k, v, generator=g) + logits[:, :k], -1)
        x = torch.multinomial(q.view(-1, v), 1, generator=g).view(b, k)
    else:
        q = None
        x = torch.where(
            torch.rand(b, k, generator=g) < 0.5,
            logits[:, :k].argmax(-1),
            torch.randint(0, v, (b, k), generator=g),
        )
    return logits, x, q


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dense", [False, True])
def test_chain_agrees_with_reference(rule, dense):
    seen, out_of_reach = set(), 0.0
    for seed in range(12):
        logits, x, q = _chain_inputs(seed, dense)
        b, k1 = logits.shape[:2]
        for temperature, top_k, top_p in SETTINGS:
            kw = dict(rule=rule, temperature=temperature, theta=0.8, top_k=top_k, top_p=top_p)
            fast = verify_chain(logits, x, q, generator=torch.Generator().manual_seed(seed), **kw)
            u = None
            if temperature > 0:  # the documented draw: one rand((B, K+1), float64)
                u = torch.rand((b, k1), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
            _assert_same(fast, reference_verify_chain(logits, x, q, uniforms=u, **kw), (seed, temperature))
            seen |= set(fast.provenance.flatten().tolist())
            out_of_reach += float(fast.unsupported_mass.sum())
    want = {Provenance.ACCEPTED, Provenance.RESAMPLED, Provenance.BONUS}
    if rule != "strict":
        want.add(Provenance.RELAXED)
    assert want <= seen, f"inputs did not exercise every outcome: {seen}"
    if rule == "strict":
        assert out_of_reach == 0
    elif not dense:  # random full drafts over-propose outside the top-2: their nonzero cases are in
        assert out_of_reach > 0  # test_unsupported.py


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dense", [False, True])
def test_chain_with_per_row_draft_counts_agrees_with_reference(rule, dense):
    """Rows that stopped drafting early (num_drafts < K, including 0): the columns past a row's count are
    filled with junk the verifier must ignore, and a fully accepted short row closes with a bonus."""
    seen_short_bonus = 0
    for seed in range(12):
        logits, x, q = _chain_inputs(seed, dense)
        b, k1 = logits.shape[:2]
        n = torch.randint(0, k1, (b,), generator=torch.Generator().manual_seed(100 + seed))
        junk = torch.arange(k1 - 1).unsqueeze(0) >= n.unsqueeze(1)
        x = torch.where(junk, logits[:, :-1].argmin(-1), x)  # rejected for sure if it were verified
        for temperature, top_k, top_p in SETTINGS:
            kw = dict(rule=rule, temperature=temperature, theta=0.8, top_k=top_k, top_p=top_p)
            fast = verify_chain(
                logits, x, q, generator=torch.Generator().manual_seed(seed), num_drafts=n, **kw
            )
            u = None
            if temperature > 0:
                u = torch.rand((b, k1), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
            slow = reference_verify_chain(logits, x, q, uniforms=u, num_drafts=n, **kw)
            _assert_same(fast, slow, (seed, temperature))
            assert bool((fast.num_emitted <= n + 1).all())
            bonus_col = fast.provenance.gather(1, (fast.num_emitted - 1).unsqueeze(1)).squeeze(1)
            seen_short_bonus += int(((bonus_col == Provenance.BONUS) & (n < k1 - 1)).sum())
    assert seen_short_bonus > 0, "no short row closed with a bonus"


def test_chain_num_drafts_checked():
    logits, x, _ = _chain_inputs(0, False)
    with pytest.raises(ValueError, match="num_drafts has values outside"):
        verify_chain(logits, x, num_drafts=torch.full((logits.shape[0],), 5))
    with pytest.raises(ValueError, match="num_drafts must be a"):
        verify_chain(logits, x, num_drafts=torch.full((3,), 2))


def _tree_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    b, n, v = 16, 9, 12
    parents = torch.tensor([-1, -1, -1, 0, 0, 1, 3, 3, 6]).expand(b, n).clone()
    logits = torch.randn(b, n + 1, v, generator=g) * 2 + 2.0
    logits[:, :, :3] += 3.0
    tokens = torch.stack([torch.randperm(v, generator=g)[:n] for _ in range(b)])  # distinct per row
    top = logits[:, 0].topk(2, -1).indices  # put the root's top-2 among its children half the time
    swap = torch.rand(b, generator=g) < 0.5
    for col, rank in ((0, 0), (1, 1)):
        clash = (tokens == top[:, rank : rank + 1]).nonzero()
        for r, c in clash.tolist():
            if swap[r]:
                tokens[r, c], tokens[r, col] = tokens[r, col].clone(), tokens[r, c].clone()
    tokens[b // 2 :, 8] = -1  # ragged: half the rows lack the deepest node
    q = torch.rand(b, n, generator=g) * 0.9 + 0.05
    return logits, tokens, parents, q


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("use_q", [False, True])
def test_tree_agrees_with_reference(rule, use_q):
    seen, out_of_reach = set(), 0.0
    for seed in range(10):
        logits, tokens, parents, q = _tree_inputs(seed)
        q = q if use_q else None
        for temperature, top_k, top_p in SETTINGS:
            kw = dict(rule=rule, temperature=temperature, theta=0.8, top_k=top_k, top_p=top_p)
            fast = verify_tree(
                logits, tokens, parents, q, generator=torch.Generator().manual_seed(seed), **kw
            )
            depth, children = fast.tokens.shape[1] - 1, 3  # this tree: D = 4, C = 3
            u = None
            if temperature > 0:
                u = torch.rand(
                    (logits.shape[0], depth * children + 1),
                    dtype=torch.float64,
                    generator=torch.Generator().manual_seed(seed),
                )
            slow = reference_verify_tree(logits, tokens, parents, q, uniforms=u, **kw)
            _assert_same(fast, slow, (seed, temperature))
            assert torch.equal(fast.path_nodes, slow.path_nodes)
            seen |= set(fast.provenance.flatten().tolist())
            out_of_reach += float(fast.unsupported_mass.sum())
    assert {Provenance.ACCEPTED, Provenance.RESAMPLED, Provenance.BONUS} <= seen
    assert (out_of_reach > 0) == (rule != "strict")
    if rule != "strict":
        assert Provenance.RELAXED in seen


SAMPLED = [s for s in SETTINGS if s[0] > 0]  # relax_prob strictly inside (0, 1) needs T > 0


@pytest.mark.parametrize("lam", [0.3, 0.7])
@pytest.mark.parametrize("dense", [False, True])
def test_chain_with_relax_prob_agrees_with_reference(lam, dense):
    relaxed = 0
    for seed in range(12):
        logits, x, q = _chain_inputs(seed, dense)
        b, k1 = logits.shape[:2]
        for temperature, top_k, top_p in SAMPLED:
            kw = dict(
                rule="mars", temperature=temperature, theta=0.8, top_k=top_k, top_p=top_p, relax_prob=lam
            )
            fast = verify_chain(logits, x, q, generator=torch.Generator().manual_seed(seed), **kw)
            u = torch.rand((b, k1), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
            _assert_same(fast, reference_verify_chain(logits, x, q, uniforms=u, **kw), (seed, temperature))
            relaxed += int((fast.provenance == Provenance.RELAXED).sum())
    assert relaxed > 0


@pytest.mark.parametrize("lam", [0.3, 0.7])
@pytest.mark.parametrize("use_q", [False, True])
def test_tree_with_relax_prob_agrees_with_reference(lam, use_q):
    relaxed = 0
    for seed in range(10):
        logits, tokens, parents, q = _tree_inputs(seed)
        q = q if use_q else None
        for temperature, top_k, top_p in SAMPLED:
            kw = dict(
                rule="mars", temperature=temperature, theta=0.8, top_k=top_k, top_p=top_p, relax_prob=lam
            )
            fast = verify_tree(
                logits, tokens, parents, q, generator=torch.Generator().manual_seed(seed), **kw
            )
            u = torch.rand(
                (logits.shape[0], (fast.tokens.shape[1] - 1) * 3 + 1),
                dtype=torch.float64,
                generator=torch.Generator().manual_seed(seed),
            )
            slow = reference_verify_tree(logits, tokens, parents, q, uniforms=u, **kw)
            _assert_same(fast, slow, (seed, temperature))
            assert torch.equal(fast.path_nodes, slow.path_nodes)
            relaxed += int((fast.provenance == Provenance.RELAXED).sum())
    assert relaxed > 0
