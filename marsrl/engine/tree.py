"""EAGLE-2/3 dynamic draft trees: expand the most likely frontier nodes depth by depth, then keep the
best ``total_tokens - 1`` nodes by cumulative draft log-probability.

    depth 1 : the root's top_k children (from the drafter state after the committed pairs)
    depth d : run the drafter once on the k frontier nodes (each attends to the committed prefix and its
              own ancestors); score their k*k children by cumulative log-prob; the best k form the
              next frontier
    final   : the best total_tokens - 1 candidates overall (a child never outscores its parent, so the
              set is a tree); kept in generation order, so parents come first and siblings are in the
              draft's rank order, as ``verify_tree`` expects

The tree is identical in shape for every row ([B, N]); rows differ in tokens and structure.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import TreeConfig


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [B, N] target ids
    parents: torch.Tensor  # [B, N] index of the parent node, -1 for a child of the root
    depth: torch.Tensor  # [B, N] 1 for the root's children
    ancestors: torch.Tensor  # [B, N+1, N+1] bool, index 0 = root: entry (i, j) = j is i or an ancestor of i
    node_probs: torch.Tensor  # [B, N] the draft's probability of each node given its parent (mars_code)
    draft_forwards: int


def draft_tree(eagle, cfg: TreeConfig, dtype: torch.dtype) -> DraftTree:
    """Draft one tree per row with the engine's EAGLE state (``eagle_state.EagleState``)."""
    drafter = eagle.drafter
    h_root, lg_root = eagle.absorb()  # [B, H], [B, Vd]
    committed = eagle.cache.width
    bsz = h_root.shape[0]
    dev = h_root.device
    k = min(cfg.top_k, lg_root.shape[-1])

    lp = torch.log_softmax(lg_root.float(), -1)
    top = lp.topk(k, -1)
    # candidate pool, in generation order
    cand_tok = [top.indices]  # draft-vocab ids, [B, k] per depth
    cand_score = [top.values]
    cand_logp = [top.values]  # each node's own log-prob given its parent
    cand_parent = [torch.full((bsz, k), -1, dtype=torch.long, device=dev)]
    cand_depth = [torch.ones(bsz, k, dtype=torch.long, device=dev)]
    n_cand = k
    frontier = torch.arange(k, device=dev).expand(bsz, k)  # candidate index of each frontier node
    frontier_h = h_root.unsqueeze(1).expand(bsz, k, -1)  # the parent's output feeds each child
    frontier_anc = torch.zeros(bsz, k, 0, dtype=torch.bool, device=dev)  # over speculative slots
    forwards = 0
    for d in range(1, cfg.depth + 1):
        tok_draft = torch.cat(cand_tok, 1).gather(1, frontier)
        tok_target = drafter.target_token_ids[tok_draft]
        spec = frontier_anc.shape[2]
        # mask: committed prefix, the ancestors' speculative slots, and itself
        old = torch.arange(committed, device=dev) < eagle.cache.lengths.unsqueeze(1)
        allowed = torch.cat(
            [
                old.unsqueeze(1).expand(bsz, k, -1),
                frontier_anc,
                torch.eye(k, dtype=torch.bool, device=dev).expand(bsz, k, k),
            ],
            2,
        )
        zero = torch.zeros((), dtype=dtype, device=dev)
        mask = torch.where(allowed, zero, torch.finfo(dtype).min).unsqueeze(1)
        pos = (eagle.positions + d - 1).unsqueeze(1).expand(bsz, k)
        logits, hidden = drafter(tok_target, frontier_h, pos, eagle.cache.cache, mask)
        forwards += 1
        child = torch.log_softmax(logits.float(), -1).topk(k, -1)  # [B, k, k]
        parent_score = torch.cat(cand_score, 1).gather(1, frontier)  # [B, k]
        scores = (parent_score.unsqueeze(-1) + child.values).view(bsz, k * k)
        cand_tok.append(child.indices.view(bsz, k * k))
        cand_score.append(scores)
        cand_logp.append(child.values.reshape(bsz, k * k))
        cand_parent.append(frontier.unsqueeze(-1).expand(bsz, k, k).reshape(bsz, k * k))
        cand_depth.append(torch.full((bsz, k * k), d + 1, dtype=torch.long, device=dev))
        best = scores.topk(k, -1).indices  # [B, k] among this depth's candidates
        parent_slot = best // k  # which frontier node each new frontier node hangs from
        own_slot = torch.nn.functional.one_hot(parent_slot + spec, spec + k).bool()
        frontier_anc = torch.cat([frontier_anc, torch.zeros(bsz, k, k, dtype=torch.bool, device=dev)], 2)
        frontier_anc = frontier_anc.gather(1, parent_slot.unsqueeze(-1).expand(-1, -1, spec + k)) | own_slot
        frontier_h = hidden.gather(1, parent_slot.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        frontier = n_cand + best
        n_cand += k * k
    eagle.cache.crop(committed)

    tok_all = torch.cat(cand_tok, 1)
    score_all = torch.cat(cand_score, 1)
    parent_all = torch.cat(cand_parent, 1)
    depth_all = torch.cat(cand_depth, 1)
    n = min(cfg.total_tokens - 1, n_cand)
    chosen = score_all.topk(n, -1).indices.sort(-1).values  # generation order: parents first
    pos_in_tree = torch.full((bsz, n_cand), -1, dtype=torch.long, device=dev)
    pos_in_tree.scatter_(1, chosen, torch.arange(n, device=dev).expand(bsz, n))
    par_cand = parent_all.gather(1, chosen)
    parents = torch.where(par_cand >= 0, pos_in_tree.gather(1, par_cand.clamp(min=0)), -1)
    tokens = drafter.target_token_ids[tok_all.gather(1, chosen)]
    # a node whose parent was not chosen (possible only on exact score ties) is dropped as padding
    orphan = (par_cand >= 0) & (parents < 0)
    for _ in range(cfg.depth):  # orphans' descendants are orphans too
        orphan = orphan | ((parents >= 0) & orphan.gather(1, parents.clamp(min=0)))
    tokens = torch.where(orphan, -1, tokens)
    depth = depth_all.gather(1, chosen)
    node_probs = torch.cat(cand_logp, 1).gather(1, chosen).exp()

    ancestors = ancestor_sets(parents, cfg.depth + 1)  # node depths run 1 .. depth + 1
    return DraftTree(tokens, parents, depth, ancestors, node_probs, forwards)


def ancestor_sets(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """Ancestor-or-self sets [B, N+1, N+1] bool of trees given by parents [B, N] (-1: child of the root),
    in block order: index 0 is the root, node i is index i + 1; ``depth`` bounds every node's depth.

    The closure of the parent relation: after d rounds of "add my parent's set" every ancestor up to d
    levels up is in — ``depth`` batched matmuls rather than a Python loop over the nodes.
    """
    bsz, n = parents.shape
    up = torch.zeros(bsz, n + 1, n + 1, dtype=torch.float32, device=parents.device)
    up[:, 1:] = torch.nn.functional.one_hot(parents + 1, n + 1).float()  # row i + 1: node i's parent
    sets = torch.eye(n + 1, device=parents.device).expand(bsz, n + 1, n + 1)
    for _ in range(depth):
        sets = (sets + torch.bmm(up, sets)).clamp(max=1)
    return sets.bool()
