"""Where one speculative round's time goes, on a built tiny world: timers around the engine's parts.

    python bench/round.py                          # default world, chain K = 7, strict, T = 1, batch 1
    python bench/round.py --tree 4 5 24 --batch 8
    python bench/round.py --preset micro --prompts 4
    python bench/round.py --draft-confidence 0.3     # chains stop early where the head is unsure

Wraps (for this process only) the target forward, the draft (chain or tree, with the drafter's first
"absorb" forward shown apart), the verification, and times one HF single-token decode step on the same
target for scale.  Reports milliseconds per round (per call for the HF step), tau, the draft step's
cost as a fraction of the HF step, and a ceiling: tau * HF step / target forward, the speed-up over
single-token decoding if drafting and verification cost nothing.  The timers add a few microseconds per
call; read the proportions.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter

import torch

import marsrl.engine.engine as engine_mod
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine, TreeConfig
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids


@contextlib.contextmanager
def timed(owner, name: str, key: str, totals: Counter, calls: Counter, state: dict):
    """Replace ``owner.name`` by a wrapper that adds its wall time to totals[key] (restored on exit).

    Calls made outside a round (the prefill's target forward) are counted under ``key + "_prefill"``;
    the "round" wrapper marks the span of a round in ``state``."""
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
    ap.add_argument("--rule", default="strict", choices=["strict", "mars", "mars_code"])
    ap.add_argument("--k", type=int, default=7, help="chain draft length (ignored with --tree)")
    ap.add_argument("--tree", type=int, nargs=3, default=None, metavar=("TOP_K", "DEPTH", "TOTAL"))
    ap.add_argument("--draft-confidence", type=float, default=0.0, help="EngineConfig.draft_confidence")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON
        path = build_tinyworld(args.preset, progress=False)
        target, tok, head, _ = load_tinyworld(path)
    cfg = PRESETS[args.preset]
    prompts = [chat_prompt_ids(tok, p["question"]) for p in heldout_problems(cfg, args.prompts)]
    tree = TreeConfig(*args.tree) if args.tree else None
    engine = SpeculativeEngine(
        target,
        head,
        EngineConfig(
            rule=args.rule, num_draft_tokens=args.k, tree=tree, draft_confidence=args.draft_confidence
        ),
    )
    sp = SamplingParams(
        temperature=args.temperature, max_new_tokens=cfg.max_new_tokens, eos_token_id=tok.eos_token_id, seed=1
    )
    totals, calls, state = Counter(), Counter(), {"in_round": False}
    parts = [
        (engine_mod.SpeculativeEngine, "_tree_round" if tree else "_round", "round"),
        (engine_mod.SpeculativeEngine, "_target_hidden", "target_forward"),
        (engine_mod, "draft_tree", "draft") if tree else (engine_mod._EagleState, "draft_chain", "draft"),
        (engine_mod._EagleState, "absorb", "draft_absorb"),
        (engine_mod._EagleState, "step", "draft_step"),
        (engine_mod, "verify_tree" if tree else "verify_chain", "verify"),
    ]
    row_rounds = row_tokens = 0
    with contextlib.ExitStack() as stack:
        for owner, name, key in parts:
            stack.enter_context(timed(owner, name, key, totals, calls, state))
        with torch.inference_mode():
            for i in range(0, len(prompts), args.batch):
                engine.generate(prompts[i : i + args.batch], sp)
                row_rounds += engine.stats["rounds"]
                row_tokens += engine.stats["tokens_in_rounds"]
    rounds = calls["round"]
    keys = ("round", "target_forward", "draft", "draft_absorb", "verify")
    per_round = {key: totals[key] / rounds * 1e3 for key in keys}
    per_round["other"] = per_round["round"] - sum(per_round[k] for k in ("target_forward", "draft", "verify"))
    hf_ms = hf_step_ms(target, prompts[0])
    # drafter forwards after the absorb: a tree's depth; a chain's as counted (K - 1 unless it stops early)
    steps_per_round = tree.depth if tree is not None else calls["draft_step"] / rounds
    draft_step_ms = (per_round["draft"] - per_round["draft_absorb"]) / max(steps_per_round, 1e-9)
    tau = row_tokens / max(row_rounds, 1)
    out = {
        "bench": "round",
        "preset": args.preset,
        "rule": args.rule,
        "shape": f"tree {tuple(args.tree)}" if tree else f"chain K={args.k}",
        "batch": args.batch,
        "temperature": args.temperature,
        "rounds": rounds,
        "draft_confidence": args.draft_confidence,
        "tau": tau,
        "draft_steps_per_round": steps_per_round,
        "ms_per_round": per_round,
        "hf_single_token_step_ms": hf_ms,
        "draft_step_ms": draft_step_ms,
        "draft_step_over_hf_step": draft_step_ms / hf_ms,
        "target_forward_over_hf_step": per_round["target_forward"] / hf_ms,
        "ceiling_free_draft_over_hf_step": tau * hf_ms / per_round["target_forward"],
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return out


if __name__ == "__main__":
    main()
