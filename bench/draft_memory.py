"""Drafter memory and time, the former code paths against the current ones, side by side in one run on
the CPU (GPU figures are the analytic section's, not measurements).

    python -m bench.draft_memory                          # small + scaled shapes, 3 interleaved repeats
    python -m bench.draft_memory --shapes small --repeats 1   # a quick look (a few seconds)

The former paths are the oracles of tests/drafter/reference.py: attention as one SDPA call with a mask
and ``enable_gqa``; the training-time test with explicit [B, Hq, T, T+j] float32 scores and the loss
over full-vocabulary float32 target logits.  The current ones are ``grouped_attention``, ``TTTBlocks``
and ``ttt_loss`` over ``draft_targets``' draft columns.

Per shape, for old and new (medians over ``--repeats`` interleaved rounds of the bench harness):
- ``train``: one TTT step (the loss over 7 unrolled steps, then backward) of a random float32 head on a
  random batch.  ``saved_bytes``: distinct storages autograd keeps for backward (parameters and the
  batch left out), read with ``torch.autograd.graph.saved_tensors_hooks``; ``peak_bytes``: the highest
  live CPU tensor bytes above the step's start (``torch.profiler`` memory events: allocations minus
  frees in time order); ``kept_logits_bytes``: the batch's target logits (full V vs draft Vd).
- ``attention``: one drafter attention call at chain (T = 1), tree (T = 60) and absorb (T = the prompt
  width) shapes over K/V views of a preallocated cache: ``peak_bytes`` (temporaries and output) and time.
- ``analytic_check``: the saved bytes of the terms that differ, written out from the code (``analytic``),
  against the measurement; what is left once they are taken off (``rest``) must agree across paths.
- ``estimate_8b_gib``: the 8B defaults (Qwen3-8B head: 32 query / 8 kv heads, head dim 128, H 4096,
  I 12288, Vd 32000, V 151936; batch 8, length 2048, 7 steps), old and new by part: the analytic terms,
  the rest measured per row on a 16-row step at those widths, the batch and the head's AdamW state.
Prints one JSON object.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from bench._common import compare, emit
from marsrl.drafter import Eagle3Config, Eagle3Drafter, build_vocab_maps
from marsrl.drafter.layers import _SINK_CHANNELS, grouped_attention
from marsrl.drafter.train import DraftBatch, draft_targets, ttt_loss
from tests.drafter.reference import old_ttt_loss, sdpa_enable_gqa

# B, T, heads, kv heads, head dim, H, I, V, Vd for the training step; attention: B, prompt width
SHAPES = {
    "small": dict(B=2, T=128, Hq=8, Hkv=2, hd=32, H=128, I=256, V=4096, Vd=1024, attn_B=2, attn_S=256),
    # the 8B head's attention layout (32 / 8 heads of 128) on a narrow residual, a quarter of its vocabularies
    "scaled": dict(B=2, T=1024, Hq=32, Hkv=8, hd=128, H=512, I=1536, V=37984, Vd=8000, attn_B=8, attn_S=1024),
}
DEFAULTS_8B = dict(B=8, T=2048, Hq=32, Hkv=8, hd=128, H=4096, I=12288, V=151936, Vd=32000)
STEPS = 7
F32 = 4


# ------------------------------------------------------------------------------------------ measuring


def peak_bytes(fn) -> int:
    """Highest live CPU tensor bytes above the start while ``fn`` runs (profiler memory events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
        for e in prof.events()
    )
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


def saved_bytes(fn, exclude) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn`` runs (``exclude``'s
    storages left out); ``fn`` returns the loss, whose graph is freed afterwards."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(x):
        ptr = x.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = x.untyped_storage().nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = fn()
    del loss
    return sum(seen.values())


# ------------------------------------------------------------------------------------------ training


def make_head(s: dict, seed: int = 0) -> Eagle3Drafter:
    cfg = Eagle3Config(
        hidden_size=s["H"],
        intermediate_size=s["I"],
        num_attention_heads=s["Hq"],
        num_key_value_heads=s["Hkv"],
        vocab_size=s["V"],
        draft_vocab_size=s["Vd"],
        head_dim=s["hd"],
    )
    torch.manual_seed(seed)
    head = Eagle3Drafter(cfg)
    ids = torch.randperm(s["V"])[: s["Vd"]].sort().values
    d2t, t2d = build_vocab_maps(ids, s["V"])
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    return head


def make_batches(head: Eagle3Drafter, s: dict, seed: int = 1) -> tuple[DraftBatch, DraftBatch]:
    """(full-vocabulary batch, draft-column batch) over the same random data; row 1 is 3/4 long."""
    g = torch.Generator().manual_seed(seed)
    bsz, t = s["B"], s["T"]
    lens = torch.full((bsz,), t)
    lens[1:] = 3 * t // 4
    attn = torch.arange(t).unsqueeze(0) < lens.unsqueeze(1)
    loss_mask = attn & (torch.arange(t).unsqueeze(0) + 1 < lens.unsqueeze(1))
    features = torch.randn(bsz, t, 3 * s["H"], generator=g)
    ids = torch.randint(0, s["V"], (bsz, t), generator=g)
    logits = 3 * torch.randn(bsz, t, s["V"], generator=g)
    full = DraftBatch(features, ids, logits, loss_mask, attn)
    cols, mask = draft_targets(head, logits, loss_mask)
    return full, DraftBatch(features, ids, cols, mask, attn)


def bench_train(s: dict, repeats: int) -> dict:
    head = make_head(s)
    full, draft = make_batches(head, s)
    paths = {
        "old": lambda: old_ttt_loss(head, full, STEPS)[0],
        "new": lambda: ttt_loss(head, draft, STEPS)[0],
    }
    exclude = [*head.parameters(), *head.buffers(), full.features, full.target_logits, draft.target_logits]

    def step(path):
        def run():
            head.zero_grad(set_to_none=True)
            paths[path]().backward()

        return run

    out = {}
    for path in paths:
        out[path] = {
            "saved_bytes": saved_bytes(paths[path], exclude),
            "peak_bytes": peak_bytes(step(path)),
            "kept_logits_bytes": (full if path == "old" else draft).target_logits.nbytes,
        }
    timings = compare({p: step(p) for p in paths}, repeats)
    for path in paths:
        out[path]["seconds"] = round(timings.median(path), 4)
    head.zero_grad(set_to_none=True)
    return out


# ------------------------------------------------------------------------------------------ attention


def attention_inputs(s: dict, q_len: int, seed: int = 2):
    """q [B, Hq, T, hd]; k/v [B, Hkv, S, hd] views of a [B, S + 64, Hkv, hd] buffer; mask [B, 1, T, S]:
    causal over the T new tokens, row 1 with a quarter of its cached keys padding."""
    g = torch.Generator().manual_seed(seed)
    bsz, cached = s["attn_B"], s["attn_S"] if q_len < s["attn_S"] else 0
    kv_len = cached + q_len
    q = torch.randn(bsz, s["Hq"], q_len, s["hd"], generator=g)
    buf = torch.randn(2, bsz, kv_len + 64, s["Hkv"], s["hd"], generator=g)
    k, v = (x[:, :kv_len].transpose(1, 2) for x in buf)
    neg = torch.finfo(torch.float32).min
    mask = torch.zeros(bsz, 1, q_len, kv_len)
    new = torch.arange(q_len)
    mask[..., cached:] = torch.where(new.unsqueeze(1) >= new.unsqueeze(0), 0.0, neg)
    mask[1:, ..., : max(cached, q_len) // 4] = neg
    mask[1:, 0, new, cached + new] = 0.0  # every row keeps its own key
    return q, k, v, mask


def bench_attention(s: dict, repeats: int) -> dict:
    out = {}
    for name, q_len in (("chain_T1", 1), ("tree_T60", 60), (f"absorb_T{s['attn_S']}", s["attn_S"])):
        inputs = attention_inputs(s, q_len)
        fns = {"old": lambda a=inputs: sdpa_enable_gqa(*a), "new": lambda a=inputs: grouped_attention(*a)}
        with torch.no_grad():
            err = float((fns["old"]() - fns["new"]()).abs().max())
            row = {p: {"peak_bytes": peak_bytes(fn)} for p, fn in fns.items()}
            timings = compare(fns, repeats)
            for p in fns:
                row[p]["seconds"] = round(timings.median(p), 5)
        kv_len = inputs[1].shape[2]
        row["shape"] = dict(B=s["attn_B"], T=q_len, S=kv_len, Hq=s["Hq"], Hkv=s["Hkv"], hd=s["hd"])
        row["max_abs_diff_old_new"] = err
        out[name] = row
    return out


# ------------------------------------------------------------------------------------------ analytic


def analytic(s: dict) -> dict:
    """Bytes (float32 head, train.py's advice) of what the change touches, written out from the code:
    what autograd saves for the TTT attention and the loss over ``STEPS`` steps, the attention's
    transient [T, T] scores, and the batch's target logits.  Everything else a step saves (norms,
    projections, MLP) is the same on both paths; ``rest_bytes_per_row`` measures it.

    Old attention, step j: the [B, Hq, T, T+j] probabilities; matmul's broadcast copies of q and of block
    0's K and V repeated over the G query heads of a kv head (3 x [B, Hq, T, hd]); from step 1 einsum's
    permuted copies of q, of the j later keys and values ([B, Hkv, T, j, hd] each) and of the later
    probabilities.  Its transient peak adds the raw block-0 scores and their concatenation.
    New attention: step 0 the folded q, SDPA's output and logsumexp, block 0's K and V; from step 1 q,
    the widened q (hd + 8) and output, SDPA's logsumexp and the sink score's, the step's own K and V and
    the j later scores three times (stack, softmax, weights); once the folded mask [B, 1, G*T, T+1 padded
    to 16] and the widened block-0 K/V with the sink.
    Loss: old keeps log-probabilities and a masked copy of the targets per step, new the log-probabilities
    per step and the targets once ([B, T, Vd]).
    """
    bsz, t, hq, hkv, hd, vd, vocab = (s[k] for k in ("B", "T", "Hq", "Hkv", "hd", "Vd", "V"))
    group, wide = hq // hkv, hd + _SINK_CHANNELS
    q_size, kv_size = bsz * hq * t * hd, bsz * hkv * t * hd
    old_attn = new_attn = 0
    for j in range(STEPS):
        old_attn += bsz * hq * t * (t + j) + 3 * q_size
        if j == 0:
            new_attn += 2 * q_size + bsz * hq * t + 2 * kv_size
        else:
            old_attn += q_size + 2 * kv_size * j + bsz * hq * t * j
            new_attn += q_size + 2 * bsz * hq * t * wide + 2 * kv_size
            new_attn += 2 * bsz * hq * t + 3 * bsz * hq * t * j  # the two logsumexps, the later scores
    new_attn += bsz * group * t * (-(-(t + 1) // 16) * 16) + 2 * bsz * hkv * (t + 1) * wide
    loss_rows = sum(bsz * max(t - j - 1, 0) * vd for j in range(STEPS))
    return {
        "old": {
            "attention_saved": old_attn * F32,
            "loss_saved": 2 * loss_rows * F32,
            "attention_transient": (bsz * hq * t * t + bsz * hq * t * (t + STEPS - 1)) * F32,
            "batch_target_logits": bsz * t * vocab * F32,
        },
        "new": {
            "attention_saved": new_attn * F32,
            "loss_saved": (loss_rows + bsz * t * vd) * F32,
            "attention_transient": 0,  # inside the fused kernel
            "batch_target_logits": bsz * t * vd * F32,
        },
    }


def rest_bytes_per_row(s: dict) -> float:
    """Saved bytes per row (of B*T) outside ``analytic``'s terms: the current path measured at ``s``'s
    widths on 16 rows, less its analytic attention and loss.  Linear in the rows (no [T, T] term is
    left), so it scales to any B*T at those widths.  Measured on the CPU, whose rms_norm may save more
    than a fused CUDA kernel."""
    probe = {**s, "B": 1, "T": 16}
    head = make_head(probe)
    _, draft = make_batches(head, probe)
    exclude = [*head.parameters(), *head.buffers(), draft.features, draft.target_logits]
    saved = saved_bytes(lambda: ttt_loss(head, draft, STEPS)[0], exclude)
    a = analytic(probe)["new"]
    return (saved - a["attention_saved"] - a["loss_saved"]) / 16


def head_parameters(s: dict) -> int:
    """Trained parameters of the head (the embedding is the target's, frozen)."""
    h, i, q, kv, hd, vd = (s[k] for k in ("H", "I", "Hq", "Hkv", "hd", "Vd"))
    return 3 * h * h + 2 * h * (q + 2 * kv) * hd + q * hd * h + 3 * h * i + vd * h + 4 * h


def estimate(s: dict, rest_per_row: float) -> dict:
    """A step's memory by part, both paths, GiB: saved for backward (attention, loss, the rest), the
    attention transient, the batch (target logits; features in bfloat16) and the head's float32 weights
    with their gradients and AdamW's two moments."""
    terms = analytic(s)
    rows = s["B"] * s["T"]
    shared = {
        "rest_saved": rest_per_row * rows,
        "batch_features_bf16": rows * 3 * s["H"] * 2,
        "weights_grads_adam": 4 * head_parameters(s) * F32,
    }
    out = {}
    for path in ("old", "new"):
        parts = {**terms[path], **shared}
        out[path] = {k: gib(v) for k, v in parts.items()}
        out[path]["total"] = gib(sum(parts.values()))
    out["capture_target_logits_bf16_both"] = gib(rows * s["V"] * 2)  # the target forward's own output
    return out


def gib(x: float) -> float:
    return round(x / 2**30, 3)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-estimate-8b",
        dest="estimate_8b",
        action="store_false",
        help="skip the 8B estimate (it measures a 16-row step of a head at the 8B widths: ~6 GB, ~10 s)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = {"device": "cpu", "threads": torch.get_num_threads(), "repeats": args.repeats, "shapes": {}}
    for name in args.shapes:
        s = SHAPES[name]
        train = bench_train(s, args.repeats)
        a = analytic(s)
        report["shapes"][name] = {
            "shape": s,
            "train": train,
            "train_ratio_old_over_new": {
                k: round(train["old"][k] / train["new"][k], 2)
                for k in ("saved_bytes", "peak_bytes", "seconds")
            },
            "analytic_check": {
                "saved_delta_analytic": sum(
                    a["old"][k] - a["new"][k] for k in ("attention_saved", "loss_saved")
                ),
                "saved_delta_measured": train["old"]["saved_bytes"] - train["new"]["saved_bytes"],
                # measured minus the analytic terms: the same on both paths when the terms are right
                **{
                    f"rest_saved_{p}": train[p]["saved_bytes"] - a[p]["attention_saved"] - a[p]["loss_saved"]
                    for p in a
                },
            },
            "attention": bench_attention(s, args.repeats),
        }
    if args.estimate_8b:
        rest = rest_bytes_per_row(DEFAULTS_8B)
        report["estimate_8b_gib"] = {
            "shape": {**DEFAULTS_8B, "steps": STEPS, "head_dtype": "float32"},
            "rest_saved_bytes_per_row": round(rest),
            **estimate(DEFAULTS_8B, rest),
        }
    return emit(report, indent=1)


if __name__ == "__main__":
    main()
