"""The ragged KV cache (``cache.py``): compaction, commits and writes at each row's end against their
row-by-row references."""

import pytest
import torch


@pytest.mark.parametrize("shift", [False, True])
def test_cache_select_compacts_leaving_rows_in_place(shift):
    """Rows leaving (an increasing subset) compact into the same buffers, the rows before the first
    that leaves untouched; a group copy (repeated rows) gets new buffers; every kept row reads back its
    own entries."""
    from marsrl.engine.cache import RaggedCache

    bsz, heads, hd, width = 6, 2, 4, 7
    cache = RaggedCache(bsz, torch.device("cpu"), capacity=12)
    k = torch.randn(bsz, heads, width, hd, generator=torch.Generator().manual_seed(0))
    cache.cache.update(k, -k, 0)
    starts = [2, 1, 0, 3, 1, 2] if shift else [0, 1, 0, 3, 1, 2]
    cache.set_rows(
        torch.tensor(starts), torch.tensor([width - s for s in starts]), starts, [width - s for s in starts]
    )
    keep = [1, 3, 4] if shift else [0, 1, 3, 5]  # shift: row 2 (start 0) leaves, the earliest start is 1
    buf = cache.cache.layers[0].keys.data_ptr()
    before = cache.bytes_copied
    cache.select(torch.tensor(keep), keep)
    layer = cache.cache.layers[0]
    moved = min(starts[i] for i in keep)
    assert layer.keys.data_ptr() == buf and layer.width == width - moved
    assert torch.equal(layer.keys[:, :, : width - moved], k[keep][:, :, moved:])
    assert torch.equal(layer.values[:, :, : width - moved], -k[keep][:, :, moved:])
    assert cache.ends == [width - moved] * len(keep)
    row_bytes = heads * (width - moved) * hd * k.element_size()
    copied_rows = len(keep) if shift else 2  # without a shift rows 0 and 1 stay: only 3 and 5 move
    assert cache.bytes_copied - before == 2 * 2 * copied_rows * row_bytes  # K and V, gathered + written
    cache.select(torch.tensor([0, 0, 1]), [0, 0, 1])  # a group copy: new buffers
    assert cache.cache.layers[0].keys.data_ptr() != buf
    copied = cache.cache.layers[0].keys[:, :, : cache.width]
    assert torch.equal(copied[1], copied[0]) and torch.equal(copied[0], k[keep[0]][:, moved:])


def test_fill_order_keeps_rows_in_their_places_and_fills_the_holes_from_the_end():
    from marsrl.engine.cache import fill_order

    assert fill_order([0, 1, 3, 5]) == [0, 1, 5, 3]
    assert fill_order([1, 2, 3]) == [3, 1, 2]
    assert fill_order([0, 1, 2]) == [0, 1, 2]  # the first rows kept: nothing moves
    assert fill_order([5, 6]) == [5, 6] and fill_order([]) == []
    rng = torch.Generator().manual_seed(0)
    for _ in range(200):  # seed 0, 200 random subsets of up to 12 rows
        total = int(torch.randint(1, 13, (1,), generator=rng))
        size = int(torch.randint(0, total + 1, (1,), generator=rng))
        kept = sorted(torch.randperm(total, generator=rng)[:size].tolist())
        order = fill_order(kept)
        n = len(kept)
        assert sorted(order) == kept
        assert all(order[i] == i for i in range(n) if i in kept)  # a kept row among the first n stays
        assert sum(order[i] != i for i in range(n)) == sum(r >= n for r in kept)  # one move a hole


@pytest.mark.parametrize("case", ["fill", "any_order", "wide_shift"])
def test_cache_select_in_any_order_moves_only_the_rows_that_change_place(case, monkeypatch):
    """``select`` with distinct rows in any order, against a row-by-row reference: every kept row reads
    back its own valid slots at its new place, the same buffers are reused, and only the places whose
    row changed are copied; padding before the earliest kept start is dropped only when it is at least
    an eighth of the width (then every row moves).  The moved places given (``at``, as the engine
    sends them) are used as given: no index tensor is made (on a GPU, a host -> device copy)."""
    from marsrl.engine import cache as cache_module
    from marsrl.engine.cache import RaggedCache, fill_order, moved_places

    bsz, heads, hd, width = 10, 2, 4, 16
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(bsz, heads, width, hd, generator=gen)
    starts = [1, 0, 3, 2, 1, 0, 4, 2, 1, 3]
    if case == "wide_shift":
        starts = [2 + s for s in starts]
        starts[1] = starts[5] = 1  # both leave: the earliest kept start becomes 3 (3 * 8 >= 16)
    ends = [width - (b % 3) for b in range(bsz)]  # ragged ends too
    keep_sorted = [0, 2, 3, 4, 6, 7, 9] if case != "wide_shift" else [0, 2, 3, 4, 6, 7, 8, 9]
    keep = fill_order(keep_sorted) if case != "any_order" else [9, 0, 4, 2, 7, 3, 6]
    cache = RaggedCache(bsz, torch.device("cpu"), capacity=24)
    cache.cache.update(k, -k, 0)
    lengths = [e - s for s, e in zip(starts, ends, strict=True)]
    cache.set_rows(torch.tensor(starts), torch.tensor(lengths), starts, lengths)
    buf = cache.cache.layers[0].keys.data_ptr()
    before = cache.bytes_copied
    # the engine sends the moved places with the rows (one copy); the cache's own are the same
    at = torch.tensor(moved_places(keep)) if case == "fill" else None
    rows = torch.tensor(keep)
    made = []
    real_tensor = torch.tensor

    def spy(*a, **kw):
        made.append(a[0])
        return real_tensor(*a, **kw)

    monkeypatch.setattr(cache_module.torch, "tensor", spy)
    cache.select(rows, keep, at)
    monkeypatch.undo()
    # the places are made here only when the caller sent none and some rows, not all, move
    assert made == ([moved_places(keep)] if case == "any_order" else [])
    shift = min(starts[b] for b in keep) if case == "wide_shift" else 0
    layer = cache.cache.layers[0]
    assert layer.keys.data_ptr() == buf and layer.width == width - shift
    for i, b in enumerate(keep):  # each place holds its row's valid slots, at the row's shifted start
        s, e = starts[b] - shift, ends[b] - shift
        assert cache._starts[i] == s and cache.ends[i] == e
        assert torch.equal(layer.keys[i, :, s:e], k[b, :, starts[b] : ends[b]])
        assert torch.equal(layer.values[i, :, s:e], -k[b, :, starts[b] : ends[b]])
    assert cache.starts.tolist() == cache._starts and (cache.starts + cache.lengths).tolist() == cache.ends
    moved = len(keep) if shift else sum(b != i for i, b in enumerate(keep))
    if case == "fill":
        assert moved == 2  # rows 7 and 9 into the places of 1 and 5, where the increasing order moves 6
    row_bytes = heads * (width - shift) * hd * k.element_size()
    assert cache.bytes_copied - before == 2 * 2 * moved * row_bytes  # K and V, gathered + written


@pytest.mark.parametrize("in_order", [True, False])
def test_cache_commit_moves_what_the_row_by_row_reference_moves(in_order):
    """The fast commit (flat index_select / index_copy_ over every layer's K and V) against
    ``commit_reference``: ragged rows (left padding, rows ending before the shared axis), a chain's
    in-order keep and a tree's permuted one, counts from 0 to J; every kept slot equal, every slot
    before the block untouched, the rows' ends and the axis as the counts say.  Seeds 0-19."""
    from marsrl.engine.cache import RaggedCache, commit_reference

    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        bsz, heads, hd, width, j = 5, 2, 3, 9, 4
        starts = torch.randint(0, 3, (bsz,), generator=g)
        ends = torch.randint(5, width + 1, (bsz,), generator=g)
        ends[int(torch.randint(0, bsz, (1,), generator=g))] = width  # some row reaches the axis's end
        cache = RaggedCache(bsz, torch.device("cpu"), capacity=width + j + 2)
        layers = 3
        for layer in range(layers):
            k = torch.randn(bsz, heads, width, hd, generator=g)
            cache.cache.update(k, -k, layer)
        cache.set_rows(starts, ends - starts, starts.tolist(), (ends - starts).tolist())
        for layer in range(layers):
            k = torch.randn(bsz, heads, j, hd, generator=g)
            cache.cache.update(k, 2 * k, layer)  # the block at [width, width + j)
        if in_order:
            keep = torch.arange(j).expand(bsz, j)
        else:
            keep = torch.stack([torch.randperm(j, generator=g) for _ in range(bsz)])
        counts = torch.randint(0, j + 1, (bsz,), generator=g)
        before = [
            (layer.keys[:, :, : width + j].clone(), layer.values[:, :, : width + j].clone())
            for layer in cache.cache.layers
        ]
        cache.commit(width, keep, counts, counts.tolist(), in_order=in_order)
        for layer, (keys, values) in zip(cache.cache.layers, before, strict=True):
            for name, ref in (("keys", keys), ("values", values)):
                commit_reference(ref, ends.tolist(), width, keep.tolist(), counts.tolist())
                got = getattr(layer, name)
                for b in range(bsz):
                    kept = int(ends[b] + counts[b])
                    assert torch.equal(got[b, :, :kept], ref[b, :, :kept]), (seed, name, b)
        assert cache.ends == (ends + counts).tolist()
        assert cache.width == int((ends + counts).max())


def test_cache_step_written_at_each_rows_end_equals_the_appended_and_moved_step():
    """``at_ends`` + ``commit_in_place`` against the append + ``commit`` path: ragged rows (left
    padding, rows ending short of the axis, the axis wider than every end after a select), one entry a
    row; each row's valid slots equal, ends and axis equal, and ``ends_mask`` lets each row see exactly
    its valid slots and its new entry.  Seeds 0-19."""
    from marsrl.engine.cache import RaggedCache

    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        bsz, heads, hd, width, layers = 5, 2, 3, 9, 3
        starts = torch.randint(0, 3, (bsz,), generator=g)
        ends = torch.randint(5, width + 1, (bsz,), generator=g)
        if seed % 2 == 0:  # some row reaches the axis's end; odd seeds: none does (a select took it)
            ends[int(torch.randint(0, bsz, (1,), generator=g))] = width
        first = [torch.randn(bsz, heads, width, hd, generator=g) for _ in range(layers)]
        step = [torch.randn(bsz, heads, 1, hd, generator=g) for _ in range(layers)]
        caches = []
        for in_place in (False, True):
            cache = RaggedCache(bsz, torch.device("cpu"), capacity=width + 2)
            for layer, k in enumerate(first):
                cache.cache.update(k, -k, layer)
            cache.set_rows(starts, ends - starts, starts.tolist(), (ends - starts).tolist())
            assert not cache.aligned()
            ones = torch.ones(bsz, dtype=torch.long)
            if in_place:
                mask = cache.ends_mask(torch.float32)
                with cache.at_ends():
                    for layer, k in enumerate(step):
                        cache.cache.update(k, 2 * k, layer)
                cache.commit_in_place(ones, [1] * bsz)
            else:
                for layer, k in enumerate(step):
                    cache.cache.update(k, 2 * k, layer)
                cache.commit(width, torch.zeros(bsz, 1, dtype=torch.long), ones, [1] * bsz, in_order=True)
            caches.append(cache)
        moved, placed = caches
        assert placed.ends == moved.ends == (ends + 1).tolist() and placed.width == moved.width
        for a, b in zip(moved.cache.layers, placed.cache.layers, strict=True):
            for b_ in range(bsz):
                live = slice(int(starts[b_]), int(ends[b_]) + 1)
                assert torch.equal(a.keys[b_, :, live], b.keys[b_, :, live]), (seed, b_)
                assert torch.equal(a.values[b_, :, live], b.values[b_, :, live]), (seed, b_)
        seen = mask[:, 0, 0] == 0  # [B, width + 1]
        for b_ in range(bsz):
            want = [int(starts[b_]) <= s <= int(ends[b_]) for s in range(width + 1)]
            assert seen[b_].tolist() == want, (seed, b_)


def test_cache_steps_at_ends_read_only_finite_slots_through_new_buffers(monkeypatch):
    """A step written ``at_ends`` leaves the slot at the axis unwritten for rows ending short of it, and
    attention reads it (masked): every slot a forward reads must be finite.  With ``new_empty``
    poisoned with NaN, every slot in ``[0, width)`` stays finite over steps at ends, a select that
    copies rows into new buffers (repeated rows), and a buffer grown past its capacity."""
    from marsrl.engine.cache import RaggedCache

    real_new_empty = torch.Tensor.new_empty
    monkeypatch.setattr(
        torch.Tensor, "new_empty", lambda self, *a, **kw: real_new_empty(self, *a, **kw).fill_(float("nan"))
    )
    g = torch.Generator().manual_seed(0)
    bsz, heads, hd, width, layers = 4, 2, 3, 6, 2
    cache = RaggedCache(bsz, torch.device("cpu"), capacity=width + 3)
    for layer in range(layers):
        cache.cache.update(
            torch.randn(bsz, heads, width, hd, generator=g), torch.randn(bsz, heads, width, hd), layer
        )
    ends = torch.tensor([6, 4, 5, 3])
    cache.set_rows(torch.zeros(bsz, dtype=torch.long), ends, [0] * bsz, ends.tolist())

    def step():
        n = len(cache.ends)
        with cache.at_ends():
            for layer in range(layers):
                k = torch.randn(n, heads, 1, hd, generator=g)
                cache.cache.update(k, k, layer)
        cache.commit_in_place(torch.ones(n, dtype=torch.long), [1] * n)
        for layer in cache.cache.layers:
            assert torch.isfinite(layer.keys[:, :, : layer.width + 1]).all()
            assert torch.isfinite(layer.values[:, :, : layer.width + 1]).all()

    for _ in range(2):
        step()
    rows = [0, 0, 1, 2, 3, 3]  # repeated rows: new buffers
    cache.select(torch.tensor(rows), rows)
    for _ in range(6):  # the capacity (9) runs out: the buffers grow
        step()
    assert cache.cache.layers[0].keys.shape[2] > width + 3
