"""A ragged KV cache in preallocated buffers: every row shares one time axis, but row b owns only the
slots ``[starts[b], starts[b] + lengths[b])``; every other slot (prompt padding on the left, rejected
drafts on the right) is masked out of attention and overwritten by the next write.

Layout per layer: ``keys`` / ``values`` [B, Hkv, C, hd] with capacity C >= width; slots ``[0, width)``
are live.  A forward appends its block of T entries in place at ``[width, width + T)`` (no copy of what
is already cached) and attention reads the view ``[:, :, :width + T]``.  ``commit`` then moves the
entries each row keeps (the accepted prefix of a chain, the accepted path of a tree) to the end of that
row's valid region and shrinks ``width``: one flat index_select / index_copy_ of T entries a row per
buffer, and nothing at all when every row keeps its entries in place.  ``select`` (rows leave the
batch) fills the places of the rows that left with rows from the end of the batch (``fill_order``), in
the same buffers, so a finish costs one row's copy and not the rows after it; the slots before the
earliest row start are dropped when that saves an eighth of the width.

Every slot attention reads must hold a finite number, masked or not: 0 x NaN is NaN in the softmax's
weighted sum, and buffers are allocated uninitialised.  Appends keep that by construction (a forward
writes every row's slots up to the new width); a plain step written ``at_ends`` does not (rows ending
short of the axis leave their slot at it unwritten), so the first one on a set of buffers zeroes the
slots past the width once (``_RaggedLayer.finite``), a cost only calls that decode ragged rows pay.

A plain step over rows whose ends differ (after speculative rounds) writes each row's entry at its own
end (``at_ends``, ``ends_mask``, ``commit_in_place``) instead of appending and moving it.

Host-side mirrors: ``width`` and the per-row ends (``starts + lengths``) are kept on the host as well, so
no method here reads a device tensor back (on a GPU that would be a sync per call).

``bytes_copied`` counts every byte written into the buffers: appends (T entries a forward, flat in the
committed length), commit moves, compaction on ``select`` and growth when a buffer must be enlarged
(capacity is preallocated from the caller's hint, so growth happens only when the hint was short).

Deliberately left out: paging, sliding windows, CUDA graphs.
"""

from __future__ import annotations

import contextlib

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class _RaggedLayer(CacheLayerMixin):
    """One layer's preallocated K/V; ``owner`` holds the capacity hint and the byte counter."""

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, owner: RaggedCache):
        super().__init__()
        self.owner = owner
        self.width = 0  # live slots [0, width)
        # every slot of the buffers holds a finite number: slots [0, width) always do (every one was
        # written), the rest once ``at_ends`` zeroed them; False again whenever the buffers are new
        self.finite = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        bsz, heads, _, hd = key_states.shape
        cap = max(self.owner.capacity, key_states.shape[2])
        self.device = key_states.device
        self.keys = key_states.new_empty(bsz, heads, cap, hd)
        self.values = value_states.new_empty(bsz, value_states.shape[1], cap, value_states.shape[3])
        self.finite = False
        self.is_initialized = True

    def _grow(self, need: int) -> None:
        cap = max(need, 2 * self.keys.shape[2])
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[0], old.shape[1], cap, old.shape[3])
            new[:, :, : self.width] = old[:, :, : self.width]
            self.owner._count(new[:, :, : self.width])
            setattr(self, name, new)
        self.finite = False

    def update(self, key_states, value_states, *args, **kwargs):
        """Append [B, Hkv, T, hd] in place; returns views of slots [0, width + T).  Inside
        ``RaggedCache.at_ends`` (T = 1) each row's entry goes to its own end slot instead."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[2]
        end = self.width + t
        if end > self.keys.shape[2]:
            self._grow(end)
        if self.owner._at_ends is not None:
            if t != 1:
                raise ValueError(f"RaggedCache.at_ends writes one entry a row, got a block of {t}")
            if not self.finite:  # a row's slots past its end are read (masked) from now on
                self.keys[:, :, self.width :].zero_()
                self.values[:, :, self.width :].zero_()
                self.finite = True
            for buf, new in ((self.keys, key_states), (self.values, value_states)):
                flat = self.owner._end_slots(buf)
                buf.view(-1, buf.shape[3]).index_copy_(0, flat, new.reshape(-1, new.shape[3]))
        else:
            self.keys[:, :, self.width : end] = key_states
            self.values[:, :, self.width : end] = value_states
        self.owner._count(key_states, value_states)
        self.width = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.width + query_length, 0

    def get_seq_length(self) -> int:
        return self.width

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' convention: drop ``-tokens_to_remove`` slots from the end (a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of slots to drop, got {tokens_to_remove}")
        self.width = max(0, self.width + tokens_to_remove)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("rows leave a RaggedCache through RaggedCache.select")


class _Layers(Cache):
    """The transformers-facing side: a ``Cache`` whose layers are made on first write."""

    def __init__(self, owner: RaggedCache):
        super().__init__(layer_class_to_replicate=lambda: _RaggedLayer(owner))


class RaggedCache:
    def __init__(self, batch: int, device: torch.device, capacity: int = 0):
        """capacity: slots to preallocate per row (prompt width + the most the completion and one
        round's block can add); buffers double if a write would pass it."""
        self.capacity = capacity
        self.cache = _Layers(self)
        self.starts = torch.zeros(batch, dtype=torch.long, device=device)  # [B] first valid slot per row
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [B] valid slots per row
        self._starts = [0] * batch  # host mirror of starts
        self._ends = [0] * batch  # host mirror of starts + lengths
        self.bytes_copied = 0
        self._at_ends: dict | None = None  # inside ``at_ends``: flat end slots per buffer shape

    def _count(self, *tensors: torch.Tensor) -> None:
        self.bytes_copied += sum(t.numel() * t.element_size() for t in tensors)

    def set_rows(self, starts: torch.Tensor, lengths: torch.Tensor, starts_host, lengths_host) -> None:
        """Declare each row's valid region (after a prefill): [B] on the device and the same on the host."""
        self.starts, self.lengths = starts, lengths
        self._starts = list(starts_host)
        self._ends = [s + n for s, n in zip(starts_host, lengths_host, strict=True)]

    @property
    def width(self) -> int:
        """Length of the shared time axis (>= every row's end)."""
        return self.cache.layers[0].width if self.cache.layers else 0

    @property
    def dense(self) -> bool:
        """Every row's valid slots are all of [0, width) (host mirrors, no device read): a query that
        sees its whole row then needs no mask at all."""
        width = self.width
        return not any(self._starts) and all(e == width for e in self._ends)

    @property
    def ends(self) -> list[int]:
        """Host copy of each row's end slot (starts + lengths)."""
        return self._ends

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

    def aligned(self) -> bool:
        """Every row's valid region ends at the shared axis's end (host mirrors): an appended entry
        then sits right after its row's region and a plain step's commit moves nothing."""
        width = self.width
        return all(e == width for e in self._ends)

    def ends_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [B, 1, 1, width + 1] for one query a row written at its row's own end
        (``at_ends``): each row sees its valid slots and the slot right after them, its new entry."""
        slots = torch.arange(self.width + 1, device=self.lengths.device)
        ends = (self.starts + self.lengths).unsqueeze(1)
        allowed = (slots >= self.starts.unsqueeze(1)) & (slots <= ends)
        zero = torch.zeros((), dtype=dtype, device=self.lengths.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None, None, :]

    @contextlib.contextmanager
    def at_ends(self):
        """Within: a forward of one query a row writes each row's K/V entry at that row's end slot
        (``starts + lengths``), not at the shared axis's end, so a plain step over rows of unequal ends
        (after speculative rounds) needs no commit move: ``commit_in_place`` follows.  The axis still
        grows by one slot (the longest rows' entries land there).  Use with ``ends_mask``."""
        self._at_ends = {}
        try:
            yield
        finally:
            self._at_ends = None

    def _end_slots(self, t: torch.Tensor) -> torch.Tensor:
        """Flat indices of every row's end slot in buffer ``t`` (``_flat_slots``), one per shape."""
        key = tuple(t.shape[:3])
        if key not in self._at_ends:
            self._at_ends[key] = _flat_slots((self.starts + self.lengths).unsqueeze(1), t)
        return self._at_ends[key]

    def commit_in_place(self, counts: torch.Tensor, counts_host: list[int]) -> None:
        """After a forward ``at_ends``: each row keeps its entry (counts all 1), already in place."""
        self.lengths = self.lengths + counts
        self._ends = [e + c for e, c in zip(self._ends, counts_host, strict=True)]
        self.crop(max(self._ends) if self._ends else 0)

    def commit(
        self,
        block_start: int,
        keep: torch.Tensor,
        counts: torch.Tensor,
        counts_host: list[int],
        in_order: bool = False,
    ) -> None:
        """Keep ``counts[b]`` entries of the block appended at ``block_start``.

        keep [B, J] indices into the block (0 = its first entry), in the order to store them; entries
        ``j >= counts[b]`` are ignored.  counts [B] on the device, ``counts_host`` the same on the host.
        ``in_order``: keep is ``arange(J)`` for every row (a chain or a plain step), so rows whose valid
        region already ends at ``block_start`` need no move; when all do, nothing is copied.
        Moves the kept entries right after the row's valid region and shrinks the shared axis.
        """
        bsz, j = keep.shape
        moves = j > 0 and not (in_order and all(e == block_start for e in self._ends))
        if moves:
            src = block_start + keep  # [B, J] absolute slots
            dst = (self.starts + self.lengths).unsqueeze(1) + torch.arange(j, device=keep.device)  # [B, J]
            flat: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
            for layer in self.cache.layers:
                for name in ("keys", "values"):
                    # [B, Hkv, C, hd], contiguous (a buffer of its own, or a leading slice of one)
                    t = getattr(layer, name)
                    if (key := tuple(t.shape[:3])) not in flat:
                        flat[key] = (_flat_slots(src, t), _flat_slots(dst, t))
                    s, d = flat[key]
                    rows = t.view(-1, t.shape[3])  # one (row, head, slot) a row
                    moved = rows.index_select(0, s)  # a copy: moves within a row may overlap
                    rows.index_copy_(0, d, moved)
                    self._count(moved)
        self.lengths = self.lengths + counts
        self._ends = [e + c for e, c in zip(self._ends, counts_host, strict=True)]
        self.crop(max(self._ends) if bsz else 0)

    def crop(self, width: int) -> None:
        """Drop slots at and after ``width`` on the shared axis (rows' lengths are unchanged)."""
        for layer in self.cache.layers:
            layer.width = min(layer.width, width)

    def select(self, rows: torch.Tensor, rows_host: list[int], at: torch.Tensor | None = None) -> None:
        """Keep only ``rows`` [B'] (``rows_host`` the same on the host), in that order: finished
        sequences stop costing compute.

        Distinct rows (rows leave, in any order) stay in the same buffers: a kept row already at its
        place is not touched and only the others are copied, gathered first, so any order is safe;
        ``fill_order`` gives the order that moves the fewest (one row a row that left, where keeping
        the increasing order moves every row after the first that left).  Repeated rows (a prompt's
        state copied out to its group's rows) get new buffers (same capacity).  The slots before the
        earliest kept start are dropped only when that saves at least an eighth of the width, since
        dropping them moves every row.

        ``at``: ``moved_places(rows_host)`` on the device already (the engine sends it with ``rows`` in
        one copy); without it the places are copied to the device here when some rows stay."""
        n = len(rows_host)
        width = self.width
        shift = min(self._starts[i] for i in rows_host) if rows_host else 0
        distinct = len(set(rows_host)) == n
        in_place = distinct and bool(self.cache.layers) and n <= self.cache.layers[0].keys.shape[0]
        if in_place and 8 * shift < width:
            shift = 0  # a few padding slots cost less attention than moving every row
        # the places whose row changes (every place when slots are dropped or the buffers are new)
        moves_all = not in_place or shift > 0
        places = list(range(n)) if moves_all else moved_places(rows_host)
        if places and len(places) < n:
            at = at if at is not None else torch.tensor(places, device=rows.device)
            moving = rows.index_select(0, at)
        else:
            at, moving = None, rows
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)  # [B, Hkv, C, hd]
                # rows leaving compact into the first n rows of the same buffers: no new allocation,
                # whose first touch costs more than the copy
                new = t[:n] if in_place else t.new_empty(n, t.shape[1], t.shape[2], t.shape[3])
                if places:
                    live = t[:, :, shift:width].index_select(0, moving)  # a copy: [moving, Hkv, w, hd]
                    if at is None:
                        new[:, :, : width - shift] = live
                    else:
                        new[:, :, : width - shift].index_copy_(0, at, live)
                    self._count(live, live)  # gathered, then written into place
                setattr(layer, name, new)
            layer.finite = layer.finite and in_place  # new buffers hold uninitialised memory past width
            layer.width = width - shift
        self.starts = self.starts[rows] - shift
        self.lengths = self.lengths[rows]
        self._starts = [self._starts[i] - shift for i in rows_host]
        self._ends = [self._ends[i] - shift for i in rows_host]


def moved_places(rows_host: list[int]) -> list[int]:
    """The places whose row changes in an in-place ``select`` of ``rows_host`` (no slots dropped)."""
    return [i for i, r in enumerate(rows_host) if r != i]


def fill_order(kept: list[int]) -> list[int]:
    """The order to keep the rows ``kept`` (increasing places among the batch's) that moves the
    fewest in ``RaggedCache.select``: a kept row in the first ``len(kept)`` places stays there and
    each place left empty takes a kept row from past them, in order.  ``[0, 1, 3, 5]`` gives
    ``[0, 1, 5, 3]``: one row moves where the increasing order moves two."""
    n = len(kept)
    stay = {r for r in kept if r < n}
    late = iter(r for r in kept if r >= n)
    return [i if i in stay else next(late) for i in range(n)]


def _flat_slots(slots: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[B, J] slots on the time axis of a contiguous [B, H, C, hd] buffer as indices into its
    ``view(-1, hd)``: ((b * H + h) * C + slot), every head of every row, [B * H * J].

    A commit moves a few entries a row; ``index_select`` / ``index_copy_`` on the flat rows moves each
    as one hd-long copy, where ``gather`` / ``scatter_`` on the 4D buffer with an expanded index walks
    it element by element: 2-4x slower at 32 and 128 rows on this project's CPU (8 layers, J = 1..8;
    ``python -m bench.round_kernels``).  ``commit_reference`` is the slow path it must equal."""
    bsz, heads, cap, _ = t.shape
    if not t.is_contiguous():
        raise ValueError("RaggedCache buffers must be contiguous")
    rows = torch.arange(bsz, device=slots.device).view(bsz, 1, 1) * heads
    base = (rows + torch.arange(heads, device=slots.device).view(1, heads, 1)) * cap  # [B, H, 1]
    return (base + slots.view(bsz, 1, -1)).reshape(-1)


def commit_reference(
    keys: torch.Tensor, starts_plus_lengths: list[int], block_start: int, keep, counts
) -> None:
    """The slow reference of one buffer's commit move, row by row in Python: row b's first
    ``counts[b]`` kept entries (``keep[b]``, indices into the block at ``block_start``) written in order
    right after its valid region (``starts_plus_lengths[b]``).  Entries a row does not keep land past
    its end in ``commit`` and are never read; this writes only the kept ones, so compare the kept slots."""
    for b, end in enumerate(starts_plus_lengths):
        picked = [keys[b, :, block_start + int(i)].clone() for i in keep[b][: int(counts[b])]]
        for n, entry in enumerate(picked):
            keys[b, :, end + n] = entry
