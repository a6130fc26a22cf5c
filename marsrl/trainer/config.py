"""``MarsGRPOConfig``: TRL's ``GRPOConfig`` plus what a trainer on MARS rollouts must decide — how the
behaviour log-probs correct the loss, whether an uncorrected lossy run is allowed, how the EAGLE-3 head is
kept in step and how stale a trajectory may be. Defaults live here and only here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from trl import GRPOConfig

IsCorrection = Literal[
    "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "sequence"
]
IS_CORRECTIONS: tuple[str, ...] = IsCorrection.__args__


@dataclass
class MarsGRPOConfig(GRPOConfig):
    """GRPOConfig for ``MarsGRPOTrainer`` (rollouts from a marsrl ``RolloutPool``, ``use_vllm=False``).

    New fields:
        is_correction: how the per-token importance ratio w = pi / b (policy log-prob recomputed by the
            trainer against the BEHAVIOUR log-prob the rollout recorded) weights the loss. ``"none"``: no
            correction (refused for a lossy rule unless ``allow_uncorrected_lossy``);
            ``"token_truncate"`` / ``"token_mask"`` / ``"sequence_truncate"`` / ``"sequence_mask"``: TRL's
            vLLM modes, same meaning and clipping (``is_clip_min`` / ``is_clip_max``); ``"sequence"``: the
            untruncated product of the per-token ratios over the completion, the exact (unbiased,
            high-variance) importance weight.
        is_clip_min, is_clip_max: bounds of the ``*_truncate`` (clamp) and ``*_mask`` (zero outside) modes.
        allow_uncorrected_lossy: train on a lossy rule (mars, mars_code with theta < 1) with
            ``is_correction="none"``; off by default, the trainer then fails at the first step.
        draft_refresh_every: every this many optimizer steps, train the EAGLE-3 head on the policy's
            own states (its three feature layers and its detached distribution, captured in the
            trainer's policy forward: the training forward itself when fused) and send it with the policy
            (0 = never; needs ``drafter=``; ``marsrl.trainer.draft``).
        draft_refresh_lr: peak learning rate of the head's own AdamW (betas 0.9 / 0.95, no decay).
        draft_refresh_lr_scheduler_type: the head's schedule over its optimizer steps (a transformers
            scheduler name, as ``lr_scheduler_type``), apart from the policy's.
        draft_refresh_warmup_steps: warm-up of that schedule, in head optimizer steps.
        draft_refresh_grad_clip: max global norm of the head's gradient (None: no clipping).
        draft_refresh_steps: optimizer steps of the head per refresh, on the captured rows.
        draft_refresh_rows: completions of the batch (an even share of each micro-batch) the head trains
            on per refresh; the TTT unroll costs ~``draft_refresh_ttt_steps`` draft forwards and backwards
            a row (None: every row).
        draft_refresh_ttt_steps: draft steps the training-time test unrolls per row (the engine's draft
            length is what they prepare the head for).
        draft_refresh_gate: train a copy of the head and serve it to the pool only when, on a refresh's
            rows (which neither head has learned from), its TTT loss is below the served head's; False:
            train the served head in place and send every refresh (``marsrl.trainer.draft``).
        fuse_policy_forward: when the policy that made a generation batch is the one every training
            forward on it runs (``num_iterations == 1`` and ``steps_per_generation`` dividing
            ``gradient_accumulation_steps``: TRL's own condition for pi_old = pi), take the policy's
            log-probs for the importance weights, and the final-norm hidden states for the top-1 / top-2
            statistics, from the training forward itself (detached) and skip the separate no-grad forward.
            Evaluation keeps the separate forward. False: always the separate forward.
        max_policy_lag: the largest allowed difference between the trainer's step and the policy version
            a trajectory was generated with; larger is an error, not silent staleness.
    """

    is_correction: IsCorrection = field(
        default="token_truncate",
        metadata={
            "help": "Importance correction with the behaviour log-probs: none, token_truncate, token_mask, "
            "sequence_truncate, sequence_mask (TRL's vLLM modes) or sequence (the exact product)."
        },
    )
    is_clip_min: float | None = field(
        default=None, metadata={"help": "Lower bound of the truncate / mask correction modes (None: none)."}
    )
    is_clip_max: float | None = field(
        default=3.0, metadata={"help": "Upper bound of the truncate / mask correction modes (None: none)."}
    )
    allow_uncorrected_lossy: bool = field(
        default=False,
        metadata={"help": "Allow a lossy rule (mars, mars_code) with is_correction='none'."},
    )
    draft_refresh_every: int = field(
        default=0,
        metadata={
            "help": "Refresh the EAGLE-3 head every N steps on the trainer's own features (0 = never)."
        },
    )
    draft_refresh_lr: float = field(
        default=5e-4, metadata={"help": "Peak learning rate of the head's own AdamW."}
    )
    draft_refresh_lr_scheduler_type: str = field(
        default="constant_with_warmup",
        metadata={"help": "The head's learning-rate schedule (a transformers scheduler name)."},
    )
    draft_refresh_warmup_steps: int = field(
        default=0, metadata={"help": "Warm-up of the head's schedule, in head optimizer steps."}
    )
    draft_refresh_grad_clip: float | None = field(
        default=0.5, metadata={"help": "Max gradient norm of the head (None: no clipping)."}
    )
    draft_refresh_steps: int = field(default=1, metadata={"help": "Head optimizer steps per refresh."})
    draft_refresh_rows: int | None = field(
        default=8, metadata={"help": "Completions per refresh, spread over the batch (None: all)."}
    )
    draft_refresh_ttt_steps: int = field(
        default=7, metadata={"help": "Draft steps the head's training-time test unrolls per row."}
    )
    draft_refresh_gate: bool = field(
        default=True,
        metadata={
            "help": "Serve the refreshed head only when its TTT loss is below the served one's on the "
            "refresh's fresh rows (False: every refresh is served)."
        },
    )
    fuse_policy_forward: bool = field(
        default=True,
        metadata={
            "help": "With one policy per generation (num_iterations == 1, steps_per_generation dividing "
            "gradient_accumulation_steps), take the IS log-probs and top-1/top-2 statistics from the "
            "training forward instead of a separate no-grad forward (False: always the separate one)."
        },
    )
    max_policy_lag: int = field(
        default=0,
        metadata={"help": "Largest allowed trainer step minus a trajectory's policy version."},
    )

    def __post_init__(self):
        super().__post_init__()
        _deepspeed_comm(self)
        if self.is_correction not in IS_CORRECTIONS:
            raise ValueError(
                f"is_correction must be one of {list(IS_CORRECTIONS)}, got {self.is_correction!r}"
            )
        for name in ("is_clip_min", "is_clip_max"):
            v = getattr(self, name)
            if v is not None and (math.isnan(v) or v < 0):
                raise ValueError(f"{name} must be None or >= 0, got {v}")
        if (
            self.is_clip_min is not None
            and self.is_clip_max is not None
            and self.is_clip_max <= self.is_clip_min
        ):
            raise ValueError(f"is_clip_max ({self.is_clip_max}) must be > is_clip_min ({self.is_clip_min})")
        if self.is_correction.endswith("_truncate") and self.is_clip_min is None and self.is_clip_max is None:
            raise ValueError(f"is_correction={self.is_correction!r} needs is_clip_min or is_clip_max")
        if self.draft_refresh_every < 0:
            raise ValueError(f"draft_refresh_every must be >= 0, got {self.draft_refresh_every}")
        if not self.draft_refresh_lr > 0:
            raise ValueError(f"draft_refresh_lr must be > 0, got {self.draft_refresh_lr}")
        if self.draft_refresh_steps < 1:
            raise ValueError(f"draft_refresh_steps must be >= 1, got {self.draft_refresh_steps}")
        if self.draft_refresh_grad_clip is not None and not self.draft_refresh_grad_clip > 0:
            raise ValueError(
                f"draft_refresh_grad_clip must be None or > 0, got {self.draft_refresh_grad_clip}"
            )
        if self.draft_refresh_warmup_steps < 0:
            raise ValueError(
                f"draft_refresh_warmup_steps must be >= 0, got {self.draft_refresh_warmup_steps}"
            )
        if self.draft_refresh_ttt_steps < 1:
            raise ValueError(f"draft_refresh_ttt_steps must be >= 1, got {self.draft_refresh_ttt_steps}")
        _check_scheduler("draft_refresh_lr_scheduler_type", self.draft_refresh_lr_scheduler_type)
        if self.draft_refresh_rows is not None and self.draft_refresh_rows < 1:
            raise ValueError(f"draft_refresh_rows must be None or >= 1, got {self.draft_refresh_rows}")
        if self.max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0, got {self.max_policy_lag}")
        if self.use_vllm:
            raise ValueError("use_vllm must be False: MarsGRPOTrainer generates with a marsrl RolloutPool")
        if self.loss_type == "vespo" and self.is_correction not in ("none", "token_truncate", "token_mask"):
            raise ValueError(
                "loss_type='vespo' reads per-token ratios: set is_correction to token_truncate or token_mask"
            )
        if not self.temperature > 0:
            raise ValueError(
                "temperature must be > 0: the correction needs the sampling distribution's log-probs"
            )
        # every generation setting is honoured by the pool or refused here (docs/trainer-options.md)
        from ..integrations.trl import check_generation_args

        check_generation_args(self)


def _check_scheduler(name: str, value: str) -> None:
    from transformers.trainer_utils import SchedulerType

    try:
        SchedulerType(value)
    except ValueError:
        choices = [s.value for s in SchedulerType]
        raise ValueError(f"{name} must be one of {choices}, got {value!r}") from None


def _deepspeed_comm(args: GRPOConfig) -> None:
    """Start DeepSpeed's communication layer on the process group accelerate already made.

    On CPU (``use_cpu``, gloo) accelerate builds a MULTI_CPU group and never calls
    ``deepspeed.init_distributed``; ZeRO-3's ``zero.Init`` (model loading) then sees world size 1 and fails
    its batch-size check with several ranks. With a group present this wraps it (a no-op when DeepSpeed's
    layer is already up, as under ``accelerate launch`` on GPUs)."""
    if not args.deepspeed:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    import deepspeed

    if not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
