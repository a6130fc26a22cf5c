"""A ragged view over a transformers ``DynamicCache``: every row shares the cache's time axis, but row b
owns only the slots ``[starts[b], starts[b] + lengths[b])``; every other slot (prompt padding on the left,
rejected drafts on the right) is masked out of attention and overwritten by the next commit.

Each speculative round appends a block of T entries for every row, then ``commit`` moves the entries
each row keeps (e.g. the accepted prefix of a chain, or the accepted path of a tree) to the end of that
row's valid region and crops the shared axis.  Cost per commit: one gather/scatter of T entries per
layer, no copy of the whole cache, and nothing at all when every row keeps its entries in place (plain
decoding of left-padded prompts).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class RaggedCache:
    def __init__(self, batch: int, device: torch.device):
        self.cache = DynamicCache()
        self.starts = torch.zeros(batch, dtype=torch.long, device=device)  # [B] first valid slot per row
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [B] valid slots per row

    @property
    def width(self) -> int:
        """Length of the shared time axis (>= every row's length)."""
        return self.cache.get_seq_length() if self.cache.layers else 0

    def attention_mask(self, block_allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [B, 1, T, width + T] for appending a block of T queries.

        block_allowed [B or 1, T, T] bool: which new entries each new query may see (causal for a chain,
        ancestors for a tree). Every query also sees its row's valid cached slots. A query whose row
        allows nothing else still sees itself, so padding queries never produce NaN.
        """
        bsz = self.lengths.shape[0]
        t = block_allowed.shape[-1]
        dev = self.lengths.device
        slots = torch.arange(self.width, device=dev)
        old = (slots >= self.starts.unsqueeze(1)) & (slots < (self.starts + self.lengths).unsqueeze(1))
        new = block_allowed.expand(bsz, t, t) | torch.eye(t, dtype=torch.bool, device=dev)
        allowed = torch.cat([old.unsqueeze(1).expand(bsz, t, -1), new], dim=2)
        zero = torch.zeros((), dtype=dtype, device=dev)
        return torch.where(allowed, zero, torch.finfo(dtype).min).unsqueeze(1)

    def lockstep_mask(self, extra: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [B, 1, 1, width + extra] for single queries appended one at a time in lockstep
        (a chain draft): each row's valid slots and every slot from ``width`` on.  Step j (j + 1 entries
        appended) uses ``mask[..., : width + j + 1]``; built once, sliced per step."""
        slots = torch.arange(self.width + extra, device=self.lengths.device)
        allowed = (slots >= self.starts.unsqueeze(1)) & (slots < (self.starts + self.lengths).unsqueeze(1))
        allowed = allowed | (slots >= self.width)  # [B, width + extra]
        zero = torch.zeros((), dtype=dtype, device=self.lengths.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None, None, :]

    def commit(self, block_start: int, keep: torch.Tensor, counts: torch.Tensor) -> None:
        """Keep ``counts[b]`` entries of the block appended at ``block_start``.

        keep [B, J] indices into the block (0 = its first entry), in the order to store them; entries
        ``j >= counts[b]`` are ignored. Moves them right after the row's valid region and crops.
        """
        bsz, j = keep.shape
        src = block_start + keep  # [B, J] absolute slots
        dst = (self.starts + self.lengths).unsqueeze(1) + torch.arange(j, device=keep.device)  # [B, J]
        if j and not torch.equal(src, dst):
            for layer in self.cache.layers:
                for name in ("keys", "values"):
                    t = getattr(layer, name)  # [B, Hkv, width, D]
                    shape = (bsz, t.shape[1], j, t.shape[3])
                    moved = t.gather(2, src.view(bsz, 1, j, 1).expand(shape))
                    t.scatter_(2, dst.view(bsz, 1, j, 1).expand(shape), moved)
        self.lengths = self.lengths + counts
        self.crop(int((self.starts + self.lengths).max()) if bsz else 0)

    def crop(self, width: int) -> None:
        """Drop slots at and after ``width`` on the shared axis (rows' lengths are unchanged)."""
        extra = self.width - width
        if extra > 0:
            self.cache.crop(-extra)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (finished sequences stop costing compute)."""
        if self.cache.layers:
            self.cache.batch_select_indices(rows)
        self.starts = self.starts[rows]
        self.lengths = self.lengths[rows]
