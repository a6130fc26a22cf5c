"""A rollout's completion with its per-token record, and ``collate``: the one place that turns a batch of
them into right-padded tensors (``pad_per_token`` pads one field of it, for a caller whose per-token
lists do not come as Trajectories, such as the trainer's rows from TRL).

This module is the ground floor: it imports nothing from marsrl (engine, rollout, trainers and metrics
all import it), so a consumer of trajectories needs no engine.  It leaves out how a record is produced
(``marsrl.engine``) and what is computed from it (``marsrl.metrics``, ``marsrl.algo``).

Serialisation: ``vars(t)`` / ``dataclasses.asdict(t)`` give a JSON-ready dict and ``Trajectory(**d)``
reads it back.  A dict without ``unsupported_mass`` and ``relax_prob`` (an older record) still loads: the
mass reads as zeros and relax_prob as 1.0 (the paper's rule, the only relaxation such a record can hold).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PAD_PROVENANCE = 0
"""Provenance code of padding (``marsrl.verify.Provenance.PAD``; repeated here to keep this module free
of imports — a test checks the two agree)."""

PER_TOKEN_FIELDS = (
    "provenance",
    "target_logprobs",
    "behavior_logprobs",
    "logit_ratio",
    "unsupported_mass",
    "is_top2",
    "draft_position",
)
"""The per-token lists of a Trajectory besides ``completion_ids``; each has len(completion_ids)."""


@dataclass
class Trajectory:
    """One completion with its per-token record (every per-token list has len(completion_ids)).

    Per token y at completion index i (see ``docs/concepts.md``, "The per-token record"):
    its provenance, log p(y) under the target's sampling distribution, log b(y) under the procedure that
    emitted it, the target's raw-logit margin z2/z1, whether y is the rank-2 token, its index in its
    draft round, and the unsupported mass: the target's probability mass at that position on tokens the
    procedure could not have emitted there (b = 0 < p; what no importance weight can restore).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    provenance: list[int]  # Provenance codes (int8 values)
    target_logprobs: list[float]  # log p(y) under the sampling distribution used at rollout
    behavior_logprobs: list[float]  # log b(y): the probability the procedure emitted y
    logit_ratio: list[float]  # z2 / z1 of the target's raw logits at the position (NaN where z1 == 0)
    is_top2: list[bool]
    draft_position: list[int]  # index in its round (0 = first token emitted by that target forward)
    finish_reason: str  # "eos" | "stop" | "length"
    rule: str
    theta: float
    # sum of p over the tokens with b = 0 at the position; None (a record from before the field existed)
    # reads as zeros.  The engine always fills it.
    unsupported_mass: list[float] | None = None
    relax_prob: float = 1.0  # the lambda the rollout verified with (1 = the paper's rule)
    stats: dict = field(default_factory=dict)  # rounds, drafted, accepted, relaxed for this sequence
    policy_version: int | None = None  # weights version that produced it (set by rollout workers)

    def __post_init__(self):
        if self.unsupported_mass is None:
            self.unsupported_mass = [0.0] * len(self.completion_ids)


# name -> (dtype, padding value), in the order of the returned dict ("mask" follows completion_ids)
_COLLATED: dict[str, tuple[torch.dtype, float | int | bool]] = {
    "completion_ids": (torch.int64, 0),
    "provenance": (torch.int8, PAD_PROVENANCE),
    "target_logprobs": (torch.float32, 0.0),
    "behavior_logprobs": (torch.float32, 0.0),
    "logit_ratio": (torch.float32, 0.0),
    "unsupported_mass": (torch.float32, 0.0),
    "is_top2": (torch.bool, False),
    "draft_position": (torch.int64, -1),
}


def pad_per_token(name: str, lists, width: int | None = None) -> torch.Tensor:
    """[N, width] tensor of the per-token field ``name`` of N lists, right-padded as ``collate`` pads it
    (its dtype and padding value there), width = the longest list when None.  Raises ValueError when a
    list is longer than ``width``."""
    dtype, pad = _COLLATED[name]
    lists = list(lists)
    lengths = [len(values) for values in lists]
    longest = max(lengths, default=0)
    width = longest if width is None else width
    if longest > width:
        i = lengths.index(longest)
        raise ValueError(f"{name} of row {i} has {longest} entries, more than the width {width}")
    mask = torch.arange(width).unsqueeze(0) < torch.tensor(lengths, dtype=torch.int64).unsqueeze(1)  # [N, T]
    padded = torch.full((len(lists), width), pad, dtype=dtype)
    padded[mask] = torch.tensor([v for values in lists for v in values], dtype=dtype)  # row-major order
    return padded


def collate(trajectories, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """Right-pad the per-token record of N trajectories into [N, T] tensors, T = the longest completion.

    Returns ``completion_ids`` int64 (pad 0), ``mask`` bool (True on completion tokens), ``provenance``
    int8 (pad 0 = PAD), ``target_logprobs`` / ``behavior_logprobs`` / ``logit_ratio`` /
    ``unsupported_mass`` float32 (pad 0), ``is_top2`` bool (pad False), ``draft_position`` int64 (pad -1),
    all on ``device`` (None: the CPU).  Raises ValueError naming the field and the trajectory when a
    per-token list's length differs from len(completion_ids), or when behavior_logprobs has a NaN.
    """
    trajectories = list(trajectories)
    lengths = [len(t.completion_ids) for t in trajectories]
    for i, (t, n) in enumerate(zip(trajectories, lengths, strict=True)):
        for name in PER_TOKEN_FIELDS:
            got = len(getattr(t, name))
            if got != n:
                raise ValueError(f"{name} of trajectory {i} has {got} entries but completion_ids has {n}")
    width = max(lengths, default=0)
    out: dict[str, torch.Tensor] = {}
    for name in _COLLATED:
        out[name] = pad_per_token(name, [getattr(t, name) for t in trajectories], width)
        if name == "completion_ids":
            lens = torch.tensor(lengths, dtype=torch.int64)
            out["mask"] = torch.arange(width).unsqueeze(0) < lens.unsqueeze(1)  # [N, T]
    nan_rows = out["behavior_logprobs"].isnan().any(dim=1).nonzero()
    if nan_rows.numel():
        raise ValueError(f"behavior_logprobs of trajectory {int(nan_rows[0])} has NaN")
    return out if device is None else {k: v.to(device) for k, v in out.items()}
