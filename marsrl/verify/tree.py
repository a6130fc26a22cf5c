"""Verification of a batch of EAGLE-2/3 draft trees: recursive rejection over siblings, with the same
three rules as the chain and the same per-token record along the accepted path.

Tree layout (per row): ``target_logits[:, 0]`` is the root (the logits after the last committed token,
predicting the first tree level) and ``target_logits[:, i+1]`` the logits at node i.  ``parents[:, i]``
is -1 for a child of the root, otherwise the index of node i's parent, always < i (parents first).
``tree_tokens[:, i] == -1`` marks a padding node.  The children of a node, in increasing index order,
are its siblings in the draft's rank order.  The sibling tokens of one node must be distinct.

At each node on the path, with p the target's sampling distribution there, rem = the mass not yet
removed (starts at 1), and siblings s_1..s_m tried in order:

    strict   : accept s iff u * rem < p(s)            else rem -= p(s); p(s) <- 0
    mars     : strict test, else accept (RELAXED) if z1 > 0, z2/z1 > theta, s in T and
               u * rem < p(s) + lam * (rem - p(s))   (lam = relax_prob: always at 1, never at 0)
    mars_code: if z2/z1 > theta: accept the first sibling in T (no draw; none -> close from full p)
               else accept iff u * q(s) * rem < p(s), else p(s) <- max(0, p(s) - q(s)), rem -= min(p(s), q(s))
    all rejected: close with y ~ the adjusted p (RESAMPLED); a node without children: y ~ p (BONUS).
    T = {t1, t2} (raw top-2) within p's support at T > 0: a sibling top-k / top-p removed is never relaxed.

strict and mars treat every sibling as a deterministic proposal (q = 1, as EAGLE's top-k expansion is);
``draft_probs`` (the draft's probability of each node token) is read only by mars_code, as the released
code does.  mars_code's departures from the paper are listed in ``chain.py``.  At T = 0 p is the point mass
on t1 and u = 0, which gives EAGLE's greedy path walk (plus t2 under the margin rule for mars).

Behaviour probability of the token y emitted at a node (siblings fixed):
    b(y) = sum_k [s_k == y] reach_k a_k + reach_end * w(y) / sum(w),
    reach_1 = 1, reach_{k+1} = reach_k (1 - a_k), a_k = the chance sibling k is accepted once reached,
    w = the closing weights at that node.  Strict gives b = p exactly (lossless).  Under mars a relaxable
    sibling (R, s in T) has a_k = a + lam (1 - a), a = min(1, p(s) / rem), the strict chance.
Bound (mars, relax_prob lam < 1): b(y) >= (1 - lam)^m p(y) at a node, m <= 2 the number of its siblings
in {t1, t2}: couple the walk with strict's through the same uniforms; the two differ only where strict
rejects a relaxable sibling and mars takes it, which given strict's rejection has chance lam, and strict
emits y with probability p(y).  So pi / b <= 1 / (1 - lam)^2 per tree node (1 / (1 - lam) when at most
one of t1, t2 is a sibling, as in a chain); the bound is reached by a token closing after both t1 and t2
were drafted and rejected.  relax_prob at T = 0 and under mars_code: as for ``verify_chain``.
Unsupported mass at a node (p-mass with b = 0; see ``_unsupported``): 0 for strict and mars at lam < 1;
mars at lam = 1 with a relaxable sibling s_c tried before any sibling holding all the mass left:
1 - p(s_1) - ... - p(s_c); mars_code likewise from its own walk (above the threshold, 1 - p of the first
top-2 sibling; below it, a sibling with p(s) >= rem q(s) is taken for certain and cuts the rest off).

Randomness: one ``torch.rand((B, D*C + 1), dtype=float64, generator=generator)`` per call at T > 0, where
D is the deepest node and C the most children of any node in the batch; column j*C + k is the k-th
sibling at depth j, the last column draws the closing token.  None at T = 0.
Host syncs: two per call (the input checks with the tree's D and C, which fix the uniforms' shape; the
logit checks on the rows the paths used); none per level or per node.

Vectorised over the nodes: every node's sibling walk is computed at once ([B, N+1, C]; a node uses the
uniforms of its depth), so the accepted path is D gathers of a "next node" table and every recorded
field a gather along it.  This costs B (N+1) C elementwise work where a walk level by level costs
B (D+1) C, in ~a third of the ops (dispatches and kernel launches, which dominate at these sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .chain import Rule
from .dist import (
    check_relax_prob,
    check_scalars,
    dist_logp_at,
    dist_probs,
    logit_flags,
    margin_ratio,
    raise_on_flags,
    relaxable,
    sample_from_weights,
    target_dist,
    token_range_flag,
)
from .types import DEFAULT_THETA, Provenance, TreeVerifyResult


class _Sibling(NamedTuple):
    """What a rule needs about the siblings of every row; all [B, C] (a rule is elementwise)."""

    p_s: torch.Tensor  # float64 p(s) (unchanged so far: sibling tokens are distinct)
    q_s: torch.Tensor  # float64 draft probability of the node (1 when not given)
    in_top2: torch.Tensor  # bool s in {t1, t2}
    relax: torch.Tensor  # bool the rule's margin condition at the parent
    rem: torch.Tensor  # float64 mass not yet removed at this parent
    u: torch.Tensor  # float64 uniform (zeros at T = 0)
    lam: float  # relax_prob (mars)


# Each step returns (passed_strict_test, accepted_by_margin, accept_probability a, mass_removed_if_rejected);
# the mass removed must not depend on ``rem`` (``_walk_siblings`` relies on it to vectorise the walk).
def _step_strict(s: _Sibling):
    a = (s.p_s / s.rem.clamp_min(1e-300)).clamp(0, 1)
    return s.u * s.rem < s.p_s, torch.zeros_like(s.in_top2), a, s.p_s


def _step_mars(s: _Sibling):
    passed, _, a, removed = _step_strict(s)
    margin = s.relax & s.in_top2
    # relaxed with probability lam once the strict test failed: u < a + lam (1 - a) with the same u, i.e.
    # u * rem < p + lam (rem - p); lam = 1 takes every relaxable sibling, lam = 0 none (lerp is exact at both)
    a_relaxed = torch.lerp(a, torch.ones_like(a), s.lam)
    if s.lam < 1:
        margin = margin & (s.u * s.rem < s.p_s + s.lam * (s.rem - s.p_s))
    return passed, margin, torch.where(s.relax & s.in_top2, a_relaxed, a), removed


def _step_mars_code(s: _Sibling):
    passed = ~s.relax & (s.u * s.q_s * s.rem < s.p_s)
    a_test = (s.p_s / (s.rem * s.q_s).clamp_min(1e-300)).clamp(0, 1)
    a = torch.where(s.relax, s.in_top2.double(), a_test)
    removed = torch.where(s.relax, 0.0, torch.minimum(s.p_s, s.q_s))
    return passed, s.relax & s.in_top2, a, removed


_STEP: dict[str, Callable] = {"strict": _step_strict, "mars": _step_mars, "mars_code": _step_mars_code}


class _Node(NamedTuple):
    """The verification facts at a set of nodes: leading dims [...] (every node of every row, [B, N+1])."""

    t1: torch.Tensor  # [...]
    t2: torch.Tensor  # [...]
    z1: torch.Tensor  # [...]
    ratio: torch.Tensor  # [...]
    relax: torch.Tensor  # [...] bool
    sib_node: torch.Tensor  # [..., C] child node index, -1 for none
    sib_valid: torch.Tensor  # [..., C] bool
    sib_tok: torch.Tensor  # [..., C] int64 (0 where invalid)
    logp_s: torch.Tensor  # [..., C] float64 log p(sibling token)
    q_s: torch.Tensor  # [..., C] float64


class _Walk(NamedTuple):
    p_s: torch.Tensor  # [..., C] float64 p of each sibling token
    a: torch.Tensor  # [..., C] accept probability of each sibling once reached (0 where invalid)
    reach: torch.Tensor  # [..., C] probability of reaching each sibling
    removed: torch.Tensor  # [..., C] mass removed from p(s) when s is rejected
    rem: torch.Tensor  # [..., C] mass left (the adjusted p's total) when each sibling is tried
    reach_end: torch.Tensor  # [...] probability that every sibling is rejected
    rem_end: torch.Tensor  # [...] mass left for the closing draw
    pick: torch.Tensor  # [...] index of the accepted sibling, -1 if none
    pick_relaxed: torch.Tensor  # [...] bool accepted only by the margin rule


def _walk_siblings(rule: str, node: _Node, u: torch.Tensor, lam: float, greedy: bool) -> _Walk:
    """Try the siblings of every node in ``node`` in order. u [..., C] float64 uniforms; lam relax_prob;
    greedy: T = 0 (the relaxable set is then the raw top-2, else the top-2 within p's support).

    Vectorised over the siblings: what rejecting a sibling removes never depends on the mass left before
    it (true of every rule in ``_STEP``), so the masses left are an exclusive cumulative sum, the reach
    probabilities an exclusive cumulative product, and the accepted sibling the first that passes.
    Only ``pick`` and ``pick_relaxed`` read ``u``.
    """
    lead, n_sib = node.sib_node.shape[:-1], node.sib_node.shape[-1]
    dev = node.sib_node.device
    if n_sib == 0:
        ones = torch.ones(lead, dtype=torch.float64, device=dev)
        empty = ones.new_zeros(*lead, 0)
        none = torch.full(lead, -1, dtype=torch.long, device=dev)
        no = torch.zeros(lead, dtype=torch.bool, device=dev)
        return _Walk(empty, empty, empty, empty, empty, ones, ones, none, no)
    step = _STEP[rule]
    valid = node.sib_valid
    p_s = node.logp_s.exp()  # [..., C]
    in_top2 = (node.sib_tok == node.t1.unsqueeze(-1)) | (node.sib_tok == node.t2.unsqueeze(-1))
    if not greedy:  # a token top-k / top-p removed (p = 0) is never relaxed to
        in_top2 &= p_s > 0
    relax = node.relax.unsqueeze(-1).expand_as(in_top2)

    def sibling(rem: torch.Tensor) -> _Sibling:
        return _Sibling(p_s, node.q_s, in_top2, relax, rem, u, lam)

    removed = torch.where(valid, step(sibling(torch.ones_like(p_s)))[3], 0.0)  # [..., C]
    rem = 1 - (removed.cumsum(-1) - removed)  # mass left when each sibling is tried
    passed, margin, a, _ = step(sibling(rem))
    a = torch.where(valid, a, 0.0)
    keep = (1 - a).cumprod(-1)  # [..., C] probability that siblings 1..k are all rejected
    reach = torch.cat([torch.ones_like(keep[..., :1]), keep[..., :-1]], -1)
    take = valid & (passed | margin)
    first = take.long().argmax(-1)  # the first sibling that is taken (0 when none is)
    found = take.any(-1)
    pick = torch.where(found, first, -1)
    pick_relaxed = found & ~passed.gather(-1, first.unsqueeze(-1)).squeeze(-1)
    return _Walk(p_s, a, reach, removed, rem, keep[..., -1], 1 - removed.sum(-1), pick, pick_relaxed)


def _unsupported(rule: str, lam: float, node: _Node, walk: _Walk) -> torch.Tensor:
    """The p-mass at each node that the walk cannot emit (b = 0 < p), [...] float64.

    Reachable are the siblings tried with a positive chance, up to the first one taken for certain
    (a = 1), and, when no sibling is certain, every token of the closing draw (all of p's support: only
    rejected siblings lose closing weight, and they were reachable themselves).  So the mass is 0 unless
    a certain sibling c leaves mass behind (p(s_c) < the mass left), and then it is
    1 - sum of p over the reachable siblings.  strict (b = p) and mars at lam < 1 (b >= (1 - lam)^2 p)
    have none by construction.
    """
    if rule == "strict" or (rule == "mars" and lam < 1):
        return torch.zeros_like(walk.reach_end)
    p_s = walk.p_s
    certain = node.sib_valid & (walk.a >= 1) & (walk.reach > 0)  # the first certain sibling, if any
    cut = (certain & (p_s < walk.rem)).any(-1)
    reachable = (walk.reach * walk.a > 0).double()
    mass = (1 - (reachable * p_s).sum(-1)).clamp(0, 1)
    return torch.where(cut, mass, 0.0)


def verify_tree(
    target_logits: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    rule: Rule = "strict",
    temperature: float = 1.0,
    theta: float = DEFAULT_THETA,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    relax_prob: float = 1.0,
) -> TreeVerifyResult:
    """Verify one round of draft trees and return the accepted path plus its closing token.

    Args:
        target_logits: [B, N+1, V] raw logits at the root (row 0) and at each node (row i+1).
        tree_tokens: [B, N] int node tokens in the target vocabulary, -1 for padding nodes.
        parents: [B, N] int parent node index (-1 = root), parents before children.
        draft_probs: [B, N] the draft's probability of each node's token (read by mars_code only).
        rule, temperature, theta, top_k, top_p, generator, relax_prob: as for ``verify_chain``
            (relax_prob applies to each relaxable sibling in turn; the bound is in the module docstring).

    Returns:
        TreeVerifyResult with fields [B, D+1]; ``path_nodes`` names the accepted nodes.
    """
    check_scalars(rule, _STEP, temperature, theta, top_k, top_p)
    check_relax_prob(relax_prob, rule, temperature)
    lam = float(relax_prob)
    _check_tree_shapes(target_logits, tree_tokens, parents, draft_probs)
    z = target_logits
    bsz, n1, vocab = z.shape
    n = n1 - 1
    dev = z.device
    greedy = temperature == 0
    rule_eff = "strict" if (greedy and rule == "mars_code") else rule
    tree_tokens, parents = tree_tokens.long(), parents.long()

    valid = tree_tokens >= 0  # [B, N]
    slot = (parents + 1).clamp(0, n)  # [B, N] parent's row in target_logits (0 = root)
    node_ids = torch.arange(n, device=dev)
    flags = token_range_flag("tree_tokens", tree_tokens, vocab, allow_pad=True)
    parent_ok = (parents >= -1) & (parents < node_ids)
    parent_ok &= (parents == -1) | valid.gather(1, parents.clamp(0, max(n - 1, 0)))
    flags["parents must be -1 or the index of an earlier, non-padding node"] = (valid & ~parent_ok).any()
    same = (slot.unsqueeze(2) == slot.unsqueeze(1)) & (tree_tokens.unsqueeze(2) == tree_tokens.unsqueeze(1))
    same &= valid.unsqueeze(2) & valid.unsqueeze(1) & ~torch.eye(n, dtype=torch.bool, device=dev)
    flags["tree_tokens has a repeated token among the children of one node"] = same.any()
    if draft_probs is not None:
        flags["draft_probs must be in (0, 1] on every non-padding node"] = (
            valid & ~((draft_probs > 0) & (draft_probs <= 1))
        ).any()

    # --- tree structure: depth of every node, and a [B, N+1, C] children table ---
    # depth by pointer jumping (list ranking): after r rounds ``up`` is each row's 2^r-th ancestor and
    # ``depth`` counts the levels passed; log2(N + 1) rounds reach the root from any node
    depth = torch.ones(bsz, n1, dtype=torch.long, device=dev)  # by logits row; the root has depth 0
    depth[:, 0] = 0
    up = torch.cat([torch.zeros(bsz, 1, dtype=torch.long, device=dev), slot], 1)  # [B, N+1], root -> root
    for _ in range(n1.bit_length()):
        depth, up = depth + depth.gather(1, up), up.gather(1, up)
    member = F.one_hot(slot, n1) * valid.unsqueeze(-1)  # [B, N, N+1]
    rank = (member.cumsum(1) * member).sum(-1) - 1  # [B, N] position among its siblings
    # the one host sync before the walk: the input checks, and C and D (they fix the uniforms' shape)
    max_children, max_depth = raise_on_flags(flags, member.sum(1).max(), (depth[:, 1:] * valid).max())
    # node i goes to column rank[i] of its parent's row; padding nodes to a spare column N, cut off below
    children = torch.full((bsz, n1, n1), -1, dtype=torch.long, device=dev)
    sib_col = torch.where(valid, rank, n)
    children.view(bsz, -1).scatter_(1, slot * n1 + sib_col, node_ids.expand(bsz, n))
    children = children[:, :, :max_children]

    u = (
        torch.zeros(bsz, max_depth * max_children + 1, dtype=torch.float64, device=dev)
        if greedy
        else torch.rand(
            (bsz, max_depth * max_children + 1), dtype=torch.float64, device=dev, generator=generator
        )
    )
    rows = torch.arange(bsz, device=dev)

    # --- every node's sibling walk at once ([B, N+1] nodes by logits row, [B, N+1, C] siblings) ---
    # the target's distribution at every node, the log-probability of each node's children there, and
    # the uniforms of each node's depth: column depth * C + k for its k-th child (a node at depth D has
    # no children; padding rows' walks are never read).  The path below only gathers from these tables.
    d = target_dist(z, temperature, top_k, top_p)
    ratio_all = margin_ratio(d.z1, d.z2)
    relax_all = ratio_all > theta if rule_eff == "mars_code" else relaxable(d.z1, ratio_all, theta)
    child_tok = tree_tokens.gather(1, children.clamp(min=0).view(bsz, -1)).view_as(children).clamp(min=0)
    logp_children = dist_logp_at(
        d, (rows.view(bsz, 1, 1), torch.arange(n1, device=dev).view(1, n1, 1)), child_tok
    )
    q_children = (  # the draft's probability of each child (mars_code reads it; 1 when not given)
        draft_probs.double().gather(1, children.clamp(min=0).view(bsz, -1)).view_as(children)
        if draft_probs is not None
        else torch.ones(children.shape, dtype=torch.float64, device=dev)
    )
    nodes = _Node(
        d.t1, d.t2, d.z1, ratio_all, relax_all, children, children >= 0, child_tok, logp_children, q_children
    )
    u_col = depth.unsqueeze(-1) * max_children + torch.arange(max_children, device=dev)  # [B, N+1, C]
    u_nodes = u.gather(1, u_col.clamp(max=max(max_depth * max_children - 1, 0)).view(bsz, -1))
    walk = _walk_siblings(rule_eff, nodes, u_nodes.view_as(children), lam, greedy)
    unsup = _unsupported(rule_eff, lam, nodes, walk)  # [B, N+1]
    found = walk.pick >= 0  # [B, N+1] the walk at this node accepts a child

    # --- the accepted path: the logits row of the node each row stands at before level j, [B, D+1] ---
    # a row whose walk accepts nothing stays where it is, so its later levels are rejections too
    k = walk.pick.clamp(min=0).unsqueeze(-1)  # [B, N+1, 1]
    at_pick = lambda t: t.gather(-1, k).squeeze(-1)  # noqa: E731  [B, N+1, C] -> [B, N+1]
    if max_depth:
        next_row = torch.where(found, at_pick(children) + 1, torch.arange(n1, device=dev))
    cur = torch.zeros(bsz, dtype=torch.long, device=dev)
    steps = [cur]
    for _ in range(max_depth):
        cur = next_row.gather(1, cur.unsqueeze(1)).squeeze(1)
        steps.append(cur)
    path_rows = torch.stack(steps, 1)  # [B, D+1]; column D is where each path stopped
    # the rows used: every node on a path (NaN / inf checks on them only)
    row_max = d.z1.gather(1, path_rows).amax(1)  # NaN propagates; -inf only if every row used is
    raise_on_flags(logit_flags("target_logits (rows on the verified paths)", row_max))

    # --- the accepted tokens: per node, what accepting its picked child records; then along the path ---
    width = max_depth + 1
    along = lambda t: t.gather(1, path_rows[:, :max_depth])  # noqa: E731  [B, N+1] -> [B, D]
    acc = along(found)
    n_acc = acc.sum(1)
    tokens = torch.full((bsz, width), -1, dtype=torch.long, device=dev)
    path_nodes = torch.full_like(tokens, -1)
    prov = torch.zeros(bsz, width, dtype=torch.int8, device=dev)
    target_lp = torch.zeros(bsz, width, device=dev)
    behavior_lp = torch.zeros_like(target_lp)
    ratios = torch.zeros_like(target_lp)
    unsupported = torch.zeros_like(target_lp)
    is_top2 = torch.zeros(bsz, width, dtype=torch.bool, device=dev)
    if max_depth:
        logp_pick = at_pick(logp_children)
        leftover = (at_pick(walk.p_s) - at_pick(walk.removed)) / walk.rem_end.clamp_min(1e-300)
        b = at_pick(walk.reach) * at_pick(walk.a)
        b = b + torch.where(walk.reach_end > 0, walk.reach_end * leftover, 0.0)
        tok = at_pick(child_tok)
        code = torch.where(walk.pick_relaxed, int(Provenance.RELAXED), int(Provenance.ACCEPTED))
        head = slice(0, max_depth)
        tokens[:, head] = torch.where(acc, along(tok), -1)
        path_nodes[:, head] = torch.where(acc, along(at_pick(children)), -1)
        prov[:, head] = torch.where(acc, along(code), int(Provenance.PAD)).to(torch.int8)
        target_lp[:, head] = torch.where(acc, along(logp_pick).float(), 0.0)
        behavior_lp[:, head] = torch.where(acc, along(b.clamp_min(0).log().float()), 0.0)
        ratios[:, head] = torch.where(acc, along(ratio_all), 0.0)
        unsupported[:, head] = torch.where(acc, along(unsup), 0.0).float()
        is_top2[:, head] = acc & along(tok == d.t2)

    # --- the closing token at the node where each row's path stopped ---
    at_end = lambda t: t[rows, cur]  # noqa: E731  [B, N+1, ...] -> [B, ...]
    sib_tok, sib_valid = at_end(child_tok), at_end(children) >= 0
    reach, a, removed = at_end(walk.reach), at_end(walk.a), at_end(walk.removed)  # [B, C]
    reach_end = at_end(walk.reach_end)
    has_children = sib_valid.any(dim=1)
    if greedy:
        y = at_end(d.t1)
        w_y_frac = torch.ones(bsz, dtype=torch.float64, device=dev)
        logp_y = torch.zeros_like(w_y_frac)
    else:
        p_row = dist_probs(d, (rows, cur))  # [B, V] the sampling distribution where each path stopped
        w = p_row.double().scatter_add(1, sib_tok, -removed).clamp_min(0)  # [B, V]
        y = sample_from_weights(w, u[:, -1])
        w_y_frac = w.gather(1, y.unsqueeze(1)).squeeze(1) / w.sum(1).clamp_min(1e-300)
        logp_y = p_row.gather(1, y.unsqueeze(1)).squeeze(1).double().log()
    via_sibling = ((sib_tok == y.unsqueeze(1)) & sib_valid) * reach * a
    b = via_sibling.sum(1) + reach_end * w_y_frac
    code = torch.where(has_children, int(Provenance.RESAMPLED), int(Provenance.BONUS)).to(torch.int8)
    col = n_acc.unsqueeze(1)
    put = lambda dst, val: dst.scatter_(1, col, val.to(dst.dtype).unsqueeze(1))  # noqa: E731
    put(tokens, y)
    put(prov, code)
    put(target_lp, logp_y)
    put(behavior_lp, b.clamp_min(0).log())
    put(ratios, at_end(ratio_all))
    put(unsupported, at_end(unsup))  # a leaf (bonus) has no siblings: 0
    put(is_top2, y == at_end(d.t2))

    return TreeVerifyResult(
        tokens=tokens,
        num_emitted=n_acc + 1,
        path_nodes=path_nodes,
        provenance=prov,
        target_logprob=target_lp,
        behavior_logprob=behavior_lp,
        logit_ratio=ratios,
        is_top2=is_top2,
        unsupported_mass=unsupported,
    )


def _check_tree_shapes(target_logits, tree_tokens, parents, draft_probs) -> None:
    named = (("target_logits", target_logits, 3), ("tree_tokens", tree_tokens, 2), ("parents", parents, 2))
    for name, t, dims in named:
        if not isinstance(t, torch.Tensor) or t.dim() != dims:
            raise ValueError(f"{name} must be a {dims}-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if not target_logits.is_floating_point():
        raise ValueError(f"target_logits must be floating point, got {target_logits.dtype}")
    if tree_tokens.is_floating_point() or parents.is_floating_point():
        raise ValueError("tree_tokens and parents must be integer tensors")
    bsz, n = tree_tokens.shape
    if tuple(parents.shape) != (bsz, n):
        raise ValueError(f"parents must be [B, N] = [{bsz}, {n}] like tree_tokens, got {list(parents.shape)}")
    if tuple(target_logits.shape[:2]) != (bsz, n + 1):
        raise ValueError(
            f"target_logits must be [B, N+1, V] = [{bsz}, {n + 1}, V] for tree_tokens [{bsz}, {n}], "
            f"got {list(target_logits.shape)}"
        )
    if target_logits.shape[2] < 2:
        raise ValueError("target_logits needs a vocabulary of at least 2 tokens (top-2 margin)")
    if draft_probs is not None and (
        not isinstance(draft_probs, torch.Tensor) or tuple(draft_probs.shape) != (bsz, n)
    ):
        got = getattr(draft_probs, "shape", type(draft_probs).__name__)
        raise ValueError(f"draft_probs must be [B, N] = [{bsz}, {n}], got {got}")
