"""Where one speculative round's time goes, on a built tiny world: the engine's per-phase profile.

    python -m bench.round                          # default world, chain K = 7, strict, T = 1, batch 1
    python -m bench.round --tree 4 5 24 --batch 8 --rule strict mars --repeats 5
    python -m bench.round --preset micro --prompts 4
    python -m bench.round --draft-confidence 0.3     # chains stop early where the head is unsure
    git show REV:marsrl/verify/tree.py > /tmp/tree_rev.py
    python -m bench.round --tree 4 5 24 --batch 8 --rule strict mars --baseline-verify /tmp/tree_rev.py

Runs the engine with ``EngineConfig(profile=True)`` and reports, per batched round, the milliseconds of
each phase: ``draft`` (chain or tree; the drafter's first "absorb" forward also shown apart),
``target_forward``, ``verify`` (the rule, plus the round's one device -> host copy of its record),
``commit`` (both KV caches), ``record`` (the host-side per-token bookkeeping) and ``other`` (the round's
wall time outside them: dropping finished rows, building masks).  Every system (a rule, and with
``--baseline-verify`` the same rule under another copy of ``verify_tree`` / ``verify_chain``) runs
``--repeats`` times on the same prompts and seed, interleaved with the others in rotated order; each
figure is the median over the repeats (tokens/s also with its spread), after one unrecorded warm-up run
of each.  A baseline file is imported as a
module of ``marsrl.verify``, so its relative imports use the current package.

Also times one HF single-token decode step on the same target for scale: the draft step's cost as a
fraction of it, and a ceiling, tau * HF step / target forward: the speed-up over single-token decoding if
drafting and verification cost nothing.  The timers add a few microseconds per phase; read the
proportions.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import time
from collections import Counter

import torch

import marsrl.engine.engine as engine_mod
from bench._common import interleaved, spread
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine, TreeConfig
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids

PHASES = ("draft", "target_forward", "verify", "commit", "record")


@contextlib.contextmanager
def timed(owner, name: str, key: str, totals: Counter, calls: Counter, state: dict):
    """Replace ``owner.name`` by a wrapper that adds its wall time to totals[key] (restored on exit).

    Calls made outside a round (the prefill's) are counted under ``key + "_prefill"``; the "round"
    wrapper marks the span of a round in ``state``."""
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        label = key if key == "round" or state["in_round"] else key + "_prefill"
        state["in_round"] |= key == "round"
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - start
            calls[label] += 1
            if key == "round":
                state["in_round"] = False

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, real)


def load_verifier(path: str, tree: bool):
    """``verify_tree`` (or ``verify_chain``) from another copy of its file, as marsrl.verify._baseline."""
    spec = importlib.util.spec_from_file_location("marsrl.verify._baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "verify_tree" if tree else "verify_chain")


def hf_step_ms(target, prompt: list[int], reps: int = 50) -> float:
    """One cached single-token forward of the target after ``prompt`` (what HF generate runs per token)."""
    from transformers import DynamicCache

    with torch.inference_mode():
        cache = DynamicCache()
        ids = torch.tensor([prompt])
        out = target(input_ids=ids, cache=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(reps):
            target(input_ids=tok, cache=cache, use_cache=True)
            cache.crop(-1)
        return (time.perf_counter() - start) / reps * 1e3


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--rule", nargs="+", default=["strict"], choices=["strict", "mars", "mars_code"])
    ap.add_argument("--k", type=int, default=7, help="chain draft length (ignored with --tree)")
    ap.add_argument("--tree", type=int, nargs=3, default=None, metavar=("TOP_K", "DEPTH", "TOTAL"))
    ap.add_argument("--draft-confidence", type=float, default=0.0, help="EngineConfig.draft_confidence")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1, help="sampling seed (the same in every repeat)")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats of each system")
    ap.add_argument("--baseline-verify", default=None, metavar="FILE", help="another verify_tree / chain")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON
        path = build_tinyworld(args.preset, progress=False)
        target, tok, head, _ = load_tinyworld(path)
    cfg = PRESETS[args.preset]
    prompts = [chat_prompt_ids(tok, p["question"]) for p in heldout_problems(cfg, args.prompts)]
    tree = TreeConfig(*args.tree) if args.tree else None
    verify_name = "verify_tree" if tree else "verify_chain"
    verifiers = {"": getattr(engine_mod, verify_name)}
    if args.baseline_verify:
        verifiers["@baseline"] = load_verifier(args.baseline_verify, tree is not None)
    systems = {f"{rule}{tag}": (rule, fn) for rule in args.rule for tag, fn in verifiers.items()}
    sp = SamplingParams(
        temperature=args.temperature,
        max_new_tokens=cfg.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        seed=args.seed,
    )

    def measure(name: str, rep: int) -> dict:
        rule, verify = systems[name]
        engine = SpeculativeEngine(
            target,
            head,
            EngineConfig(
                rule=rule,
                num_draft_tokens=args.k,
                tree=tree,
                draft_confidence=args.draft_confidence,
                profile=True,
            ),
        )
        totals, calls, state = Counter(), Counter(), {"in_round": False}
        phases, rounds, round_s, tokens, row_rounds, row_tokens = Counter(), 0, 0.0, 0, 0, 0
        parts = [
            (engine_mod.SpeculativeEngine, "_round", "round"),
            (engine_mod._EagleState, "absorb", "draft_absorb"),
            (engine_mod._EagleState, "step", "draft_step"),
        ]
        with contextlib.ExitStack() as stack, torch.inference_mode():
            stack.enter_context(_patched(engine_mod, verify_name, verify))
            for owner, attr, key in parts:
                stack.enter_context(timed(owner, attr, key, totals, calls, state))
            start = time.perf_counter()
            for i in range(0, len(prompts), args.batch):
                engine.generate(prompts[i : i + args.batch], sp)
                st = engine.stats
                phases.update(st["time"])
                rounds += len(st["trace"])
                round_s += sum(entry[3] for entry in st["trace"])
                tokens += st["tokens"]
                row_rounds += st["rounds"]
                row_tokens += st["tokens_in_rounds"]
            wall = time.perf_counter() - start
        ms = {"round": round_s / rounds * 1e3}
        ms.update({p: phases[p] / rounds * 1e3 for p in PHASES})
        ms["draft_absorb"] = totals["draft_absorb"] / rounds * 1e3
        ms["other"] = ms["round"] - sum(ms[p] for p in PHASES)
        return dict(
            tokens_per_s=tokens / wall,
            ms=ms,
            rounds=rounds,
            tokens=tokens,
            tau=row_tokens / max(row_rounds, 1),
            draft_steps=calls["draft_step"] / rounds,
        )

    for name in systems:  # warm-up, not recorded: the first calls of a process pay one-off costs
        measure(name, -1)
    runs = interleaved(list(systems), args.repeats, measure)
    hf_ms = hf_step_ms(target, prompts[0])
    out = {
        "bench": "round",
        "preset": args.preset,
        "shape": f"tree {tuple(args.tree)}" if tree else f"chain K={args.k}",
        "batch": args.batch,
        "temperature": args.temperature,
        "prompts": args.prompts,
        "seed": args.seed,
        "repeats": args.repeats,
        "draft_confidence": args.draft_confidence,
        "baseline_verify": args.baseline_verify,
        "hf_single_token_step_ms": hf_ms,
        "systems": {name: summarize(r, tree, hf_ms) for name, r in runs.items()},
    }
    out["ratios"] = ratios(out["systems"], args.rule, list(verifiers))
    json.dump(out, sys.stdout, indent=2)
    print()
    return out


@contextlib.contextmanager
def _patched(owner, name: str, value):
    real = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, real)


def summarize(reps: list[dict], tree: TreeConfig | None, hf_ms: float) -> dict:
    """One system's repeats: medians per phase (ms per batched round), tokens/s with its spread."""
    ms = {key: statistics.median(r["ms"][key] for r in reps) for key in reps[0]["ms"]}
    first = reps[0]  # rounds, tokens and tau are the same in every repeat (same prompts and seed)
    # drafter forwards after the absorb: a tree's depth; a chain's as counted (K - 1 unless it stops early)
    steps = tree.depth if tree is not None else first["draft_steps"]
    draft_step_ms = (ms["draft"] - ms["draft_absorb"]) / max(steps, 1e-9)
    return {
        "tokens_per_s": spread([r["tokens_per_s"] for r in reps], 1),
        "tokens_per_s_runs": [round(r["tokens_per_s"], 1) for r in reps],  # in repeat order
        "tau": first["tau"],
        "rounds": first["rounds"],
        "tokens": first["tokens"],
        "ms_per_round": {k: round(v, 3) for k, v in ms.items()},
        "draft_steps_per_round": steps,
        "draft_step_ms": draft_step_ms,
        "draft_step_over_hf_step": draft_step_ms / hf_ms,
        "target_forward_over_hf_step": ms["target_forward"] / hf_ms,
        "ceiling_free_draft_over_hf_step": first["tau"] * hf_ms / ms["target_forward"],
    }


def ratios(systems: dict, rules: list[str], tags: list[str]) -> dict:
    """Median tokens/s ratios: each rule over strict (per verifier), and current over baseline."""
    rate = {name: s["tokens_per_s"]["median"] for name, s in systems.items()}
    out = {}
    for tag in tags:
        for rule in rules:
            if rule != "strict" and "strict" in rules:
                out[f"{rule}{tag}/strict{tag}"] = rate[f"{rule}{tag}"] / rate[f"strict{tag}"]
    if "@baseline" in tags:
        for rule in rules:
            out[f"{rule}/{rule}@baseline"] = rate[rule] / rate[f"{rule}@baseline"]
    return out


if __name__ == "__main__":
    main()
