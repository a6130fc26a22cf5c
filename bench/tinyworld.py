"""What the tiny world measures: accuracy, near-tie share, tau and speed under strict and MARS rollouts.

    python -m bench.tinyworld                      # builds (or reuses) the default preset
    python -m bench.tinyworld --preset micro --n-accuracy 100 --n-tau 32
    python -m bench.tinyworld --accuracy-seeds 1 2 3 4   # the mars - strict difference over 4 seeds

Accuracy: held-out problems (another seed than training, always two steps), strict and mars rollouts at
T = 1 with chain K = 7, with a 95% Wilson interval, and the paired mars - strict difference (with several
``--accuracy-seeds``, also pooled: per problem the mean over seeds, so problems stay the units).
tau: mean tokens per target forward, chain K = 7 and the dynamic tree, T = 1 and T = 0.  Speed:
tokens/s of marsrl strict / mars (chain K = 7 and 3, K = 7 stopping early below a draft confidence, the
tree) against HF ``generate`` at batch 1 and 8 on the same prompts, interleaved, medians of repeated
runs (``speed_table``).  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys

import torch

from bench._common import clock, emit, interleaved
from marsrl.algo import wilson_interval as wilson
from marsrl.data import score
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine, TreeConfig
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids


def paired_difference(a: torch.Tensor, b: torch.Tensor, z: float = 1.96) -> dict:
    """Mean of a - b over the same problems (0/1 outcomes [N]) with a normal 95% interval from the paired
    differences: whether two rules' accuracies differ, rather than whether one lands in the other's
    interval."""
    d = a - b
    half = z * float(d.std()) / math.sqrt(d.numel()) if d.numel() > 1 else float("inf")
    mean = float(d.mean())
    return {"mean": mean, "ci95": (mean - half, mean + half), "n": d.numel()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--n-accuracy", type=int, default=1000, help="held-out problems for accuracy")
    ap.add_argument(
        "--accuracy-seeds",
        type=int,
        nargs="+",
        default=[1],
        help="sampling seeds of the accuracy runs; the first gives the headline figures, all of them the "
        "pooled mars - strict difference",
    )
    ap.add_argument("--n-tau", type=int, default=200, help="problems for each tau / speed measurement")
    ap.add_argument("--theta", type=float, default=0.9)
    ap.add_argument("--tree", type=int, nargs=3, default=[4, 5, 24], metavar=("TOP_K", "DEPTH", "TOTAL"))
    ap.add_argument("--speed-prompts", type=int, default=16, help="prompts for the tokens/s comparison")
    ap.add_argument("--speed-reps", type=int, default=3, help="interleaved repetitions of each speed run")
    ap.add_argument("--draft-confidence", type=float, default=0.3, help="the k7c speed rows' confidence")
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens per completion in every run (default: the preset's max_new_tokens)",
    )
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    # stdout carries only the JSON: libraries imported while building (deepspeed, through transformers'
    # save_pretrained) print warnings there
    with contextlib.redirect_stdout(sys.stderr):
        path = build_tinyworld(args.preset, progress=False)
        target, tok, head, meta = load_tinyworld(path)
    cfg = PRESETS[args.preset]
    new_tokens = args.max_new_tokens if args.max_new_tokens is not None else cfg.max_new_tokens
    eos = tok.eos_token_id
    problems = heldout_problems(cfg, max(args.n_accuracy, args.n_tau))
    prompts = [chat_prompt_ids(tok, p["question"]) for p in problems]
    out: dict = {
        "bench": "tinyworld",
        "preset": args.preset,
        "path": str(path),
        "theta": args.theta,
        "max_new_tokens": new_tokens,
    }

    def run(rule: str, n: int, temperature: float, tree: TreeConfig | None = None, seed: int = 1):
        eng = SpeculativeEngine(
            target, head, EngineConfig(rule=rule, theta=args.theta, num_draft_tokens=7, tree=tree)
        )
        sp = SamplingParams(temperature=temperature, max_new_tokens=new_tokens, eos_token_id=eos, seed=seed)
        seconds, trajs = clock(lambda: eng.generate(prompts[:n], sp))
        return trajs, eng.stats, seconds

    # accuracy, strict vs mars (T = 1, chain K = 7) and the per-token facts of the first seed's runs
    acc: dict = {}
    outcomes: dict[str, list[torch.Tensor]] = {"strict": [], "mars": []}
    per_seed = []
    for seed in args.accuracy_seeds:
        row = {"seed": seed}
        for rule in ("strict", "mars"):
            trajs, stats, wall = run(rule, args.n_accuracy, 1.0, seed=seed)
            hits = [
                score(tok.decode(t.completion_ids, skip_special_tokens=True), p["gold"])
                for t, p in zip(trajs, problems, strict=True)
            ]
            k = int(sum(hits))
            outcomes[rule].append(torch.tensor(hits, dtype=torch.float64))
            row[rule] = k / len(hits)
            row[f"{rule}_ci95"] = wilson(k, len(hits))
            if rule not in acc:
                ratios = torch.tensor([r for t in trajs for r in t.logit_ratio])
                acc[rule] = {
                    "accuracy": k / len(hits),
                    "ci95": wilson(k, len(hits)),
                    "n": len(hits),
                    "seed": seed,
                    "tau": stats["tau"],
                    "relaxed_frac": stats["relaxed"] / max(stats["tokens"], 1),
                    "share_ratio_gt_0.9": (ratios > 0.9).double().mean().item(),
                    "tokens_per_s": stats["tokens"] / wall,
                }
        row["mars_inside_strict_ci95"] = row["strict_ci95"][0] <= row["mars"] <= row["strict_ci95"][1]
        per_seed.append(row)
    acc["mars_inside_strict_ci95"] = per_seed[0]["mars_inside_strict_ci95"]
    acc["mars_minus_strict"] = paired_difference(outcomes["mars"][0], outcomes["strict"][0])
    if len(per_seed) > 1:
        # per problem, the mean over seeds (problems are the independent units: the seeds share them)
        acc["mars_minus_strict_pooled"] = {
            **paired_difference(
                torch.stack(outcomes["mars"]).mean(0), torch.stack(outcomes["strict"]).mean(0)
            ),
            "seeds": len(per_seed),
        }
    acc["per_seed"] = per_seed
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

    out["speed"] = speed_table(target, head, tok, prompts[: args.speed_prompts], new_tokens, args)
    out["draft_training"] = meta.get("draft_training")
    out["build_timings_s"] = meta.get("timings_s")
    return emit(out)


def hf_generated(out: torch.Tensor, width: int, eos: int) -> int:
    """Tokens HF ``generate`` really produced: per row up to and including its first EOS (the padding it
    appends to rows that finished early is not output)."""
    total = 0
    for row in out[:, width:].tolist():
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


def hf_sample(target, rows: list[list[int]], pad: int, eos: int, max_new_tokens: int, seed: int) -> int:
    """HF ``generate`` sampling at T = 1 (no top-k / top-p) over ``rows``, left-padded, seeded: the
    tokens it really produced (``hf_generated``)."""
    width = max(len(p) for p in rows)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = target.generate(
            ids,
            attention_mask=(ids != pad).long(),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    return hf_generated(out, width, eos)


def speed_table(target, head, tok, prompts, max_new_tokens: int, args) -> dict:
    """tokens/s of HF ``generate`` and marsrl (chain K = 7, K = 3, K = 7 with ``--draft-confidence``
    ("k7c") and the ``--tree``; strict and mars) at T = 1 on the same prompts: batch 1 runs them one by
    one, batch 8 in batches of 8 (left-padded for HF).  Each system runs ``--speed-reps`` times,
    interleaved with the others (a shared machine is noisy); the figure is the median, and each
    ratio divides two medians of the same run."""
    eos, pad = tok.eos_token_id, tok.pad_token_id
    shapes = {
        "k7": dict(num_draft_tokens=7),
        "k3": dict(num_draft_tokens=3),
        "k7c": dict(num_draft_tokens=7, draft_confidence=args.draft_confidence),
        "tree": dict(tree=TreeConfig(*args.tree)),
    }
    engines = {
        f"{rule}_{shape}": EngineConfig(rule=rule, theta=args.theta, **kw)
        for shape, kw in shapes.items()
        for rule in ("strict", "mars")
    }
    systems = ["hf", *engines]
    table = {}
    for batch in (1, 8):
        groups = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]

        def one_system(name: str, rep: int, groups=groups) -> int:
            """Every group through one system at seed ``rep``: the tokens it generated."""
            tokens = 0
            for group in groups:
                if name == "hf":
                    tokens += hf_sample(target, group, pad, eos, max_new_tokens, rep)
                else:
                    eng = SpeculativeEngine(target, head, engines[name])
                    sp = SamplingParams(
                        temperature=1.0, max_new_tokens=max_new_tokens, eos_token_id=eos, seed=rep
                    )
                    eng.generate(group, sp)
                    tokens += eng.stats["tokens"]
            return tokens

        def rate(name: str, rep: int) -> float:
            seconds, tokens = clock(lambda: one_system(name, rep))
            return tokens / seconds

        rates = interleaved(systems, args.speed_reps, rate)  # the seed is the repeat's, alike for all
        row = {f"{name}_tokens_per_s": statistics.median(r) for name, r in rates.items()}
        for name in systems[1:]:
            row[f"{name}_ratio_to_hf"] = row[f"{name}_tokens_per_s"] / row["hf_tokens_per_s"]
        for shape in shapes:
            row[f"mars_over_strict_{shape}"] = (
                row[f"mars_{shape}_tokens_per_s"] / row[f"strict_{shape}_tokens_per_s"]
            )
        table[f"batch_{batch}"] = row
    return table


if __name__ == "__main__":
    main()
