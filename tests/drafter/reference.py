"""Slow oracles for the drafter's fused attention and its training memory work: explicit scores and
softmax, and the code paths those replaced (kept here verbatim in behaviour, so the tests and
bench/draft_memory.py compare the new code against what it was).

- ``explicit_attention``: K/V repeated per query head, float64 scores, softmax, weighted sum.
- ``sdpa_enable_gqa``: the drafter's former attention call (SDPA with a mask and ``enable_gqa``).
- ``OldTTTBlocks``: the former training-time-test attention (explicit [B, heads, T, T+j] float32 scores
  kept for backward).
- ``old_ttt_loss``: the former loss, reading full-vocabulary float32 target logits.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

import marsrl.drafter.ttt as ttt_mod
from marsrl.drafter.layers import TTTBlocks


def explicit_attention(q, k, v, mask):
    """q [B, Hq, T, hd], k/v [B, Hkv, S, hd], mask [B|1, 1, T, S] additive or None -> [B, Hq, T, hd] in
    q's dtype; in float64 with K/V repeated G = Hq / Hkv times (query head h reads kv head h // G)."""
    group = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)  # [B, Hq, S, hd]
    vv = v.double().repeat_interleave(group, dim=1)
    scores = q.double() @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5  # [B, Hq, T, S]
    if mask is not None:
        scores = scores + mask.double()
    return (torch.softmax(scores, dim=-1) @ vv).to(q.dtype)


def sdpa_enable_gqa(q, k, v, mask):
    """The drafter's attention before the GQA fold: one SDPA call with ``enable_gqa``."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if mask is None else mask.to(q.dtype), enable_gqa=q.shape[1] != k.shape[1]
    )


class OldTTTBlocks(TTTBlocks):
    """The former ``TTTBlocks.attend``: block 0 as a [T, T] float32 score matrix, later blocks as one score
    per row, one softmax over their concatenation; the probabilities are kept for backward."""

    def __init__(self, key_valid: torch.Tensor) -> None:
        super().__init__(key_valid)
        zero = torch.zeros((), device=key_valid.device)
        self.mask0 = torch.where(self.allowed, zero, torch.finfo(torch.float32).min)[:, None, None]

    def attend(self, q, k, v):
        self.keys.append(k)
        self.values.append(v)
        bsz, n_q, q_len, hd = q.shape
        n_kv = k.shape[1]
        qg = q.view(bsz, n_kv, n_q // n_kv, q_len, hd)  # [B, Hkv, rep, T, hd]
        scale = hd**-0.5
        first = torch.matmul(qg, self.keys[0].transpose(-1, -2).unsqueeze(2)).float() * scale + self.mask0
        scores = [first]  # [B, Hkv, rep, T, T]
        if len(self.keys) > 1:
            later_k = torch.stack(self.keys[1:], dim=3)  # [B, Hkv, T, j, hd]
            scores.append(torch.einsum("bhrtd,bhtjd->bhrtj", qg, later_k).float() * scale)
        probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1).to(v.dtype)
        out = torch.matmul(probs[..., :q_len], self.values[0].unsqueeze(2))  # [B, Hkv, rep, T, hd]
        if len(self.keys) > 1:
            later_v = torch.stack(self.values[1:], dim=3)  # [B, Hkv, T, j, hd]
            out = out + torch.einsum("bhrtj,bhtjd->bhrtd", probs[..., q_len:], later_v)
        return out.reshape(bsz, n_q, q_len, hd)


@contextlib.contextmanager
def old_ttt_blocks():
    """``ttt_unroll`` builds ``OldTTTBlocks`` inside the block."""
    real = ttt_mod.TTTBlocks
    ttt_mod.TTTBlocks = OldTTTBlocks
    try:
        yield
    finally:
        ttt_mod.TTTBlocks = real


def old_ttt_loss(drafter, batch, steps=7, decay=0.8):
    """The former ``ttt_loss`` over full [B, T, V] target logits, with the former attention."""
    t = batch.input_ids.shape[1]
    logits_t = batch.target_logits.float()  # [B, T, V]
    draft_ids = drafter.target_token_ids
    probs = torch.softmax(logits_t.index_select(-1, draft_ids), dim=-1)
    top = logits_t.argmax(-1)
    learn = batch.loss_mask.bool() & drafter.t2d[top]
    rows_ok = learn.new_ones(learn.shape) if batch.attention_mask is None else batch.attention_mask.bool()
    total = logits_t.new_zeros(())
    metrics = {}
    with old_ttt_blocks():  # the unroll builds its blocks at its first step
        unrolled = ttt_mod.ttt_unroll(drafter, batch.features, batch.input_ids, steps, batch.attention_mask)
        for j, (logits, _) in enumerate(unrolled):
            s = j + 1
            n_rows = max(t - s, 0)
            logp = torch.log_softmax(logits[:, :n_rows], dim=-1)
            mask = learn[:, s:] & rows_ok[:, :n_rows]
            count = mask.sum()
            denom = count.clamp(min=1)
            p = torch.where(mask.unsqueeze(-1), probs[:, s:], 0.0)
            loss_j = -(p * logp).sum() / denom
            agree = (drafter.to_target(logits[:, :n_rows].argmax(-1)) == top[:, s:]) & mask
            total = total + decay**j * loss_j
            metrics[f"loss_{j}"] = loss_j.detach()
            metrics[f"acc_{j}"] = agree.sum() / denom
            if j == 0:
                metrics["positions"] = count
    metrics["loss"] = total.detach()
    return total, metrics
