"""The adaptive engine's plain steps against the plain engine's, and where auto's round time goes.

    python -m bench.plain_steps                  # default world, B = 128, 1 warm-up + 5 timed calls each
    python -m bench.plain_steps --preset micro --batch 8 --calls 1 --new-tokens 8   # smoke
    python -m bench.plain_steps --part fixed --calls 5 --rule strict   # the model's k ranking, checked

A plain step of ``num_draft_tokens="auto"`` (k = 0) does what the plain engine's step does, and also
taps the target's features and keeps the drafter's input pair for the next speculative round.  Two
parts by default, a third on request, each interleaved call by call (the order alternating), on the
same prompts and seeds:

1. ``all_plain``: the auto engine held at k = 0 for whole calls (its planner replaced by ``FixedK(0)``
   through the engine's internal ``_generate``, as its calibration drives it) beside the plain engine,
   ``ignore_eos`` so every step runs at all B rows; both with ``profile=True``.  Per system: the median
   step at B rows (ms), the median call, and the engine's phase seconds summed over the timed calls.
2. ``mix``: the auto engine as users run it (``--rule``, calibrated once, untimed ``--warmup`` calls
   first) beside the plain engine: each system's rounds bucketed by live rows (B, B/2..B-1, 16..B/2-1,
   under 16) and kind (``plain`` step; ``steady``: a speculative round after a speculative one or the
   prefill; ``catchup``: one right after a plain step, which first absorbs the pairs the plain run
   left): rounds, seconds, ms a round, tokens kept (``stats["tokens_per_round"]``) and tokens/s; and the
   seconds spent inside rounds and outside them (prefill, trajectories) a call.
3. ``fixed`` (only with ``--part fixed``): a fixed-k engine for each k in ``--ks`` (0 the plain
   engine), their real rounds bucketed by live rows and k against one calibration's predicted seconds,
   with tokens/s measured and as the model would have it, and the best k by each (``fixed``).

Prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from bench._common import clock, emit, interleaved, ratio_of_sums, world_and_prompts
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.engine.adaptive import FixedK
from marsrl.tinyworld import PRESETS


def bucket(live: int, full: int) -> str:
    if live == full:
        return str(full)
    if live >= full // 2:
        return f"{full // 2}-{full - 1}"
    return f"16-{full // 2 - 1}" if live >= 16 else "<16"


def buckets(calls: list[tuple[list, list[int]]], full: int) -> dict:
    """Rounds of all the calls (each its trace and tokens kept a round) by live-row bucket and kind
    (``plain``, ``steady``, ``catchup``): rounds, seconds, ms a round, tokens kept, tokens/s."""
    out: dict[str, list] = {}
    for trace, kept in calls:
        prev = None
        for (_, live, k, seconds, _), tokens in zip(trace, kept, strict=True):
            # a speculative round right after a plain step first absorbs the pairs the plain run left
            kind = "plain" if not k else ("catchup" if prev == 0 else "steady")
            prev = k
            x = out.setdefault(f"{bucket(live, full)}:{kind}", [0, 0.0, 0])
            x[0] += 1
            x[1] += seconds
            x[2] += tokens
    return {
        key: {
            "rounds": n,
            "s": round(s, 3),
            "ms": round(1e3 * s / n, 2),
            "tokens": t,
            "tokens_per_s": round(t / s, 1),
        }
        for key, (n, s, t) in sorted(out.items())
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--world", type=Path, default=None, help="a built world's folder (default: the preset's)")
    ap.add_argument("--batch", type=int, default=128, help="sequences per call (prompts x --group)")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--calls", type=int, default=5, help="timed calls of each system, in each part")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls of each system first, in each part")
    ap.add_argument("--rule", default="strict", choices=("strict", "mars"), help="auto's rule in the mix")
    ap.add_argument("--max-draft-tokens", type=int, default=7, help="auto's largest k")
    ap.add_argument("--new-tokens", type=int, default=None, help="default: the world's max_new_tokens")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument(
        "--part", default="both", choices=("both", "all_plain", "mix", "fixed"), help="which part to run"
    )
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5], help="part fixed: the k's")
    args = ap.parse_args(argv)
    if args.batch % args.group:
        ap.error(f"--batch: {args.batch} is not a multiple of --group {args.group}")
    if args.part == "fixed" and not all(0 <= k <= args.max_draft_tokens for k in args.ks):
        ap.error(f"--ks: each k must lie in 0..--max-draft-tokens {args.max_draft_tokens}, got {args.ks}")
    if args.calls < 1 or args.warmup < 0:
        ap.error("--calls must be >= 1 and --warmup >= 0")
    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(f"[plain_steps] {msg}", file=sys.stderr, flush=True)

    n = args.batch // args.group
    calls = args.warmup + args.calls
    path, target, tok, head, cfg, prompts = world_and_prompts(args.preset, args.world, n * calls)
    n_new = args.new_tokens or cfg.max_new_tokens
    auto_cfg = dict(
        num_draft_tokens="auto", max_draft_tokens=args.max_draft_tokens, max_batch_size=args.batch
    )

    def sampling(c: int, ignore_eos: bool) -> SamplingParams:
        return SamplingParams(
            temperature=1.0,
            max_new_tokens=n_new,
            eos_token_id=tok.eos_token_id,
            n=args.group,
            seed=c,
            ignore_eos=ignore_eos,
        )

    out = {
        "bench": "plain_steps",
        "preset": args.preset,
        "path": str(path),
        "batch": args.batch,
        "group": args.group,
        "calls": args.calls,
        "warmup": args.warmup,
        "new_tokens": n_new,
        "rule": args.rule,
        "threads": torch.get_num_threads(),
    }
    if args.part in ("both", "all_plain"):
        out["all_plain"] = all_plain(args, target, head, prompts, n, sampling, auto_cfg, log)
    if args.part in ("both", "mix"):
        out["calibration_s"], out["mix"] = mix(args, target, head, prompts, n, sampling, auto_cfg, log)
    if args.part == "fixed":
        out["calibration_s"], out["fixed"] = fixed(args, target, head, prompts, n, sampling, auto_cfg, log)
    return emit(out)


def all_plain(args, target, head, prompts, n, sampling, auto_cfg, log) -> dict:
    """Auto held at k = 0 against the plain engine (part 1)."""
    calls = args.warmup + args.calls
    engines = {
        "plain": SpeculativeEngine(target, None, EngineConfig(max_batch_size=args.batch, profile=True)),
        "auto_k0": SpeculativeEngine(target, head, EngineConfig(rule=args.rule, profile=True, **auto_cfg)),
    }

    def measure(name: str, c: int) -> tuple[float, dict]:
        """Call ``c`` of one engine: (seconds, its stats)."""
        eng, batch = engines[name], prompts[c * n : (c + 1) * n]
        if name == "plain":
            seconds, _ = clock(lambda: eng.generate(batch, sampling(c, True)))
        else:  # the planner the calibration uses, held at 0
            seconds, _ = clock(lambda: eng._generate(eng._check_prompts(batch), sampling(c, True), FixedK(0)))
        log(f"all plain: call {c + 1}/{calls} {name}" + (" (warm-up)" if c < args.warmup else ""))
        return seconds, eng.stats

    runs = interleaved(list(engines), calls, measure)  # the order alternating call by call
    steps: dict[str, list[float]] = {name: [] for name in engines}
    call_s: dict[str, list[float]] = {name: [] for name in engines}
    phases: dict[str, dict[str, float]] = {name: {} for name in engines}
    for name, timed_calls in runs.items():
        for seconds, totals in timed_calls[args.warmup :]:
            call_s[name].append(seconds)
            steps[name] += [t for _, live, k, t, _ in totals["trace"] if live == args.batch and k == 0]
            for phase, s in totals["time"].items():
                phases[name][phase] = phases[name].get(phase, 0.0) + float(s)
    med = {name: statistics.median(v) if v else None for name, v in steps.items()}
    out = {
        name: {
            "step_ms": round(1e3 * med[name], 3) if med[name] else None,
            "steps": len(steps[name]),
            "call_s": round(statistics.median(call_s[name]), 3),
            "phase_s": {p: round(s, 4) for p, s in sorted(phases[name].items())},
        }
        for name in engines
    }
    if med["plain"] and med["auto_k0"]:
        out["step_ratio"] = round(med["auto_k0"] / med["plain"], 4)
    return out


def mix(args, target, head, prompts, n, sampling, auto_cfg, log) -> tuple[float, dict]:
    """Auto as users run it beside the plain engine (part 2): (calibration seconds, the figures)."""
    calls = args.warmup + args.calls
    plain = SpeculativeEngine(target, None, EngineConfig(max_batch_size=args.batch))
    auto = SpeculativeEngine(target, head, EngineConfig(rule=args.rule, **auto_cfg))
    wall, auto.cost_model = clock(lambda: auto.calibrate(prompts=prompts[:n]))
    calibration_s = round(wall, 3)
    log(f"cost model measured in {calibration_s} s")
    mix_engines = {"plain": plain, f"{args.rule}_auto": auto}

    def measure(name: str, c: int) -> tuple[tuple[int, float], tuple[list, list], float]:
        """Call ``c`` of one engine: (tokens, seconds), (trace, tokens a round), seconds outside rounds."""
        eng = mix_engines[name]
        seconds, trajs = clock(lambda: eng.generate(prompts[c * n : (c + 1) * n], sampling(c, False)))
        log(f"mix: call {c + 1}/{calls} {name}" + (" (warm-up)" if c < args.warmup else ""))
        trace = eng.stats["trace"]
        return (
            (sum(len(t.completion_ids) for t in trajs), seconds),
            (trace, eng.stats["tokens_per_round"]),
            seconds - sum(r[3] for r in trace),
        )

    runs = interleaved(list(mix_engines), calls, measure)  # the order alternating call by call
    timed_calls = {name: r[args.warmup :] for name, r in runs.items()}
    rec = {name: [x[0] for x in r] for name, r in timed_calls.items()}
    traces = {name: [x[1] for x in r] for name, r in timed_calls.items()}
    outside = {name: [x[2] for x in r] for name, r in timed_calls.items()}
    out = {
        name: {
            "tokens_per_s": round(sum(t for t, _ in rec[name]) / sum(s for _, s in rec[name]), 1),
            "in_rounds_s": round(sum(r[3] for tr, _ in traces[name] for r in tr), 3),
            "outside_rounds_s_per_call": round(statistics.median(outside[name]), 3),
            "rounds": buckets(traces[name], args.batch),
        }
        for name in mix_engines
    }
    out["auto_vs_plain"] = ratio_of_sums(rec[f"{args.rule}_auto"], rec["plain"])
    return calibration_s, out


def fixed(args, target, head, prompts, n, sampling, auto_cfg, log) -> tuple[float, dict]:
    """Fixed-k engines' real rounds against one calibration's prediction (part 3, ``--part fixed``):
    whether the cost model ranks the k's as the workload does where the choice is close.  Each k in
    ``--ks`` (0: the plain engine) runs whole calls, interleaved call by call (the order rotated); every
    round but a call's first is bucketed by live rows and k with its measured seconds, the seconds the
    calibrated model predicts for its rows, k and cache width (no levels: the model as calibrated), and
    its tokens.  Per bucket and k: rounds, ms a round, measured over predicted seconds, tokens a row,
    tokens/s measured and as the model would have it (the same tokens over the predicted seconds), and
    per bucket the best k by each."""
    calls = args.warmup + args.calls
    common = dict(max_batch_size=args.batch)
    engines = {
        k: SpeculativeEngine(
            target,
            head if k else None,
            EngineConfig(rule=args.rule, num_draft_tokens=k, **common) if k else EngineConfig(**common),
        )
        for k in args.ks
    }
    auto = SpeculativeEngine(target, head, EngineConfig(rule=args.rule, **auto_cfg))
    wall, model = clock(lambda: auto.calibrate(prompts=prompts[:n]))
    calibration_s = round(wall, 3)
    log(f"cost model measured in {calibration_s} s")

    def measure(k: int, c: int) -> list:
        """Call ``c`` of the engine drafting ``k``: its rounds, each (trace entry, tokens kept)."""
        engines[k].generate(prompts[c * n : (c + 1) * n], sampling(c, False))
        log(f"fixed: call {c + 1}/{calls} k={k}" + (" (warm-up)" if c < args.warmup else ""))
        st = engines[k].stats
        return list(zip(st["trace"], st["tokens_per_round"], strict=True))

    runs = interleaved(list(engines), calls, measure)  # the order rotated call by call
    rec: dict[str, dict[int, list[float]]] = {}  # bucket -> k -> [rounds, seconds, predicted, tokens, rows]
    for c in range(args.warmup, calls):  # in call order, as the rounds ran
        for k in engines:
            for (_, live, kk, seconds, width), tokens in runs[k][c][1:]:
                x = rec.setdefault(bucket(live, args.batch), {}).setdefault(kk, [0, 0.0, 0.0, 0, 0])
                x[0] += 1
                x[1] += seconds
                x[2] += model.round_seconds(live, kk, width)
                x[3] += tokens
                x[4] += live
    out = {}
    for b, by_k in sorted(rec.items()):
        rows = {
            str(k): {
                "rounds": r,
                "ms": round(1e3 * s / r, 2),
                "measured_over_predicted": round(s / p, 4),
                "tokens_per_row": round(t / live, 3),
                "tokens_per_s": round(t / s, 1),
                "model_tokens_per_s": round(t / p, 1),
            }
            for k, (r, s, p, t, live) in sorted(by_k.items())
        }
        out[b] = {
            "k": rows,
            "best_measured": max(rows, key=lambda k: rows[k]["tokens_per_s"]),
            "best_model": max(rows, key=lambda k: rows[k]["model_tokens_per_s"]),
        }
    return calibration_s, out


if __name__ == "__main__":
    main()
