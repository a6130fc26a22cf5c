"""Length-bucketed batching for the CPU training loops (SFT of the tiny target, EAGLE-3 TTT).

Right-padded batches cost compute on their padding; sequences drawn in a random order and padded to the
longest of each batch waste about a third of it on the tiny world's data.  ``bucket_by_length`` keeps the
randomness of the draw but sorts each window of ``group`` batches by length before cutting it, then
shuffles the batches of the window, so every batch holds sequences of similar length.

Leaves out: packing several sequences into one row (it needs per-sequence attention masks).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

DEFAULT_GROUP = 8  # batches per sorted window: larger pads less, but batches get less random


def bucket_by_length(
    order: Sequence[int],
    lengths: Sequence[int],
    batch_size: int,
    generator: torch.Generator,
    group: int = DEFAULT_GROUP,
) -> list[list[int]]:
    """Cut ``order`` (indices into ``lengths``, already shuffled) into batches of ``batch_size``.

    Each window of ``group * batch_size`` indices is sorted by length (stable), cut into batches, and its
    batches are put in a random order drawn from ``generator``.  Every index of ``order`` appears exactly
    once; only the last batch may be short.  ``group=1`` keeps ``order`` as it is.
    """
    if batch_size < 1 or group < 1:
        raise ValueError(f"batch_size and group must be >= 1, got {batch_size} and {group}")
    batches: list[list[int]] = []
    window = batch_size * group
    for start in range(0, len(order), window):
        chunk = list(order[start : start + window])
        if group > 1:
            chunk.sort(key=lambda i: lengths[i])
        cut = [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        if group > 1:
            cut = [cut[i] for i in torch.randperm(len(cut), generator=generator).tolist()]
        batches += cut
    return batches
