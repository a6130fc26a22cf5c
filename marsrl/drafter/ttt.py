"""The training-time test (TTT) of EAGLE-3 draft heads: the batch a target forward yields, the unrolled
steps and their loss.  Pure maths over one batch: no optimizer, no data loop (``refresh`` and ``offline``).

Training-time test (EAGLE-3, arXiv 2503.01840), for a sequence x_0 .. x_{T-1} with target features f_t:

    step 0, row t:  hidden fc(f_t),              token x_{t+1},   position t,     learns p(. | x_<=t+1)
    step j, row t:  hidden = step j-1's output,  token x_{t+j+1}, position t + j, learns p(. | x_<=t+j+1)

    attention of step j, row t: the step-0 keys of rows <= t (causal) and the key of row t at every
    step 1..j (the head's own earlier outputs on this row), exactly what the engine's chain draft sees.
    loss_j = soft cross-entropy against the target's softmax restricted to the draft vocabulary and
             renormalised, averaged over positions that are valid and whose target argmax is drafted.
    total  = sum_j decay**j * loss_j

The head's keys grow by one block of T per step; attention is causal over block 0 plus the diagonal of
every later block (``TTTBlocks`` computes exactly that without a dense mask; ``ttt_unroll(dense=True)``
is the slow reference with a ``DynamicCache`` and the full additive mask).

Choices worth knowing:
- Every step keeps all T rows (row t at step j runs past the sequence when t + j + 1 >= T); such rows are
  masked out of the loss, never dropped, so the key blocks stay aligned.
- Gradients flow through the fed-back hidden states and the earlier steps' keys (as SpecForge).
- The target's distribution is at temperature 1; the embedding is the target's and never trained.

Memory: the attention keeps no [T, T] scores for backward (``TTTBlocks``), the batch keeps the target's
logits at the draft vocabulary only, and the loss saves one [B, T, Vd] tensor per step.  At the 8B
defaults (batch 8, length 2048, 7 steps) a step still needs ~71 GiB, mostly the layer's own activations
and the per-step log-probabilities (bench/draft_memory.py breaks it down).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from .eagle3 import Eagle3Drafter
from .layers import TTTBlocks
from .taps import FeatureTap

DEFAULT_TTT_STEPS = 7
DEFAULT_DECAY = 0.8


@dataclass
class DraftBatch:
    """What one teacher-forced target forward yields for draft training (one device, all detached).

    Attributes:
        features: [B, T, 3*Ht] the residual stream entering the three aux layers.
        input_ids: [B, T] the sequence tokens.
        target_logits: row t is the target's prediction of token t+1, either [B, T, Vd] float32, the
            draft vocabulary's columns (column i: target id ``drafter.target_token_ids[i]``; what
            ``capture_batch(drafter=...)`` and ``refresh_draft`` keep), or the full [B, T, V] row
            (``ttt_loss`` cuts it to those columns itself).
        loss_mask: [B, T] bool; the target's distribution at position t is learned iff loss_mask[:, t]
            (and, with full rows, the target's argmax there is drafted).  With draft columns only it must
            already exclude positions whose argmax is outside the draft vocabulary (``draft_targets``),
            which the columns alone cannot tell.
        attention_mask: [B, T] bool real tokens (keys the head may attend to), or None for all.
    """

    features: torch.Tensor
    input_ids: torch.Tensor
    target_logits: torch.Tensor
    loss_mask: torch.Tensor
    attention_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2 or self.input_ids.dtype.is_floating_point:
            raise ValueError(f"input_ids must be [B, T] integer ids, got {list(self.input_ids.shape)}")
        bsz, t = self.input_ids.shape
        if self.features.dim() != 3 or tuple(self.features.shape[:2]) != (bsz, t):
            raise ValueError(
                f"features must be [B, T, 3*Ht] = [{bsz}, {t}, ...], got {list(self.features.shape)}"
            )
        if self.target_logits.dim() != 3 or tuple(self.target_logits.shape[:2]) != (bsz, t):
            raise ValueError(
                f"target_logits must be [B, T, V] = [{bsz}, {t}, V] (aligned with input_ids; row t predicts "
                f"token t+1), got {list(self.target_logits.shape)}"
            )
        for name in ("loss_mask", "attention_mask"):
            mask = getattr(self, name)
            if mask is not None and tuple(mask.shape) != (bsz, t):
                raise ValueError(f"{name} must be [B, T] = [{bsz}, {t}], got {list(mask.shape)}")


# ---------------------------------------------------------------------------------------- capture


@torch.no_grad()
def draft_targets(
    drafter: Eagle3Drafter, logits: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the TTT loss reads of the target's full logits: the draft vocabulary's columns, and where the
    target's argmax is drafted (only those positions are learned).

    logits [B, T, V] any float dtype, loss_mask [B, T] -> (logits [B, T, Vd] float32, loss_mask [B, T] bool
    & the argmax at t is drafted).  Detached; no float32 copy of the full rows is made.  At the 8B
    defaults (B 8, T 2048, V 151936, Vd 32000) that keeps 2.1 GB instead of 10 GB.
    """
    vocab = drafter.config.vocab_size
    if logits.dim() != 3 or logits.shape[-1] != vocab:
        raise ValueError(
            f"logits must be [B, T, V] over the head's target vocabulary V = {vocab}, "
            f"got {list(logits.shape)}"
        )
    drafted = drafter.t2d[logits.argmax(-1)]  # [B, T]
    return logits.index_select(-1, drafter.target_token_ids).float(), loss_mask.bool() & drafted


@torch.no_grad()
def capture_batch(
    target: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    layer_ids: Sequence[int] | None = None,
    *,
    loss_mask: torch.Tensor | None = None,
    drafter: Eagle3Drafter | None = None,
) -> DraftBatch:
    """One teacher-forced target forward with a ``FeatureTap``: features and detached float32 logits.

    With ``drafter``, only its draft vocabulary's logit columns are kept and the loss mask drops positions
    whose target argmax is not drafted (``draft_targets``: 4.75x less at the 8B defaults); without, the
    full [B, T, V] rows.  Either way the target's own [B, T, V] logits (its dtype) exist during the call.

    This is exactly what a trainer's own log-prob forward can capture (tap the same layers and keep the
    logits); a trainer that already has them builds a ``DraftBatch`` itself (or calls ``refresh_draft``)
    instead of paying for this second forward.

    Args:
        target: an HF causal LM (Llama / Qwen family); its mode and gradients are left alone.
        input_ids: [B, T]; attention_mask: [B, T] 1 for real tokens (left or right padding), None for all.
        layer_ids: the head's ``config.aux_layer_ids`` (None: the drafter's when given, else the default
            for the target's depth).
        loss_mask: [B, T] target positions to learn; None: every position t whose tokens t and t+1 are
            both real (the target's prediction of a token that is in the data).
        drafter: the head to be trained (its vocabulary maps and aux layers), or None.

    Position ids count real tokens (left padding starts each row at 0, as the engine does).
    Returns tensors on the target's device; features in the target's dtype.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    attention_mask = attention_mask.bool()
    if layer_ids is None and drafter is not None:
        layer_ids = drafter.config.aux_layer_ids
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    with FeatureTap(target, layer_ids) as tap:
        out = target(
            input_ids=input_ids,
            attention_mask=attention_mask.long(),
            position_ids=position_ids,
            use_cache=False,
        )
        features = tap.features()  # [B, T, 3*Ht]
    if loss_mask is None:
        loss_mask = attention_mask & F.pad(attention_mask[:, 1:], (0, 1), value=False)
    if drafter is None:
        logits, loss_mask = out.logits.float(), loss_mask.bool()
    else:
        logits, loss_mask = draft_targets(drafter, out.logits, loss_mask)
    del out  # the full [B, T, V] rows go before the caller trains
    return DraftBatch(
        features=features,
        input_ids=input_ids,
        target_logits=logits,
        loss_mask=loss_mask,
        attention_mask=attention_mask,
    )


# ---------------------------------------------------------------------------------------- TTT


def ttt_attention_mask(step: int, key_valid: torch.Tensor) -> torch.Tensor:
    """Additive float32 mask [B, 1, T, (step+1)*T] for step ``step``'s T queries over the cached keys.

    Key block 0 holds step 0's T keys, block i step i's.  Query row t sees block 0's rows s <= t that
    are real (``key_valid`` [B, T] bool) and row t of every block 1..step; it always sees its own key,
    so a padding row never has an empty softmax.
    """
    bsz, t = key_valid.shape
    dev = key_valid.device
    eye = torch.eye(t, dtype=torch.bool, device=dev)
    lower = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
    causal = (lower & key_valid.unsqueeze(1)) | eye  # [B, T, T]
    allowed = torch.cat([causal] + [eye.expand(bsz, t, t)] * step, dim=-1)  # [B, T, (step+1)*T]
    zero = torch.zeros((), device=dev)
    return torch.where(allowed, zero, torch.finfo(torch.float32).min).unsqueeze(1)


def ttt_unroll(
    drafter: Eagle3Drafter,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    steps: int = DEFAULT_TTT_STEPS,
    attention_mask: torch.Tensor | None = None,
    *,
    dense: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (logits [B, T, Vd] float32, hidden [B, T, H]) of steps 0 .. steps-1 of the training-time test.

    Row t of step j took token x_{t+j+1} (0 past the end) at position t + j, and predicts x_{t+j+2}.
    features [B, T, 3*Ht], input_ids [B, T], attention_mask [B, T] (real tokens) or None.

    The keys live in ``TTTBlocks`` (block-sparse attention, O(T^2 + jT) per step); ``dense=True`` is the
    slow reference: a ``DynamicCache`` and the full additive mask of ``ttt_attention_mask``.
    """
    bsz, t = input_ids.shape
    key_valid = (
        torch.ones(bsz, t, dtype=torch.bool, device=input_ids.device)
        if attention_mask is None
        else attention_mask.bool()
    )
    ids = F.pad(input_ids, (0, steps))  # [B, T + steps]: zeros past the end (rows masked out of the loss)
    pos = torch.arange(t, device=input_ids.device).unsqueeze(0)  # [1, T]
    cache = DynamicCache() if dense else TTTBlocks(key_valid)
    hidden = drafter.fuse(features)  # [B, T, H]
    for j in range(steps):
        mask = ttt_attention_mask(j, key_valid) if dense else None
        logits, hidden = drafter(ids[:, j + 1 : j + 1 + t], hidden, pos + j, cache, mask)
        yield logits, hidden


def ttt_loss(
    drafter: Eagle3Drafter, batch: DraftBatch, steps: int = DEFAULT_TTT_STEPS, decay: float = DEFAULT_DECAY
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The training-time-test loss sum_j decay**j * loss_j and its metrics (detached 0-dim tensors).

    Step j, row t is scored against the target's distribution at position t + j + 1, restricted to the
    draft vocabulary and renormalised; it counts when t + j + 1 < T, ``loss_mask`` holds there, row t is
    a real token, and the target's argmax there is in the draft vocabulary.

    Metrics: ``loss`` (the total), ``loss_j`` (per step, mean over counted positions), ``acc_j``
    (fraction of counted positions where the draft's argmax is the target's argmax), ``positions``
    (counted positions of step 0), ``accepted``: the expected drafts accepted of a greedy chain of
    ``steps`` from each counted row of step 0, sum_k prod_{j<=k} p_j, where p_j is the target's
    probability (draft vocabulary, renormalised) of the head's argmax at step j, 0 where step j does not
    count (the chain stops there); what strict verification of greedy drafts accepts on average, with the
    sequence's own tokens fed back as the unroll feeds them.  An empty step contributes 0.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    t = batch.input_ids.shape[1]
    logits_d, learn = _draft_columns(drafter, batch)  # [B, T, Vd] float32, [B, T] bool at target positions
    # the target's distribution restricted to the draft vocabulary and renormalised, zero where not learned
    # (a row of -inf logits there must not leak NaN); one tensor for every step (a step's loss saves a view)
    probs = torch.where(learn.unsqueeze(-1), torch.softmax(logits_d, dim=-1), 0.0)  # [B, T, Vd]
    top = logits_d.argmax(-1)  # [B, T] draft ids: the target's argmax wherever ``learn`` holds
    del logits_d
    rows_ok = learn.new_ones(learn.shape) if batch.attention_mask is None else batch.attention_mask.bool()

    total = probs.new_zeros(())
    metrics: dict[str, torch.Tensor] = {}
    chain = probs.new_ones(learn.shape)  # [B, T - s]: row t's chain still running after step j
    accepted = probs.new_zeros(learn.shape)  # [B, T]: expected drafts accepted from row t
    unrolled = ttt_unroll(drafter, batch.features, batch.input_ids, steps, batch.attention_mask)
    for j, (logits, _) in enumerate(unrolled):
        s = j + 1  # row t learns the target at t + s
        n_rows = max(t - s, 0)
        logp = torch.log_softmax(logits[:, :n_rows], dim=-1)  # [B, T-s, Vd]
        row_ok = rows_ok[:, :n_rows]  # [B, T-s]
        mask = learn[:, s:] & row_ok
        count = mask.sum()
        denom = count.clamp(min=1)
        cross = (probs[:, s:] * logp).sum(-1)  # [B, T-s]; 0 where the target is not learned
        loss_j = -torch.where(row_ok, cross, 0.0).sum() / denom
        draft = logits[:, :n_rows].detach().argmax(-1)  # [B, T-s] the head's greedy draft
        agree = (draft == top[:, s:]) & mask
        p_draft = probs[:, s:].gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # the target's p of the draft
        chain = chain[:, :n_rows] * torch.where(mask, p_draft, 0.0)
        accepted[:, :n_rows] += chain
        total = total + decay**j * loss_j
        metrics[f"loss_{j}"] = loss_j.detach()
        metrics[f"acc_{j}"] = agree.sum() / denom
        if j == 0:
            metrics["positions"] = count
            starts = mask
        del logits, logp
    metrics["loss"] = total.detach()
    metrics["accepted"] = accepted[:, : starts.shape[1]][starts].sum() / starts.sum().clamp(min=1)
    return total, metrics


def _draft_columns(drafter: Eagle3Drafter, batch: DraftBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's target logits at the draft vocabulary [B, T, Vd] float32 and the positions to learn."""
    vocab, vd = drafter.config.vocab_size, drafter.config.draft_vocab_size
    width = batch.target_logits.shape[-1]
    if width == vocab:  # full rows (also the Vd == V case: then the columns are the rows)
        return draft_targets(drafter, batch.target_logits, batch.loss_mask)
    if width == vd:
        return batch.target_logits.detach().float(), batch.loss_mask.bool()
    raise ValueError(
        f"target_logits has {width} columns but the head's target vocabulary is {vocab} and its draft "
        f"vocabulary {vd}"
    )
