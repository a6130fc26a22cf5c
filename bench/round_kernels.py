"""Two small kernels of a round, each against the way it could be done, side by side:

- ``commit``: moving each row's kept entries of a block to the end of its valid region, in every layer's
  K and V (``RaggedCache.commit``): the flat ``index_select`` / ``index_copy_`` the cache uses against
  ``gather`` / ``scatter_`` on the 4D buffers with an expanded index (the obvious way).
- ``drafter_attention``: the drafter's masked GQA attention (``grouped_attention``) on the CPU, torch's
  own GQA (one SDPA call with ``enable_gqa``) against folding the query heads into the query axis.
  ``FOLD_CPU_QUERIES`` (the query lengths the CPU folds) is read off this table.

    python -m bench.round_kernels                         # the default shapes of the tiny world (8 layers)
    python -m bench.round_kernels --rows 1 8 32 128 --queries 1 3 16 --repeats 3

Shapes: the default world's (2 KV heads of 32, 4 query heads).  Each figure is the median over
``--repeats`` interleaved repeats of the median of ``--calls`` timed calls (the bench harness); ``ratio``
is the new way over the other (< 1: faster).  One thread unless ``--threads``.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.nn.functional as F

from bench._common import compare, emit
from marsrl.drafter import layers
from marsrl.engine.cache import _flat_slots

KV_HEADS, Q_HEADS, HEAD_DIM = 2, 4, 32


def _gather_scatter(buffers, src, dst) -> None:
    bsz, j = src.shape
    for t in buffers:
        shape = (bsz, t.shape[1], j, t.shape[3])
        moved = t.gather(2, src.view(bsz, 1, j, 1).expand(shape))
        t.scatter_(2, dst.view(bsz, 1, j, 1).expand(shape), moved)


def _flat(buffers, src, dst) -> None:
    s, d = _flat_slots(src, buffers[0]), _flat_slots(dst, buffers[0])
    for t in buffers:
        rows = t.view(-1, t.shape[3])
        rows.index_copy_(0, d, rows.index_select(0, s))


def commit_table(rows: list[int], blocks: list[int], layers_: int, width: int, repeats: int, calls: int):
    out = []
    for bsz in rows:
        buffers = [torch.randn(bsz, KV_HEADS, width + 16, HEAD_DIM) for _ in range(2 * layers_)]
        ends = torch.randint(width // 2, width, (bsz,), generator=torch.Generator().manual_seed(0))
        for j in blocks:
            src = width + torch.arange(j).expand(bsz, j)
            dst = ends.unsqueeze(1) + torch.arange(j)
            timings = compare(
                {
                    "gather_scatter": functools.partial(_gather_scatter, buffers, src, dst),
                    "flat": functools.partial(_flat, buffers, src, dst),
                },
                repeats,
                calls=calls,
            )
            o, n = 1e3 * timings.median("gather_scatter"), 1e3 * timings.median("flat")
            out.append(
                dict(
                    rows=bsz,
                    block=j,
                    gather_scatter_ms=round(o, 4),
                    flat_ms=round(n, 4),
                    ratio=round(n / o, 3),
                )
            )
    return out


def attention_table(rows: list[int], keys: list[int], queries: list[int], repeats: int, calls: int):
    out = []
    for bsz in rows:
        kbuf = torch.randn(bsz, KV_HEADS, max(keys) + max(queries) + 16, HEAD_DIM)
        vbuf = torch.randn_like(kbuf)
        for s in keys:
            for t in queries:
                q = torch.randn(bsz, Q_HEADS, t, HEAD_DIM)
                k, v = (
                    kbuf[:, :, : s + t],
                    vbuf[:, :, : s + t],
                )  # views of a cache buffer, as the engine reads
                mask = torch.zeros(bsz, 1, t, s + t)
                mask[:, :, :, :5] = torch.finfo(torch.float32).min  # left padding
                unfolded = functools.partial(
                    F.scaled_dot_product_attention, q, k, v, attn_mask=mask, enable_gqa=True
                )
                folded = functools.partial(layers.grouped_attention, q, k, v, mask)
                before = layers.FOLD_ON_CPU
                layers.FOLD_ON_CPU = True  # the folded path at every length (the unfolded one never reads it)
                try:
                    timings = compare(
                        {"gqa": unfolded, "folded": folded},
                        repeats,
                        calls=calls,
                    )
                finally:
                    layers.FOLD_ON_CPU = before
                g, f = 1e3 * timings.median("gqa"), 1e3 * timings.median("folded")
                out.append(
                    dict(
                        rows=bsz,
                        keys=s,
                        queries=t,
                        gqa_ms=round(g, 4),
                        folded_ms=round(f, 4),
                        ratio=round(f / g, 3),
                        cpu_folds=t in layers.FOLD_CPU_QUERIES,
                    )
                )
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128], help="batch sizes")
    ap.add_argument("--blocks", type=int, nargs="+", default=[1, 3, 8], help="commit: entries kept a row")
    ap.add_argument("--layers", type=int, default=8, help="commit: layers (K and V each)")
    ap.add_argument("--width", type=int, default=120, help="commit: the cache's width")
    ap.add_argument("--keys", type=int, nargs="+", default=[60, 200], help="attention: cached keys")
    ap.add_argument(
        "--queries", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 16, 64], help="attention: queries"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calls", type=int, default=30, help="timed calls per repeat")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    for name in ("repeats", "calls", "threads", "layers", "width"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        result = dict(
            bench="round_kernels",
            threads=args.threads,
            repeats=args.repeats,
            calls=args.calls,
            commit=commit_table(args.rows, args.blocks, args.layers, args.width, args.repeats, args.calls),
            drafter_attention=attention_table(args.rows, args.keys, args.queries, args.repeats, args.calls),
        )
    return emit(result, indent=1)


if __name__ == "__main__":
    main()
