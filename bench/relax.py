"""What the correctable relaxation costs: rollouts on the tiny world under strict, mars at lambda = 1 (the
paper) and mars at lambda < 1, side by side on the same prompts and seed.

    python -m bench.relax                          # default world, 16 prompts x G = 8, chain K = 7, T = 1
    python -m bench.relax --lambdas 1 0.9 0.5 --repeats 3

Per configuration (medians over repeats interleaved in rotated order, a fresh engine a call): tau,
tokens/s and their ratio to lambda = 1, the relaxed fraction, the mean per-token unsupported mass (the
policy mass the behaviour cannot emit: what no importance weight can restore) and the largest per-token
ratio p / b. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench._common import clock, emit, interleaved
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids
from marsrl.trajectory import collate


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="default")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--lambdas", type=float, nargs="+", default=[1.0, 0.9, 0.5])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    world = build_tinyworld(args.preset, progress=False)
    target, tok, head, _ = load_tinyworld(world)
    prompts = [
        chat_prompt_ids(tok, p["question"]) for p in heldout_problems(PRESETS[args.preset], args.prompts)
    ]
    sampling = SamplingParams(
        temperature=1.0,
        max_new_tokens=PRESETS[args.preset].max_new_tokens,
        eos_token_id=tok.eos_token_id,
        n=args.group,
        seed=0,
    )
    configs = {"strict": EngineConfig(rule="strict", num_draft_tokens=args.k, max_batch_size=128)}
    for lam in args.lambdas:
        configs[f"mars_l{lam:g}"] = EngineConfig(
            rule="mars", relax_prob=lam, num_draft_tokens=args.k, max_batch_size=128
        )

    def measure(name: str, rep: int) -> dict:
        engine = SpeculativeEngine(target, head, configs[name])
        wall, trajs = clock(lambda: engine.generate(prompts, sampling))
        batch = collate(trajs)
        mask = batch["mask"]
        log_w = (batch["target_logprobs"] - batch["behavior_logprobs"])[mask]
        return {
            "tau": engine.stats["tau"],
            "tokens_per_s": int(mask.sum()) / wall,
            "relaxed_frac": float((batch["provenance"] == 2)[mask].float().mean()),
            "unsupported_mass": float(batch["unsupported_mass"][mask].double().mean()),
            "max_ratio_p_over_b": float(log_w.exp().max()),
        }

    runs = interleaved(list(configs), args.repeats, measure)
    out = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    ref = out[f"mars_l{args.lambdas[0]:g}"]
    for fig in out.values():
        fig["tau_vs_first_lambda"] = fig["tau"] / ref["tau"]
        fig["tokens_per_s_vs_first_lambda"] = fig["tokens_per_s"] / ref["tokens_per_s"]
    return emit(
        {
            "bench": "relax",
            "preset": args.preset,
            "prompts": args.prompts,
            "group": args.group,
            "k": args.k,
            "repeats": args.repeats,
            **out,
        }
    )


if __name__ == "__main__":
    main()
