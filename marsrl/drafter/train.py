"""Training EAGLE-3 draft heads, in three modules: ``ttt`` (the training-time test: the batch a target
forward yields, the unrolled steps, their loss), ``refresh`` (a small AdamW trainer on that loss and the
online refresh a GRPO trainer calls after its log-prob forward) and ``offline`` (the draft vocabulary and
a resumable loop over sequences the target generated itself).  Their public names are importable from
here.
"""

from .config import DEFAULT_DRAFT_VOCAB
from .offline import STATE_FILE, ResumeError, make_batch, select_draft_vocab, train_offline
from .refresh import DEFAULT_GRAD_CLIP, DraftTrainer, refresh_draft, trainable_parameters
from .ttt import (
    DEFAULT_DECAY,
    DEFAULT_TTT_STEPS,
    DraftBatch,
    capture_batch,
    draft_targets,
    ttt_attention_mask,
    ttt_loss,
    ttt_unroll,
)

__all__ = [
    "DEFAULT_DECAY",
    "DEFAULT_DRAFT_VOCAB",
    "DEFAULT_GRAD_CLIP",
    "DEFAULT_TTT_STEPS",
    "STATE_FILE",
    "DraftBatch",
    "DraftTrainer",
    "ResumeError",
    "capture_batch",
    "draft_targets",
    "make_batch",
    "refresh_draft",
    "select_draft_vocab",
    "train_offline",
    "trainable_parameters",
    "ttt_attention_mask",
    "ttt_loss",
    "ttt_unroll",
]
