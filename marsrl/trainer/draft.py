"""Keeping the EAGLE-3 head in step with the policy GRPO trains.

The head learns from the trainer's own policy forward, as NeMo-RL does: during it, pre-hooks on the head's
three feature layers keep the residual stream (detached) and a hook on the final norm keeps the hidden
states, whose lm_head product is the policy's own distribution at every position (detached). Once a
generation batch's micro-batches went through, the head takes ``draft_refresh_steps`` optimizer steps of
the training-time-test loss (``marsrl.drafter.train.ttt_loss``: soft cross-entropy against the policy's
distribution restricted to the draft vocabulary, over the unrolled draft steps) on the rows kept from
them. The head has its own AdamW, gradient clip and learning-rate schedule (``draft_refresh_*`` in
``MarsGRPOConfig``); nothing flows back into the policy.

Which rows: ``draft_refresh_rows`` of the generation batch, an even share from each micro-batch (TRL
shuffles the batch before splitting it, so a share is a sample of the groups); each row is cut to the span
its real tokens cover, so a refresh does not pay for the batch's padding. Which positions: those that
predict a completion token (where the engine drafts); the prompt stays as keys.

The gate (``draft_refresh_gate``, on by default): the head the pool drafts with (the *served* head,
``drafter``) and the head that learns (the *live* head, a copy sharing the frozen embedding) are kept
apart. At each refresh the kept rows are fresh to both: neither has learned from them. On them each head
is measured by its TTT loss (the objective it learns) and, for the logs, by the drafts a greedy chain
would accept (``ttt_loss``'s ``accepted``): the served head in one no-grad unroll, the live head in its
own training step, before its update. When the live head's loss is lower, its weights as measured
(before this refresh's update) become the served head and go to the pool; otherwise the pool keeps
drafting with the served one. So a refresh that makes the head worse for the current policy (the first
steps of a fresh AdamW on a converged head, or a policy that moves faster than the head follows) is not
served, and the served head changes only to one that beat it, paired on the same rows. The cost: a
second copy of the head (without the embedding) and one no-grad unroll a refresh. Without the gate the
served head is the one trained, in place, and every refresh reaches the pool. (Judged by ``accepted``
instead, the gate served heads that drafted worse: docs/benchmarks.md, bench/train.py ``--refresh``.)

Departures: the rows are rank 0's (its features are local); the policy's logits are taken at T = 1 (the
distribution the head approximates), whatever the rollout temperature.
Leaves out: a refresh spread over several generation batches (the head learns on the latest policy only).
"""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn.functional as F
from transformers import get_scheduler

from ..drafter.train import DraftBatch, DraftTrainer, ttt_loss


class DraftRefresher:
    """The head's own optimizer, clip and schedule, and the rows of the batch it learns from next.

    Args:
        drafter: the ``Eagle3Drafter`` the pool drafts with (trained in place, float32).
        args: the trainer's ``MarsGRPOConfig`` (the ``draft_refresh_*`` fields).
        total_refreshes: refreshes the run will make (the schedule's length).
    """

    def __init__(self, drafter, args, total_refreshes: int):
        self.drafter = drafter
        self.args = args
        self.gate = bool(getattr(args, "draft_refresh_gate", False))
        # the head that learns: the served one itself, or (gated) a copy sharing its frozen embedding
        self.live = _copy_sharing_embedding(drafter) if self.gate else drafter
        self.trainer = DraftTrainer(
            self.live,
            lr=args.draft_refresh_lr,
            grad_clip=args.draft_refresh_grad_clip,
            steps=args.draft_refresh_ttt_steps,
            weight_decay=0.0,
        )
        self.scheduler = get_scheduler(
            args.draft_refresh_lr_scheduler_type,
            self.trainer.optimizer,
            num_warmup_steps=args.draft_refresh_warmup_steps,
            num_training_steps=max(total_refreshes, 1) * args.draft_refresh_steps,
        )
        self.refreshes = 0
        self._pending: list[dict] = []

    # ---------------------------------------------------------------- rows of the batch
    def add(
        self,
        features: torch.Tensor,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_mask: torch.Tensor,
        share: float,
    ) -> None:
        """Keep ``ceil(share * draft_refresh_rows)`` rows, evenly spaced, of one forward's chunk.

        features [N, T, 3*Ht] (detached, the head's three layers), hidden [N, T, Ht] (the final norm's
        output), input_ids / attention_mask [N, T] (prompt + completion), completion_mask [N, C] (the
        completion's last C positions); ``share``: this chunk's part of the generation batch."""
        n = input_ids.shape[0]
        want = self.args.draft_refresh_rows
        keep = n if want is None else min(n, max(1, math.ceil(share * want)))
        pick = torch.linspace(0, n - 1, keep, device=input_ids.device).round().long()
        width = completion_mask.shape[1]
        learn = torch.zeros_like(attention_mask, dtype=torch.bool)
        learn[:, -width - 1 : -1] = completion_mask.bool()  # position t predicts completion token t+1
        self._pending.append(
            {
                # a padding position's state is never a key nor learned; zeroed so it cannot be NaN
                "features": features[pick].detach() * attention_mask[pick, :, None],
                "hidden": hidden[pick].detach(),
                "input_ids": input_ids[pick],
                "attention_mask": attention_mask[pick].bool(),
                "learn": learn[pick],
            }
        )

    @property
    def pending_rows(self) -> int:
        return sum(p["input_ids"].shape[0] for p in self._pending)

    def discard(self) -> None:
        self._pending = []

    # ---------------------------------------------------------------- the refresh
    def refresh(self, lm_head: torch.nn.Module) -> dict[str, float]:
        """Train the live head on the kept rows (then forgotten) against the policy's distribution there,
        serving it first when gated and it beat the served head on these rows; returns ``draft/*``
        metrics (``draft/published`` 1 when the served head changed)."""
        start = time.perf_counter()
        dev = next(self.drafter.parameters()).device
        part = _join([_cut(p) for p in self._pending])
        self._pending = []
        logits, learn = self._targets(lm_head, part["hidden"], part["learn"])
        batch = DraftBatch(
            features=part["features"].to(dev),
            input_ids=part["input_ids"].to(dev),
            target_logits=logits.to(dev),
            loss_mask=learn.to(dev),
            attention_mask=part["attention_mask"].to(dev),
        )
        served = None
        if self.gate and self.refreshes > 0:  # before the first refresh the live head is the served one
            served = self._measure(self.drafter, batch)
        first: dict[str, float] = {}

        def before_update(measured: dict[str, torch.Tensor]) -> None:
            """The first step's measures (the live head on rows it has not learned from) and, gated, the
            live head as measured served when its TTT loss is below the served head's."""
            if first:
                return
            first.update(loss=float(measured["loss"]), accepted=float(measured["accepted"]))
            if served is not None and first["loss"] < served["loss"]:
                _copy_weights(self.live, self.drafter)
                first["published"] = 1.0

        metrics: dict[str, float] = {}
        with torch.enable_grad():
            for _ in range(self.args.draft_refresh_steps):
                metrics = self.trainer.step(batch, before_update)
                self.scheduler.step()
        self.refreshes += 1
        served = served or first  # the served head is the live one before the first refresh, or ungated
        return {
            "draft/loss": first["loss"],  # the live head on the current policy's states, before its update
            "draft/accepted": first["accepted"],
            "draft/served_loss": served["loss"],
            "draft/served_accepted": served["accepted"],
            "draft/published": first.get("published", 0.0) if self.gate else 1.0,
            "draft/acc_0": metrics["acc_0"] if self.args.draft_refresh_steps == 1 else float("nan"),
            "draft/grad_norm": metrics["grad_norm"],
            "draft/lr": self.scheduler.get_last_lr()[0],
            "draft/rows": float(batch.input_ids.shape[0]),
            "draft/positions": metrics["positions"],
            "draft/seconds": time.perf_counter() - start,
        }

    def _measure(self, head, batch: DraftBatch) -> dict[str, float]:
        """``head``'s TTT loss and expected accepted drafts on ``batch`` (no gradient), at the live head's
        depth and decay, in the mode the training step measures the live head in."""
        was_training = head.training
        head.train()
        with torch.no_grad():
            _, measured = ttt_loss(head, batch, self.trainer.steps, self.trainer.decay)
        head.train(was_training)
        return {"loss": float(measured["loss"]), "accepted": float(measured["accepted"])}

    @torch.no_grad()
    def _targets(self, lm_head, hidden: torch.Tensor, learn: torch.Tensor, chunk: int = 4096):
        """The policy's logits at the draft vocabulary [B, T, Vd] float32, computed only where a
        completion token is predicted (elsewhere 0, never learned), and ``learn`` limited to positions
        whose argmax is drafted (``draft_targets``' rule, without [B, T, V] rows)."""
        head = self.drafter
        cols = head.target_token_ids.to(hidden.device)
        weight, bias = lm_head.weight, lm_head.bias
        out = torch.zeros(*learn.shape, cols.numel(), dtype=torch.float32, device=hidden.device)
        where = learn.flatten().nonzero().squeeze(1)
        rows = hidden.flatten(0, 1)
        flat = out.view(-1, cols.numel())
        drafted = torch.zeros(learn.numel(), dtype=torch.bool, device=hidden.device)
        for s in range(0, where.numel(), chunk):
            at = where[s : s + chunk]
            z = F.linear(rows[at].to(weight.dtype), weight, bias)  # [c, V]
            drafted[at] = head.t2d.to(z.device)[z.argmax(-1)]
            flat[at] = z.index_select(-1, cols).float()
        return out, learn & drafted.view_as(learn)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Optimizer, schedule, count and (gated) the live head's own weights; the served head is the
        trainer's ``drafter``, saved with it."""
        return {
            "trainer": self.trainer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "refreshes": self.refreshes,
            "live": _own_weights(self.live) if self.gate else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.trainer.load_state_dict(state["trainer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.refreshes = int(state["refreshes"])
        if self.gate and state.get("live") is not None:
            missing, unexpected = self.live.load_state_dict(state["live"], strict=False)
            if unexpected or any(not k.startswith("embed_tokens.") for k in missing):
                raise ValueError(
                    f"the refresher's live head does not fit this drafter (missing {missing}, "
                    f"unexpected {unexpected})"
                )
        elif self.gate:  # a state saved without the gate: the live head starts from the served one
            _copy_weights(self.drafter, self.live)


def _copy_sharing_embedding(drafter):
    """A deep copy of the head whose token embedding is the original's (shared with the policy, frozen):
    a second head costs its own layers only."""
    shared = drafter.embed_tokens.weight
    return copy.deepcopy(drafter, memo={id(shared): shared})


@torch.no_grad()
def _copy_weights(source, dest) -> None:
    """``dest``'s parameters and buffers set to ``source``'s, in place (the shared embedding is the same
    tensor in both)."""
    src = source.state_dict()
    for name, d in dest.state_dict().items():
        if d.data_ptr() != src[name].data_ptr():
            d.copy_(src[name])


def _own_weights(head) -> dict:
    """The head's state without the shared embedding (a checkpoint keeps that once, with the policy)."""
    return {k: v for k, v in head.state_dict().items() if not k.startswith("embed_tokens.")}


def _cut(part: dict) -> dict:
    """The columns some kept row has a real token in (left-padded prompts, right-padded completions)."""
    real = part["attention_mask"].any(0).nonzero().squeeze(1)
    lo, hi = int(real[0]), int(real[-1]) + 1
    return {k: v[:, lo:hi] for k, v in part.items()}


def _join(parts: list[dict]) -> dict:
    """One batch of the kept rows: each part right-padded to the widest (padding is never a key nor
    learned)."""
    width = max(p["input_ids"].shape[1] for p in parts)
    out = {}
    for key in parts[0]:
        padded = []
        for p in parts:
            v = p[key]
            extra = width - v.shape[1]
            pad = (0, 0, 0, extra) if v.dim() == 3 else (0, extra)
            padded.append(F.pad(v, pad, value=False if v.dtype == torch.bool else 0))
        out[key] = torch.cat(padded)
    return out
