"""Training EAGLE-3 draft heads: the training-time test (TTT) loss, a small AdamW trainer, the online
refresh a GRPO trainer calls after its log-prob forward, and a resumable offline loop over sequences the
target generated itself.

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

Leaves out: data / tensor parallel training, sequence packing, mixed-precision master weights (train the
head in float32), learning-rate schedules, activation checkpointing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import DynamicCache

from ..batching import bucket_by_length
from .checkpoint import CONFIG_FILE, SAFETENSORS_FILE
from .config import DEFAULT_DRAFT_VOCAB, OFFLINE  # noqa: F401  (DEFAULT_DRAFT_VOCAB: re-exported)
from .eagle3 import EMBED_KEY, Eagle3Drafter
from .layers import TTTBlocks
from .taps import FeatureTap

DEFAULT_TTT_STEPS = 7
DEFAULT_DECAY = 0.8
DEFAULT_GRAD_CLIP = 0.5
STATE_FILE = "trainer_state.pt"
_PARTIAL = ".partial"  # a save in progress under out_dir; complete once it holds STATE_FILE


class ResumeError(ValueError):
    """A checkpoint under out_dir cannot continue this run (different head or data schedule)."""


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


# ---------------------------------------------------------------------------------------- vocabulary


def select_draft_vocab(
    sequences: Iterable[Sequence[int]] | Mapping[int, int] | torch.Tensor,
    draft_vocab_size: int,
    vocab_size: int,
) -> torch.Tensor:
    """The draft vocabulary: sorted int64 ids [Vd] of the ``draft_vocab_size`` most frequent target tokens.

    Args:
        sequences: the training RESPONSES as token-id sequences, or token counts already made: a mapping
            id -> count (e.g. ``collections.Counter``) or a 1-D tensor of counts [V].
        draft_vocab_size: Vd, 1 <= Vd <= V.
        vocab_size: V, the target vocabulary; every id must lie in [0, V).

    Ties are broken by the lower id.  When fewer than Vd distinct tokens occur, the lowest unused ids
    fill the rest (they are never predicted by the data, but keep the head's size as asked).
    """
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ValueError(
            f"draft_vocab_size must be in [1, vocab_size = {vocab_size}], got {draft_vocab_size}"
        )
    counts = _token_counts(sequences, vocab_size)  # [V] int64
    # stable sort on -count keeps ids ascending among equal counts
    order = torch.sort(-counts, stable=True).indices
    seen = int((counts > 0).sum())
    chosen = order[: min(seen, draft_vocab_size)]
    if chosen.numel() < draft_vocab_size:
        unused = torch.ones(vocab_size, dtype=torch.bool)
        unused[chosen] = False
        fill = unused.nonzero().flatten()[: draft_vocab_size - chosen.numel()]
        chosen = torch.cat([chosen, fill])
    return chosen.sort().values


def _token_counts(source, vocab_size: int) -> torch.Tensor:
    if isinstance(source, torch.Tensor):
        if source.dim() != 1 or source.numel() != vocab_size:
            raise ValueError(
                f"token counts must be a 1-D tensor [V] = [{vocab_size}], got {list(source.shape)}"
            )
        counts = source.long()
    elif isinstance(source, Mapping):
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for tok, n in source.items():
            _check_id(tok, vocab_size, "token counts")
            counts[tok] += int(n)
    else:
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for i, seq in enumerate(source):
            ids = torch.as_tensor(list(seq), dtype=torch.long)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                raise ValueError(f"sequences[{i}] has ids outside [0, {vocab_size})")
            counts += torch.bincount(ids, minlength=vocab_size)
    if bool((counts < 0).any()):
        raise ValueError("token counts must be >= 0")
    return counts


def _check_id(tok, vocab_size: int, what: str) -> None:
    if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < vocab_size:
        raise ValueError(f"{what}: {tok!r} is not a token id in [0, {vocab_size})")


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
    (counted positions of step 0).  An empty step contributes 0.
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
        agree = (logits[:, :n_rows].argmax(-1) == top[:, s:]) & mask
        total = total + decay**j * loss_j
        metrics[f"loss_{j}"] = loss_j.detach()
        metrics[f"acc_{j}"] = agree.sum() / denom
        if j == 0:
            metrics["positions"] = count
        del logits, logp
    metrics["loss"] = total.detach()
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


# ---------------------------------------------------------------------------------------- trainer


def trainable_parameters(drafter: Eagle3Drafter) -> list[nn.Parameter]:
    """The head's parameters that training updates: all but the (shared, frozen) token embedding."""
    params = [
        p for n, p in drafter.named_parameters() if not n.startswith("embed_tokens.") and p.requires_grad
    ]
    if not params:
        raise ValueError("the drafter has no trainable parameters (all frozen)")
    return params


def _train_step(
    drafter: Eagle3Drafter,
    optimizer: torch.optim.Optimizer,
    params: list[nn.Parameter],
    batch: DraftBatch,
    steps: int,
    decay: float,
    grad_clip: float | None,
) -> dict[str, float]:
    """One optimizer step on the TTT loss; metrics as floats (one host sync) plus the pre-clip grad norm."""
    was_training = drafter.training
    drafter.train()
    optimizer.zero_grad(set_to_none=True)
    loss, metrics = ttt_loss(drafter, batch, steps, decay)
    loss.backward()
    max_norm = float("inf") if grad_clip is None else grad_clip
    metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    drafter.train(was_training)
    names = list(metrics)
    values = torch.stack([metrics[k].detach().float() for k in names]).tolist()  # one host sync
    return dict(zip(names, values, strict=True))


class DraftTrainer:
    """AdamW on an EAGLE-3 head's trainable parameters (never the shared embedding) with the TTT loss.

    Args:
        drafter: the head to train (train it in float32).
        lr, betas, weight_decay: AdamW's (SpecForge trains with lr 1e-4; EAGLE ~5e-5).
        grad_clip: max global grad norm, or None for no clipping.
        steps, decay: TTT unroll depth and per-step loss weight (see ``ttt_loss``).
    """

    def __init__(
        self,
        drafter: Eagle3Drafter,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
        grad_clip: float | None = DEFAULT_GRAD_CLIP,
        steps: int = DEFAULT_TTT_STEPS,
        decay: float = DEFAULT_DECAY,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {grad_clip}")
        if steps < 1:
            raise ValueError(f"steps (TTT unroll depth) must be >= 1, got {steps}")
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.drafter = drafter
        self.params = trainable_parameters(drafter)
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.grad_clip = grad_clip
        self.steps = steps
        self.decay = decay
        self.step_count = 0

    def step(self, batch: DraftBatch) -> dict[str, float]:
        """One optimizer step on ``batch``; returns its metrics (``ttt_loss``'s plus grad_norm, as floats)."""
        metrics = _train_step(
            self.drafter, self.optimizer, self.params, batch, self.steps, self.decay, self.grad_clip
        )
        self.step_count += 1
        return metrics

    def state_dict(self) -> dict:
        """Optimizer state and step count (the head's weights are saved with ``save_pretrained``).

        As torch's, the tensors are the live ones: serialise (``torch.save``) before stepping again."""
        return {"optimizer": self.optimizer.state_dict(), "step": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_count = int(state["step"])


def refresh_draft(
    drafter: Eagle3Drafter,
    trainer_or_optimizer: DraftTrainer | torch.optim.Optimizer,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    steps: int = 1,
    *,
    attention_mask: torch.Tensor | None = None,
) -> dict[str, float]:
    """Keep the draft in step with a changing policy: ``steps`` optimizer steps on one captured batch.

    Call it after the RL trainer's log-prob forward, with what that forward already computed (tap the
    head's ``aux_layer_ids`` with a ``FeatureTap`` during it): features [B, T, 3*Ht], input_ids [B, T],
    the policy's logits [B, T, V] (row t predicts token t+1; detached here, any float dtype), loss_mask
    [B, T] (target positions to learn, e.g. the completion's), attention_mask [B, T] real tokens or None.
    The logits may instead be a ``DraftBatch``'s draft-vocabulary columns [B, T, Vd], with that batch's
    loss_mask.  Full rows are cut to the draft columns at once (``draft_targets``), so the refresh never
    holds a float32 copy of them.
    All four cover the same T positions: a trainer that keeps logits for the completion only must cut
    the features and ids to those positions too (the head then sees no prompt keys).

    A ``DraftTrainer`` brings its own TTT depth, decay and clipping; a bare optimizer (over the head's
    parameters, without the embedding) runs with the defaults (7 steps, decay 0.8, clip 0.5).

    Returns the last step's metrics (its ``loss`` is measured before that step's update) plus
    ``loss_before`` (the loss before the first update) and ``refresh_steps``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    target_logits = target_logits.detach()
    loss_mask = loss_mask.bool()
    if target_logits.dim() == 3 and target_logits.shape[-1] == drafter.config.vocab_size:
        target_logits, loss_mask = draft_targets(drafter, target_logits, loss_mask)
    batch = DraftBatch(
        features=features.detach(),
        input_ids=input_ids,
        target_logits=target_logits.float(),
        loss_mask=loss_mask,
        attention_mask=None if attention_mask is None else attention_mask.bool(),
    )
    if isinstance(trainer_or_optimizer, DraftTrainer):
        if trainer_or_optimizer.drafter is not drafter:
            raise ValueError("the DraftTrainer was built for another drafter")
        run = trainer_or_optimizer.step
    elif isinstance(trainer_or_optimizer, torch.optim.Optimizer):
        params = _optimizer_params(drafter, trainer_or_optimizer)

        def run(b: DraftBatch) -> dict[str, float]:
            return _train_step(
                drafter, trainer_or_optimizer, params, b, DEFAULT_TTT_STEPS, DEFAULT_DECAY, DEFAULT_GRAD_CLIP
            )
    else:
        raise TypeError(
            "trainer_or_optimizer must be a DraftTrainer or a torch Optimizer, got "
            f"{type(trainer_or_optimizer).__name__}"
        )
    first = None
    for _ in range(steps):
        metrics = run(batch)
        first = metrics["loss"] if first is None else first
    return {**metrics, "loss_before": first, "refresh_steps": steps}


def _optimizer_params(drafter: Eagle3Drafter, optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    """The optimizer's parameters, checked to be the head's and never its embedding."""
    own = {id(p) for p in trainable_parameters(drafter)}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(p is drafter.embed_tokens.weight for p in params):
        raise ValueError(
            "the optimizer holds the drafter's token embedding, which is shared and never trained"
        )
    if not params or any(id(p) not in own for p in params):
        raise ValueError("the optimizer must hold only the drafter's trainable parameters")
    return params


# ---------------------------------------------------------------------------------------- offline


def make_batch(
    sequences: Sequence[Sequence[int]],
    max_len: int,
    prompt_lens: Sequence[int] | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad sequences (cut to ``max_len``): input_ids [B, T], attention_mask [B, T], loss_mask [B, T].

    loss_mask[b, t]: tokens t and t+1 are real and t+1 is a response token (t + 1 >= prompt_lens[b]).
    """
    lens = [min(len(s), max_len) for s in sequences]
    width = max(lens)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    for b, (seq, n) in enumerate(zip(sequences, lens, strict=True)):
        ids[b, :n] = torch.as_tensor(list(seq[:n]), dtype=torch.long)
    slots = torch.arange(width)
    attn = slots < torch.tensor(lens).unsqueeze(1)  # [B, T]
    start = (
        torch.zeros(len(sequences), dtype=torch.long) if prompt_lens is None else torch.tensor(prompt_lens)
    )
    loss = (slots + 1 < torch.tensor(lens).unsqueeze(1)) & (slots + 1 >= start.unsqueeze(1))
    return ids.to(device), attn.to(device), loss.to(device)


def train_offline(
    target: nn.Module,
    drafter: Eagle3Drafter,
    sequences: Sequence[Sequence[int]],
    *,
    epochs: int = OFFLINE.epochs,
    batch_size: int = OFFLINE.batch_size,
    max_len: int = OFFLINE.max_len,
    lr: float = OFFLINE.lr,
    out_dir: str | os.PathLike | None = None,
    resume: bool = True,
    progress: bool = True,
    seed: int = OFFLINE.seed,
    save_every: int = OFFLINE.save_every,
    prompt_lens: Sequence[int] | None = None,
    max_steps: int | None = None,
) -> dict:
    """Train ``drafter`` on sequences the target generated itself (prompt + response token ids).

    Each step: a batch of sequences (shuffled per epoch from ``seed`` and bucketed by length; right-padded;
    cut to ``max_len``),
    one target forward through ``capture_batch``, one ``DraftTrainer`` step.  ``prompt_lens`` (one per
    sequence) limits the loss to predictions of response tokens; None trains on every position.

    With ``out_dir``: the head (``save_pretrained``) and ``trainer_state.pt`` (optimizer, step, loss
    history, RNG state) are written every ``save_every`` steps and at the end, through a staging folder so
    a run killed mid-save keeps the previous checkpoint.  With ``resume`` and a checkpoint there, the head
    weights and trainer state are loaded and training continues at the saved step on the same schedule;
    the seed, data size, batch size and max_len must match (``ResumeError`` otherwise).  Without
    ``resume`` an old trainer_state.pt there is deleted at once.  ``max_steps`` stops early (after saving).

    Returns: ``steps`` (global steps done), ``start_step``, ``first_loss`` / ``last_loss`` / ``min_loss``
    over the whole run's loss history, ``last_metrics``, ``out_dir``.
    """
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("max_len", max_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2 (a token and its successor), got {max_len}")
    if save_every < 1:
        raise ValueError(f"save_every must be >= 1, got {save_every}")
    sequences = [list(s) for s in sequences]
    if not sequences:
        raise ValueError("sequences is empty")
    for i, seq in enumerate(sequences):
        if len(seq) < 2:
            raise ValueError(f"sequences[{i}] has {len(seq)} token(s); at least 2 are needed")
    if prompt_lens is not None and len(prompt_lens) != len(sequences):
        raise ValueError(f"prompt_lens has {len(prompt_lens)} entries for {len(sequences)} sequences")

    schedule = _schedule([min(len(q), max_len) for q in sequences], batch_size, epochs, seed)
    total = len(schedule) if max_steps is None else min(len(schedule), max_steps)
    trainer = DraftTrainer(drafter, lr=lr)
    data_key = {"seed": seed, "num_sequences": len(sequences), "batch_size": batch_size, "max_len": max_len}
    losses: list[float] = []
    out = None if out_dir is None else Path(out_dir)
    if out is not None and not resume:  # starting over: a stale state must never be resumed later
        shutil.rmtree(out / _PARTIAL, ignore_errors=True)
        (out / STATE_FILE).unlink(missing_ok=True)
    if out is not None and resume:
        state = _load_checkpoint(out, drafter, data_key)
        if state is not None:
            trainer.load_state_dict(state["trainer"])
            losses = list(state["losses"])
            torch.set_rng_state(state["rng"])
    start = trainer.step_count
    saved_at = start if out is not None and (out / STATE_FILE).is_file() else None  # step on disk
    device = next(target.parameters()).device
    layer_ids = drafter.config.aux_layer_ids
    metrics: dict[str, float] = {}
    bar = tqdm(total=total, initial=min(start, total), disable=not progress, desc="draft train", unit="step")
    try:
        for step in range(start, total):
            idx = schedule[step]
            lens = None if prompt_lens is None else [prompt_lens[i] for i in idx]
            ids, attn, loss_mask = make_batch([sequences[i] for i in idx], max_len, lens, device)
            batch = capture_batch(target, ids, attn, layer_ids, loss_mask=loss_mask, drafter=drafter)
            metrics = trainer.step(batch)
            losses.append(metrics["loss"])
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc0=f"{metrics['acc_0']:.2f}")
            if out is not None and trainer.step_count % save_every == 0:
                _save_checkpoint(out, drafter, trainer, losses, data_key)
                saved_at = trainer.step_count
    finally:
        bar.close()
    if out is not None and saved_at != trainer.step_count:
        _save_checkpoint(out, drafter, trainer, losses, data_key)
    return {
        "steps": trainer.step_count,
        "start_step": start,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "min_loss": min(losses) if losses else None,
        "last_metrics": metrics,
        "out_dir": None if out is None else str(out),
    }


def _schedule(lengths: Sequence[int], batch_size: int, epochs: int, seed: int) -> list[list[int]]:
    """Every step's sequence indices: a fresh permutation per epoch from one seeded generator, bucketed
    by length (``marsrl.batching``) so a batch pads little."""
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(epochs):
        perm = torch.randperm(len(lengths), generator=gen).tolist()
        steps += bucket_by_length(perm, lengths, batch_size, gen)
    return steps


def _save_checkpoint(out: Path, drafter: Eagle3Drafter, trainer: DraftTrainer, losses, data_key) -> None:
    """Write head + state into out/.partial, then move them into out (the state file last)."""
    partial = out / _PARTIAL
    shutil.rmtree(partial, ignore_errors=True)
    drafter.save_pretrained(partial)
    state = {
        "trainer": trainer.state_dict(),
        "losses": list(losses),
        "rng": torch.get_rng_state(),
        **data_key,
    }
    torch.save(state, partial / (STATE_FILE + ".tmp"))
    os.replace(partial / (STATE_FILE + ".tmp"), partial / STATE_FILE)  # the staged save is now complete
    _finish_partial(out)


def _finish_partial(out: Path) -> None:
    """Move a complete staged save into ``out``; discard an incomplete one."""
    partial = out / _PARTIAL
    if not partial.is_dir():
        return
    if (partial / STATE_FILE).is_file():
        for name in (CONFIG_FILE, SAFETENSORS_FILE, STATE_FILE):
            if (partial / name).exists():
                os.replace(partial / name, out / name)
    shutil.rmtree(partial, ignore_errors=True)


def _load_checkpoint(out: Path, drafter: Eagle3Drafter, data_key: dict) -> dict | None:
    """Load out's head weights into ``drafter`` and return its trainer state, or None when there is none."""
    _finish_partial(out)
    if not (out / STATE_FILE).is_file():
        return None
    state = torch.load(out / STATE_FILE, map_location="cpu", weights_only=True)
    for key, want in data_key.items():
        if state.get(key) != want:
            raise ResumeError(
                f"{out / STATE_FILE} was written with {key}={state.get(key)!r} but this run has "
                f"{key}={want!r}; use the same value to resume, or start over (resume=False / --no-resume)"
            )
    from safetensors.torch import load_file

    saved = load_file(str(out / SAFETENSORS_FILE))
    own = {k: v for k, v in drafter.state_dict().items() if not (k == EMBED_KEY and drafter.embedding_shared)}
    if set(saved) != set(own) or any(saved[k].shape != v.shape for k, v in own.items()):
        raise ResumeError(
            f"{out / SAFETENSORS_FILE} holds a head of another shape than the one being trained"
        )
    if not torch.equal(saved["d2t"], own["d2t"].cpu()):
        raise ResumeError(
            f"{out / SAFETENSORS_FILE} has another draft vocabulary than the head being trained"
        )
    with torch.no_grad():
        for key, tensor in own.items():
            tensor.copy_(saved[key])
    return state
