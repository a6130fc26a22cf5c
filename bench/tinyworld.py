"""What the tiny world measures: accuracy, near-tie share, tau and speed under strict and MARS rollouts.

    python bench/tinyworld.py                      # builds (or reuses) the default preset
    python bench/tinyworld.py --preset micro --n-accuracy 100 --n-tau 32

Accuracy: held-out problems (another seed than training, always two steps), strict and mars rollouts at
T = 1 with chain K = 7, with a 95% Wilson interval.  tau: mean tokens per target forward, chain K = 7
and the dynamic tree, T = 1 and T = 0.  Speed: tokens/s of marsrl strict / mars (chain) against HF
``generate`` at batch 1 and 8, side by side in one run.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from marsrl.data import score
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine, TreeConfig
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (mid - half, mid + half)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--n-accuracy", type=int, default=1000, help="held-out problems for accuracy")
    ap.add_argument("--n-tau", type=int, default=200, help="problems for each tau / speed measurement")
    ap.add_argument("--theta", type=float, default=0.9)
    ap.add_argument("--tree", type=int, nargs=3, default=[4, 5, 24], metavar=("TOP_K", "DEPTH", "TOTAL"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    path = build_tinyworld(args.preset, progress=False)
    target, tok, head, meta = load_tinyworld(path)
    cfg = PRESETS[args.preset]
    eos = tok.eos_token_id
    problems = heldout_problems(cfg, max(args.n_accuracy, args.n_tau))
    prompts = [chat_prompt_ids(tok, p["question"]) for p in problems]
    out: dict = {"bench": "tinyworld", "preset": args.preset, "path": str(path), "theta": args.theta}

    def run(rule: str, n: int, temperature: float, tree: TreeConfig | None = None, k: int = 7, drafter=head):
        eng = SpeculativeEngine(
            target, drafter, EngineConfig(rule=rule, theta=args.theta, num_draft_tokens=k, tree=tree)
        )
        sp = SamplingParams(
            temperature=temperature, max_new_tokens=cfg.max_new_tokens, eos_token_id=eos, seed=1
        )
        start = time.perf_counter()
        trajs = eng.generate(prompts[:n], sp)
        return trajs, eng.stats, time.perf_counter() - start

    # accuracy, strict vs mars (T = 1, chain K = 7) and the per-token facts of the strict run
    acc = {}
    for rule in ("strict", "mars"):
        trajs, stats, wall = run(rule, args.n_accuracy, 1.0)
        hits = [
            score(tok.decode(t.completion_ids, skip_special_tokens=True), p["gold"])
            for t, p in zip(trajs, problems, strict=True)
        ]
        k = int(sum(hits))
        ratios = torch.tensor([r for t in trajs for r in t.logit_ratio])
        acc[rule] = {
            "accuracy": k / len(hits),
            "ci95": wilson(k, len(hits)),
            "n": len(hits),
            "tau": stats["tau"],
            "relaxed_frac": stats["relaxed"] / max(stats["tokens"], 1),
            "share_ratio_gt_0.9": (ratios > 0.9).double().mean().item(),
            "tokens_per_s": stats["tokens"] / wall,
        }
    acc["mars_inside_strict_ci95"] = (
        acc["strict"]["ci95"][0] <= acc["mars"]["accuracy"] <= acc["strict"]["ci95"][1]
    )
    out["accuracy_T1_chain_k7"] = acc

    tau = {}
    tree = TreeConfig(*args.tree)
    for temperature in (1.0, 0.0):
        for shape, tcfg in (("chain_k7", None), ("tree", tree)):
            for rule in ("strict", "mars"):
                _, stats, _ = run(rule, args.n_tau, temperature, tcfg)
                key = f"{shape}_T{temperature:g}_{rule}"
                tau[key] = {"tau": stats["tau"], "relaxed_frac": stats["relaxed"] / max(stats["tokens"], 1)}
    for temperature in ("T1", "T0"):
        for shape in ("chain_k7", "tree"):
            s, m = tau[f"{shape}_{temperature}_strict"]["tau"], tau[f"{shape}_{temperature}_mars"]["tau"]
            tau[f"{shape}_{temperature}_mars_over_strict"] = m / s if s else None
    out["tau"] = tau

    speed = {}
    for batch in (1, 8):
        ids = torch.tensor([prompts[0]] * batch)
        n_new = cfg.max_new_tokens
        start = time.perf_counter()
        with torch.inference_mode():
            g = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                max_new_tokens=n_new,
                eos_token_id=eos,
                pad_token_id=tok.pad_token_id,
            )
        hf_tps = (g.shape[1] - ids.shape[1]) * batch / (time.perf_counter() - start)
        row = {"hf_generate_tokens_per_s": hf_tps}
        for rule in ("strict", "mars"):
            eng = SpeculativeEngine(
                target, head, EngineConfig(rule=rule, theta=args.theta, num_draft_tokens=7)
            )
            sp = SamplingParams(temperature=1.0, max_new_tokens=n_new, eos_token_id=eos, n=batch, seed=2)
            start = time.perf_counter()
            eng.generate([prompts[0]], sp)
            tps = eng.stats["tokens"] / (time.perf_counter() - start)
            row[f"{rule}_tokens_per_s"] = tps
            row[f"{rule}_ratio_to_hf"] = tps / hf_tps
        speed[f"batch_{batch}"] = row
    out["speed"] = speed
    out["draft_training"] = meta.get("draft_training")
    out["build_timings_s"] = meta.get("timings_s")
    json.dump(out, sys.stdout, indent=2, default=float)
    print()
    return out


if __name__ == "__main__":
    main()
