"""The prepared device check: marsrl's engine at Qwen3-8B's shape on one CUDA GPU, in under 8 minutes.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu --out $OUT/gpu.json
    python -m bench.gpu --cpu-smoke                # the same code path on the CPU, tiny shapes, seconds

The target is a transformers ``Qwen3Config`` written out with Qwen3-8B's dimensions (hidden 4096, 36
layers, 32 heads, 8 KV heads, head_dim 128, intermediate 12288, vocab 151936, RoPE theta 1e6, RMS eps
1e-6, untied embeddings), random weights, bf16; the EAGLE-3 head is built from SpecForge's Qwen3-8B head
config (``bench/specforge-qwen3-8b-eagle3.json``, copied from SpecForge, MIT licence, Copyright (c) 2025
sgl-project, see ``bench/LICENSE-SpecForge``), random weights, sharing the target's embedding.  Nothing
is downloaded.  Random weights mean acceptance near zero: the speculative rows measure what a round
costs at tau ~ 1 (drafting, a wide target forward, verification), not a speed-up.

Sections, in order, each skipped (and named under "skipped") once ``--max-seconds`` would be passed:
1. weight update: the target's state dict (~16.4 GB bf16) copied to host memory as a trainer's would be,
   then loaded back into the live target: through ``marsrl.rollout``'s worker update path
   (``RolloutWorker.update_weights``) when that imports (it needs Ray, which the device machine lacks),
   and always as per-tensor ``copy_`` from pageable and from pinned memory.
2. per batch B in --batches (B = prompts x 8 where B >= 8): tokens/s of HF ``generate``, marsrl plain,
   strict and mars chains (K = 3, 7) and a strict tree at T = 1, --new-tokens with ignore_eos, each
   after a 4-token warm-up, with its peak memory (``torch.cuda.max_memory_allocated``); then for every
   engine system a --profile-tokens call with ``profile=True`` (per-phase time per round,
   ``forward_by_width``) and one under ``torch.cuda.set_sync_debug_mode("warn")`` counting the
   synchronising calls per round beside the engine's own ``stats["host_syncs"]`` (both include the
   prefill's).
The guard counts from the start of ``main`` (imports and CUDA start-up come on top: ~20 s).

Imports only torch, transformers and marsrl modules that do not import Ray (``marsrl.rollout`` is tried
and reported unusable when Ray is missing).  Without CUDA (and without --cpu-smoke) it prints one line
and exits 0.  Prints one JSON object on stdout (progress on stderr); --out also writes it, after every
measurement, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoModelForCausalLM, Qwen3Config

from bench._common import batched_rounds, breakdown, clock, emit, k_summary, option_supported, per_round
from marsrl.drafter import Eagle3Config, Eagle3Drafter, default_aux_layer_ids
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine, TreeConfig

HEAD_CONFIG = Path(__file__).resolve().with_name("specforge-qwen3-8b-eagle3.json")
QWEN3_8B = dict(
    hidden_size=4096,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=12288,
    vocab_size=151936,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    max_position_embeddings=40960,
)
# --cpu-smoke: the same build with small sizes; the head keeps the SpecForge file's other fields
SMOKE_TARGET = {
    **QWEN3_8B,
    **dict(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=512,
    ),
}
SMOKE_HEAD = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    draft_vocab_size=128,
)
SYSTEMS = ("hf_generate", "plain", "strict_k3", "strict_k7", "mars_k3", "mars_k7", "strict_tree", "mars_tree")
DEFAULT_SYSTEMS = SYSTEMS[:-1]
WEIGHTS_BUDGET_S = 75.0  # the weight section's worst case on the H200 (16 GB four ways), estimated


class Budget:
    """Wall-clock guard: ``allows(estimate)`` while the estimate fits before the deadline; skips are
    recorded with their reason."""

    def __init__(self, seconds: float):
        self.start = time.perf_counter()
        self.seconds = seconds
        self.skipped: list[str] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def allows(self, what: str, estimate: float) -> bool:
        left = self.seconds - self.elapsed()
        if estimate <= left:
            return True
        self.skipped.append(f"{what}: needs ~{estimate:.0f} s, {max(left, 0):.0f} s left of --max-seconds")
        return False


def log(msg: str) -> None:
    print(f"[gpu] {msg}", file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_target(shape: dict, device: torch.device, dtype: torch.dtype):
    """A random-weight Qwen3 causal LM of ``shape`` on ``device``; no EOS (every call runs to length)."""
    cfg = Qwen3Config(**shape, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta != shape["rope_theta"]:
        raise RuntimeError(f"Qwen3Config kept rope theta {theta}, not {shape['rope_theta']}")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def build_head(target, device: torch.device, dtype: torch.dtype, sizes: dict | None = None) -> Eagle3Drafter:
    """A random EAGLE-3 head from the SpecForge config (``sizes`` overrides its dimensions), on the
    target's feature layers (EAGLE-3's default for its depth), sharing its input embedding."""
    raw = {**json.loads(HEAD_CONFIG.read_text()), **(sizes or {})}
    layers = target.config.num_hidden_layers
    cfg = Eagle3Config.from_hf_dict(raw, str(HEAD_CONFIG)).replace(
        aux_layer_ids=default_aux_layer_ids(layers)
    )
    emb = target.get_input_embeddings().weight.detach()
    shared = nn.Embedding.from_pretrained(emb[: cfg.vocab_size], freeze=True)
    return Eagle3Drafter(cfg, shared, device=device, dtype=dtype).eval()


def engine_configs(names, tree: TreeConfig, max_batch: int) -> dict[str, EngineConfig]:
    out = {}
    for name in names:
        if name == "hf_generate":
            continue
        if name == "plain":
            out[name] = EngineConfig(max_batch_size=max_batch)
            continue
        rule, shape = name.split("_")
        kw = dict(tree=tree) if shape == "tree" else dict(num_draft_tokens=int(shape[1:]))
        out[name] = EngineConfig(rule=rule, max_batch_size=max_batch, **kw)
    return out


def weight_update(target, device: torch.device) -> dict:
    """Load a host copy of the target's state dict back into it, four ways (see the module docstring)."""
    own = target.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in own.values())
    out: dict = {"bytes": nbytes, "GB": round(nbytes / 1e9, 2), "tensors": len(own)}

    def gbps(seconds):
        return round(nbytes / seconds / 1e9, 2) if seconds else None

    def synced(fn):
        """One call of ``fn`` timed from an idle device to the end of the work it queued."""
        return clock(fn, sync=lambda: sync(device))

    def copy(pairs, **kw) -> None:
        for dest, src in pairs:
            dest.copy_(src, **kw)

    def pin(pairs) -> list:
        return [(dest, src.pin_memory()) for dest, src in pairs]

    # pageable, as a trainer's
    seconds, host = synced(lambda: {k: v.detach().to("cpu", copy=True) for k, v in own.items()})
    out["device_to_pageable_s"] = round(seconds, 3)
    pairs = [(own[k], host[k]) for k in own]

    try:
        from marsrl.rollout import RolloutWorker, WorkerConfig
    except ImportError as err:  # marsrl.rollout imports Ray at package level
        out["worker_path"] = {"usable": False, "why": f"{type(err).__name__}: {err}"}
    else:
        worker = RolloutWorker(WorkerConfig(device=device.type), target=target)
        seconds, metrics = synced(partial(worker.update_weights, policy=host))
        out["worker_path"] = {
            "usable": True,
            "seconds": round(seconds, 3),
            "GB_per_s": gbps(seconds),
            "bytes": metrics["bytes"],
        }

    with torch.no_grad():
        seconds, _ = synced(partial(copy, pairs))
        out["pageable_copy_s"] = round(seconds, 3)
        out["pageable_GB_per_s"] = gbps(seconds)
        if device.type == "cuda":
            seconds, pinned = clock(partial(pin, pairs))
            out["pin_s"] = round(seconds, 3)
            seconds, _ = synced(partial(copy, pinned, non_blocking=True))
            out["pinned_copy_s"] = round(seconds, 3)
            out["pinned_GB_per_s"] = gbps(seconds)
            del pinned
        else:
            out["pinned_copy_s"] = out["pinned_GB_per_s"] = None  # pinning needs CUDA
    del host, pairs
    return out


def count_syncs(device: torch.device, fn) -> int | None:
    """Synchronising CUDA calls ``fn`` makes, counted as the warnings of sync debug mode (None on CPU)."""
    if device.type != "cuda":
        fn()
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def exactness(target, head, device: torch.device, args) -> dict:
    """bf16 numerics on the device: (1) the verify logits' margin decision z2/z1 > 0.9 at near-tie
    positions (float64 ratio within 0.02 of 0.9) from the engine's float32-output head vs a float64
    reference, beside the plain bf16 GEMM; (2) greedy completions: marsrl plain vs HF ``generate``
    (both argmax, different logit precision: ties may part them), strict K = 7 chain vs marsrl plain
    (same float32 head, different forward widths); (3) the shared-prefix prefill vs the unshared one
    (bit-identical on the CPU; cuBLAS may pick other kernels for other batch sizes)."""
    from marsrl.engine.engine import fp32_linear

    res: dict = {}
    gen = torch.Generator(device="cpu").manual_seed(1)
    hid = target.config.hidden_size
    w = target.lm_head.weight
    h = target.model.norm(torch.randn(2048, hid, generator=gen).to(device, torch.bfloat16) * 3)
    ref = (h.double() @ w.double().t()).topk(2, -1).values
    ratio = ref[:, 1] / ref[:, 0]
    near = (ref[:, 0] > 0) & ((ratio - 0.9).abs() < 0.02)

    def decisions(logits):
        v = logits.double().topk(2, -1).values
        return (v[:, 1] / v[:, 0] > 0.9)[near]

    want = decisions(ref)
    res["near_tie_positions"] = int(near.sum())
    res["fp32_head_decisions_equal_float64"] = int((decisions(fp32_linear(h, w)) == want).sum())
    res["bf16_gemm_decisions_equal_float64"] = int(
        (decisions(torch.nn.functional.linear(h, w)) == want).sum()
    )
    del ref
    prompts = torch.randint(0, target.config.vocab_size, (4, 16), generator=gen).tolist()
    n = 8 if args.cpu_smoke else 32
    greedy = SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)
    plain = [t.completion_ids for t in SpeculativeEngine(target).generate(prompts, greedy)]
    with torch.inference_mode():
        hf = target.generate(torch.tensor(prompts, device=device), do_sample=False, max_new_tokens=n)
    hf = hf[:, 16:].tolist()
    chain = SpeculativeEngine(target, head, EngineConfig(num_draft_tokens=7))
    spec = [t.completion_ids for t in chain.generate(prompts, greedy)]

    def agree(a, b):  # tokens equal up to each row's first difference
        total = 0
        for r, q in zip(a, b, strict=True):
            total += next((i for i, (x, y) in enumerate(zip(r, q, strict=True)) if x != y), len(r))
        return total

    res["greedy_tokens"] = 4 * n
    res["plain_vs_hf_tokens_before_first_difference"] = agree(plain, hf)
    res["strict_chain_vs_plain_tokens_before_first_difference"] = agree(spec, plain)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=n, n=8, seed=3)
    runs = []
    for share in (True, False):
        e = SpeculativeEngine(target, head, EngineConfig(rule="mars", num_draft_tokens=3, share_prefix=share))
        runs.append([(t.completion_ids, t.behavior_logprobs) for t in e.generate(prompts[:2], sampled)])
    res["shared_prefix_bit_identical"] = runs[0] == runs[1]
    return res


def run(args) -> dict:
    budget = Budget(args.max_seconds)
    smoke = args.cpu_smoke
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.bfloat16
    shape = SMOKE_TARGET if smoke else QWEN3_8B
    tree = TreeConfig(*args.tree) if args.tree else TreeConfig()
    out: dict = {
        "bench": "gpu",
        "mode": "cpu-smoke" if smoke else "cuda",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "target_shape": shape,
        "head_config": HEAD_CONFIG.name,
        "batches": args.batches,
        "new_tokens": args.new_tokens,
        "profile_tokens": args.profile_tokens,
        "prompt_len": args.prompt_len,
        "tree": dataclasses.asdict(tree),
        "max_seconds": args.max_seconds,
        "results": {},
        "skipped": budget.skipped,
    }

    def save() -> None:
        out["elapsed_s"] = round(budget.elapsed(), 1)
        if args.out:
            tmp = Path(f"{args.out}.tmp")
            tmp.write_text(json.dumps(out, indent=2))
            os.replace(tmp, args.out)

    def build():
        target = build_target(shape, device, dtype)
        return target, build_head(target, device, dtype, SMOKE_HEAD if smoke else None)

    torch.manual_seed(args.seed)
    seconds, (target, head) = clock(build, sync=lambda: sync(device))
    out["build_s"] = round(seconds, 2)
    out["target_params_B"] = round(sum(p.numel() for p in target.parameters()) / 1e9, 3)
    out["head_params_M"] = round(
        sum(p.numel() for n, p in head.named_parameters() if not n.startswith("embed_tokens")) / 1e6, 1
    )
    log(f"built target {out['target_params_B']}B + head {out['head_params_M']}M in {out['build_s']} s")
    save()

    if budget.allows("weight_update", 5.0 if smoke else WEIGHTS_BUDGET_S):
        out["weight_update"] = weight_update(target, device)
        log(f"weight update: {out['weight_update']}")
        save()

    if budget.allows("exactness", 5.0 if smoke else 45.0):
        out["exactness"] = exactness(target, head, device, args)
        log(f"exactness: {out['exactness']}")
        save()

    profile_ok = option_supported(EngineConfig, profile=True)
    out["profile_supported"] = profile_ok
    cfgs = engine_configs(args.systems, tree, max(args.batches))
    engines = {
        name: SpeculativeEngine(target, None if name == "plain" else head, c) for name, c in cfgs.items()
    }
    profiled = {}
    if profile_ok:
        profiled = {
            name: SpeculativeEngine(
                target, None if name == "plain" else head, dataclasses.replace(c, profile=True)
            )
            for name, c in cfgs.items()
        }
    vocab = shape["vocab_size"]
    gen = torch.Generator().manual_seed(args.seed)
    all_prompts = torch.randint(0, vocab, (max(args.batches), args.prompt_len), generator=gen).tolist()
    seen: dict[str, tuple[float, int]] = {}  # (wall, B) of each system's last timed call

    for batch in args.batches:
        g = 8 if batch >= 8 else 1
        prompts = all_prompts[: batch // g]
        res = out["results"][f"batch_{batch}"] = {"prompts": len(prompts), "group": g, "systems": {}}

        def call(name, engine, n_new, prompts=prompts, g=g):
            """One engine (or HF) call of n_new tokens per sequence; returns (tokens, stats)."""
            if name == "hf_generate":
                ids = torch.tensor([p for p in prompts for _ in range(g)], device=device)
                with torch.inference_mode():
                    target.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        do_sample=True,
                        temperature=1.0,
                        top_k=0,
                        top_p=1.0,
                        max_new_tokens=n_new,
                        min_new_tokens=n_new,
                        pad_token_id=0,
                    )
                return ids.shape[0] * n_new, {}
            sp = SamplingParams(temperature=1.0, max_new_tokens=n_new, n=g, seed=args.seed, ignore_eos=True)
            trajs = engine.generate(prompts, sp)
            return sum(len(t.completion_ids) for t in trajs), dict(engine.stats)

        for name in args.systems:
            what = f"batch_{batch}.{name}"
            wall_before, batch_before = seen.get(name, (0.0, batch))
            # the next B's call, guessed from the last one: rounds cost more with rows (sqrt is a guess
            # between launch-bound, flat in B, and compute-bound, linear), plus its warm-up
            if not budget.allows(what, 1.3 * wall_before * (batch / batch_before) ** 0.5 + 2.0):
                continue
            engine = engines.get(name)
            row: dict = {}
            try:
                call(name, engine, min(4, args.new_tokens))  # warm-up: kernels, allocator, cuBLAS
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                wall, (tokens, stats) = clock(
                    lambda n=name, e=engine: call(n, e, args.new_tokens), sync=lambda: sync(device)
                )
            except torch.cuda.OutOfMemoryError as err:
                row["error"] = f"out of memory: {str(err).splitlines()[0]}"
                torch.cuda.empty_cache()
                res["systems"][name] = row
                save()
                continue
            seen[name] = (wall, batch)
            row["tokens_per_s"] = round(tokens / wall, 1)
            row["wall_s"] = round(wall, 3)
            if device.type == "cuda":
                row["peak_memory_GB"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
            if stats:
                row["tau"] = stats.get("tau")
                row.update(per_round(stats))
            res["systems"][name] = row
            log(f"B={batch} {name}: {row['tokens_per_s']} tok/s ({row['wall_s']} s)")
            save()
        plain = res["systems"].get("plain", {}).get("tokens_per_s")
        hf = res["systems"].get("hf_generate", {}).get("tokens_per_s")
        for row in res["systems"].values():
            rate = row.get("tokens_per_s")
            row["ratio_to_marsrl_plain"] = round(rate / plain, 3) if rate and plain else None
            row["ratio_to_hf_generate"] = round(rate / hf, 3) if rate and hf else None

        # where a round's time goes, and its synchronisations: short calls, apart from the timed ones
        for name, engine in engines.items():
            row = res["systems"].get(name)
            if row is None or "error" in row:
                continue
            share = args.profile_tokens / args.new_tokens
            if not budget.allows(f"batch_{batch}.{name}.profile", 2.5 * share * seen[name][0] + 1.0):
                continue
            try:
                if name in profiled:
                    _, stats = call(name, profiled[name], args.profile_tokens)
                    row["breakdown"] = breakdown(stats)
                got: dict = {}

                def synced(e=engine, n=name, got=got):
                    got["stats"] = call(n, e, args.profile_tokens)[1]

                warned = count_syncs(device, synced)
            except torch.cuda.OutOfMemoryError as err:
                row["profile_error"] = f"out of memory: {str(err).splitlines()[0]}"
                torch.cuda.empty_cache()
                continue
            rounds = batched_rounds(got["stats"])
            per = round(warned / rounds, 2) if warned is not None and rounds else None
            row["syncs"] = {  # counts include the call's prefill
                "rounds": rounds,
                "debug_mode_warnings": warned,
                "debug_mode_warnings_per_round": per,
                **{k: v for k, v in per_round(got["stats"]).items() if k.startswith("host_syncs")},
                "k_per_round": k_summary(got["stats"].get("k_per_round")),
            }
            save()
    save()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (tests)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 8 64 (smoke: 1 8)")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 256 (smoke: 6)")
    ap.add_argument("--profile-tokens", type=int, default=None, help="default 32 (smoke: 3)")
    ap.add_argument("--prompt-len", type=int, default=None, help="default 128 (smoke: 8)")
    ap.add_argument("--tree", type=int, nargs=3, default=None, metavar=("TOP_K", "DEPTH", "TOTAL"),
                    help="default TreeConfig()'s (smoke: 2 2 6)")  # fmt: skip
    ap.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--max-seconds", type=float, default=400.0, help="skip what would run past this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (smoke default: 1)")
    args = ap.parse_args(argv)
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device visible; nothing measured (--cpu-smoke runs the CPU code path)")
        return 0
    defaults = dict(batches=[1, 8], new_tokens=6, profile_tokens=3, prompt_len=8, tree=[2, 2, 6])
    if not smoke:
        defaults = dict(batches=[1, 8, 64], new_tokens=256, profile_tokens=32, prompt_len=128, tree=None)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads or smoke:
        torch.set_num_threads(args.threads or 1)
    for b in args.batches:
        if b >= 8 and b % 8:
            ap.error(f"--batches: {b} is not a multiple of the group size 8")
    emit(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
