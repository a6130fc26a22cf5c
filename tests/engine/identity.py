"""Trajectories at fixed seeds, for checking that a change to the engine leaves its output bit for bit.

    python -m tests.engine.identity /tmp/before.json            # write every case's trajectories
    python -m tests.engine.identity /tmp/after.json --against /tmp/before.json

Each case runs on both tiny architectures of the engine tests (``tests/engine/conftest.py``: Qwen3 and
Llama, V = 64, 6 layers) with a random EAGLE-3 head (its drafts are often wrong, so rejections, relaxed
acceptances and unsupported mass all occur): plain sampling, chains (strict, mars with lambda, a
confidence cut, sampled drafts, a ``propose()`` drafter), trees, and ``num_draft_tokens="auto"`` on a
fixed cost model (``adapt_costs=False``: the choice never reads the clock).  One more auto case
calibrates its own cost model and carries its planner's state over three calls under a fake clock
(``time.perf_counter`` replaced by a counter), so the calibration, the speed check and the carried
state are deterministic too.  Saved per trajectory: tokens, provenance, both log-prob fields,
``unsupported_mass`` (and the other per-token fields), plus each call's ``k_per_round``.

The output is JSON with floats written exactly (``repr`` round-trips a float64), so two files are
bit-identical trajectories exactly when their texts are equal.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
from contextlib import contextmanager

import torch

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, OracleDrafter, SamplingParams, SpeculativeEngine, TreeConfig
from marsrl.engine.adaptive import CostModel
from marsrl.testing import tiny_causal_lm

PROMPTS = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [16]]
FIXED = CostModel(rounds={1: {k: 1.3 + 0.35 * k for k in range(6)}, 8: {k: 2.0 + 0.2 * k for k in range(6)}})


def _cases() -> dict[str, tuple[EngineConfig | None, dict]]:
    """name -> (engine config, None for the plain engine; options: sampling and drafter kind)."""
    tree = TreeConfig(top_k=3, depth=3, total_tokens=10)
    auto = dict(num_draft_tokens="auto", max_draft_tokens=5, adapt_costs=False)
    return {
        "plain": (None, {}),
        "chain_strict_k4": (EngineConfig(num_draft_tokens=4), {}),
        "chain_strict_greedy_k3": (EngineConfig(num_draft_tokens=3), {"temperature": 0.0}),
        "chain_mars_lambda": (EngineConfig(num_draft_tokens=5, rule="mars", relax_prob=0.5), {}),
        "chain_mars_code_sampled": (
            EngineConfig(num_draft_tokens=3, rule="mars_code", draft_sampling="sample"),
            {"top_p": 0.9},
        ),
        "chain_confidence": (EngineConfig(num_draft_tokens=5, rule="mars", draft_confidence=0.3), {}),
        "chain_small_batches": (EngineConfig(num_draft_tokens=4, max_batch_size=3, share_prefix=False), {}),
        "chain_context_end": (EngineConfig(num_draft_tokens=5, max_seq_len=30), {"max_new_tokens": 40}),
        "chain_profiled": (EngineConfig(num_draft_tokens=4, rule="mars", profile=True), {}),
        "chain_propose": (EngineConfig(num_draft_tokens=3), {"oracle": True, "temperature": 0.0}),
        "tree_strict": (EngineConfig(tree=tree), {}),
        "tree_mars": (EngineConfig(tree=tree, rule="mars", relax_prob=0.7), {}),
        "tree_context_end": (EngineConfig(tree=tree, max_seq_len=26), {"max_new_tokens": 40}),
        "auto_strict": (EngineConfig(**auto), {}),
        "auto_mars": (EngineConfig(**auto, rule="mars"), {}),
        "auto_window": (EngineConfig(**auto, drafter_window=6), {"top_k": 20}),
        "auto_context_end": (EngineConfig(**auto, max_seq_len=30), {"max_new_tokens": 40}),
        "auto_calibrated_carry": (
            EngineConfig(num_draft_tokens="auto", max_draft_tokens=4, max_batch_size=8),
            {"calls": 3, "fake_clock": True, "calibrate": True},
        ),
    }


@contextmanager
def _fake_clock():
    """``time.perf_counter`` as a counter whose steps vary (1 to 7 ms) in a fixed cycle."""
    real, steps = time.perf_counter, itertools.count()
    now = [0.0]

    def tick() -> float:
        now[0] += 1e-3 * (1 + next(steps) % 7)
        return now[0]

    time.perf_counter = tick
    try:
        yield
    finally:
        time.perf_counter = real


def _trajectory(t) -> dict:
    return {
        "prompt": t.prompt_ids,
        "tokens": t.completion_ids,
        "provenance": t.provenance,
        "target_logprobs": t.target_logprobs,
        "behavior_logprobs": t.behavior_logprobs,
        "unsupported_mass": t.unsupported_mass,
        "logit_ratio": t.logit_ratio,
        "is_top2": t.is_top2,
        "draft_position": t.draft_position,
        "finish": t.finish_reason,
        "stats": t.stats,
    }


def run_case(family: str, cfg: EngineConfig | None, opts: dict) -> list[dict]:
    """One case on one architecture: every call's trajectories and k per round."""
    target = tiny_causal_lm(family, vocab=64, layers=6, seed=0)
    new = opts.get("max_new_tokens", 24)
    drafter = None
    if cfg is not None:
        if opts.get("oracle"):
            drafter = OracleDrafter.from_target(target, PROMPTS, new + 8)
        else:
            torch.manual_seed(0)
            drafter = Eagle3Drafter.from_target(target)
    costs = None if opts.get("calibrate") or cfg is None or cfg.num_draft_tokens != "auto" else FIXED
    sampling = dict(
        temperature=opts.get("temperature", 1.0),
        top_k=opts.get("top_k"),
        top_p=opts.get("top_p", 1.0),
        max_new_tokens=new,
        n=2,
    )
    calls = []
    with _fake_clock() if opts.get("fake_clock") else _nothing():
        eng = SpeculativeEngine(target, drafter, cfg, cost_model=costs)
        if opts.get("calibrate"):  # a small grid, so the case stays quick
            eng.cost_model = eng.calibrate(
                rows=[1, 8], repeats=2, cycles=1, span=8, repeat=1, prompts=PROMPTS
            )
        for call in range(opts.get("calls", 1)):
            out = eng.generate(PROMPTS, SamplingParams(**sampling, seed=7 + call))
            calls.append(
                {"trajectories": [_trajectory(t) for t in out], "k_per_round": eng.stats["k_per_round"]}
            )
    return calls


@contextmanager
def _nothing():
    yield


def run_all(names: list[str] | None = None) -> dict:
    torch.set_num_threads(1)
    out = {}
    for name, (cfg, opts) in _cases().items():
        if names and name not in names:
            continue
        for family in ("qwen3", "llama"):
            out[f"{name}/{family}"] = run_case(family, cfg, opts)
    return out


def _text(result: dict) -> str:
    return json.dumps(result, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="where to write the trajectories (JSON)")
    p.add_argument("--against", help="an earlier output: exit 1 unless every case is bit-identical to it")
    p.add_argument("--only", nargs="*", help="case names (default: all)")
    args = p.parse_args(argv)
    result = run_all(args.only)
    text = _text(result)
    with open(args.out, "w") as f:
        f.write(text)
    tokens = sum(len(t["tokens"]) for calls in result.values() for c in calls for t in c["trajectories"])
    print(f"{len(result)} runs, {tokens} tokens, sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}")
    if args.against:
        with open(args.against) as f:
            before = json.load(f)
        differ = [k for k in result if k not in before or _text(before[k]) != _text(result[k])]
        missing = [k for k in before if k not in result and not args.only]
        for k in differ + missing:
            print(f"DIFFERS: {k}")
        if differ or missing:
            return 1
        print(f"bit-identical to {args.against}: {len(result)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
