"""Training a draft head on captured batches: a small AdamW trainer over the TTT loss (``ttt``) and the
online refresh a GRPO trainer calls after its log-prob forward, to keep the draft in step with the
policy.  The data loop over a corpus is ``offline``'s.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .eagle3 import Eagle3Drafter
from .ttt import DEFAULT_DECAY, DEFAULT_TTT_STEPS, DraftBatch, draft_targets, ttt_loss

DEFAULT_GRAD_CLIP = 0.5


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
    before_update: Callable[[dict[str, torch.Tensor]], None] | None = None,
) -> dict[str, float]:
    """One optimizer step on the TTT loss; metrics as floats (one host sync) plus the pre-clip grad norm.
    ``before_update(metrics)`` (``ttt_loss``'s, detached tensors) runs after the backward, before the
    parameters move (the head is still the one the metrics were measured on)."""
    was_training = drafter.training
    drafter.train()
    optimizer.zero_grad(set_to_none=True)
    loss, metrics = ttt_loss(drafter, batch, steps, decay)
    loss.backward()
    max_norm = float("inf") if grad_clip is None else grad_clip
    metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if before_update is not None:
        before_update(metrics)
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

    def step(
        self, batch: DraftBatch, before_update: Callable[[dict[str, torch.Tensor]], None] | None = None
    ) -> dict[str, float]:
        """One optimizer step on ``batch``; returns its metrics (``ttt_loss``'s plus grad_norm, as floats).
        ``before_update(metrics)``, if given, sees ``ttt_loss``'s metrics before the parameters move (they
        are unchanged when it runs)."""
        metrics = _train_step(
            self.drafter,
            self.optimizer,
            self.params,
            batch,
            self.steps,
            self.decay,
            self.grad_clip,
            before_update,
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
