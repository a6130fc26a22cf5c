"""Result types of the verification core: the per-token provenance codes and the per-round records.

Shape vocabulary (used across marsrl): B batch, K draft length, N tree nodes, D tree depth,
V target vocabulary.  Padding positions (after a round ends) have provenance ``PAD``, token ``-1``
and zeros in every float field; mask with ``provenance != Provenance.PAD``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

DEFAULT_THETA = 0.9
"""The paper's margin threshold: relax only where z2/z1 > theta (and z1 > 0)."""


class Provenance(IntEnum):
    """How an emitted token was produced. Stored as int8 in result tensors."""

    PAD = 0  # no token (the round ended earlier)
    ACCEPTED = 1  # a draft token that passed the strict test (u * q(x) < p(x), or x == argmax at T=0)
    RELAXED = 2  # a draft token accepted only by the margin rule (strict would have rejected it)
    RESAMPLED = 3  # drawn after a rejection: residual (strict/mars), full or adjusted p (mars_code)
    BONUS = 4  # drawn from p after every draft of the round (chain) / path (tree) was accepted


@dataclass(frozen=True)
class VerifyResult:
    """One verification round for a batch of draft chains.

    Every field is ``[B, K+1]`` unless noted; column j is the j-th emitted token of the round
    (column j < K verifies draft j, column K is the bonus position).
    """

    tokens: torch.Tensor  # [B, K+1] int64 emitted ids, -1 after the round ends
    num_emitted: torch.Tensor  # [B] int64: accepted drafts + 1
    provenance: torch.Tensor  # [B, K+1] int8 Provenance codes
    target_logprob: torch.Tensor  # [B, K+1] float32 log p(y) under the sampling distribution used
    behavior_logprob: torch.Tensor  # [B, K+1] float32 log b(y): prob. the procedure emitted y here
    logit_ratio: torch.Tensor  # [B, K+1] float32 z2/z1 on the raw logits (NaN where z1 == 0)
    is_top2: torch.Tensor  # [B, K+1] bool: y is the target's rank-2 token by raw logits
    # [B, K+1] float32: the target's mass at the position on tokens the procedure could not have emitted
    # there (b = 0 < p), given everything fixed before it was verified; 0 at padding
    unsupported_mass: torch.Tensor


@dataclass(frozen=True)
class TreeVerifyResult:
    """One verification round for a batch of draft trees: the accepted path plus the closing token.

    Fields are ``[B, D+1]`` where D is the deepest node of any tree in the batch; column j is the
    token emitted at depth j of the path (column 0 verifies the root's children).
    """

    tokens: torch.Tensor  # [B, D+1] int64 emitted ids, -1 after the round ends
    num_emitted: torch.Tensor  # [B] int64: accepted nodes + 1
    path_nodes: torch.Tensor  # [B, D+1] int64 tree-node index of each accepted token; -1 for the
    #                           closing (resampled / bonus) token and for padding
    provenance: torch.Tensor  # [B, D+1] int8
    target_logprob: torch.Tensor  # [B, D+1] float32
    behavior_logprob: torch.Tensor  # [B, D+1] float32
    logit_ratio: torch.Tensor  # [B, D+1] float32
    is_top2: torch.Tensor  # [B, D+1] bool
    unsupported_mass: torch.Tensor  # [B, D+1] float32: p-mass with b = 0 at the node (siblings fixed)
