"""The adaptive mode with and without its SpeedCheck, head to head at one batch size.

    python -m bench.speed_check                 # default world, B = 128, 2 warm-up + 8 timed calls
    python -m bench.speed_check --batch 32 --calls 16
    python -m bench.speed_check --preset micro --batch 8 --calls 1 --warmup 1 --new-tokens 6  # smoke

``num_draft_tokens="auto"`` chooses each round's k from a calibrated cost model; where plain steps and
speculative rounds are within a few percent of each other (strict at B = 128 on a small CPU),
the calibration's error decides.  ``EngineConfig(speed_check=True)`` (the default) corrects the
model's speculative-against-plain ratio from the workload's own rounds (``SpeedCheck``).  This bench
runs, on the same prompts and seeds, interleaved call by call (the order rotated each call): marsrl
plain, a fixed chain per rule (``--fixed``, K = 3 by default), and for each rule ``auto`` with the
check (``{rule}_auto``) and without it (``{rule}_auto_off``).  Every auto engine starts from its own copy
of one calibration, and runs ``--warmup`` untimed calls first (an RL run's engines carry their state
from call to call).
``--skew S`` multiplies the calibration's figures for every k >= 1 by S before any call: a calibration
error of known size, to see whether the check finds it (where the check has nothing to correct, on
and off choose the same k's, and their ratio is an A/A control).  ``--window W`` also runs each rule's
auto (check on) with ``EngineConfig(drafter_window=W)`` as ``{rule}_auto_w{W}``, against its rule's
auto; ``--no-off`` leaves the check-off twins out.

Reports each system's tokens/s over all its timed calls, and ratios with 90% bootstrap intervals over
the paired calls (``ratio_of_sums``): every system against plain, each auto against its rule's fixed
chain and against the best of plain and that chain (the 0.97 bar of ``bench/scale.py``), and on against
off.  Also the k each auto drafted (pooled) and each checked engine's final ``speed_check`` (per
measured batch size: measured over predicted seconds of plain steps and of speculative rounds, and their
ratio, the factor).  Prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench._common import clock, emit, interleaved, k_summary, ratio_of_sums, world_and_prompts
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.engine.adaptive import CostModel
from marsrl.tinyworld import PRESETS

RULES = ("strict", "mars")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--world", type=Path, default=None, help="a built world's folder (default: the preset's)")
    ap.add_argument("--batch", type=int, default=128, help="sequences per call (prompts x --group)")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--calls", type=int, default=8, help="timed calls of each system")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls of each system first")
    ap.add_argument("--fixed", type=int, default=3, help="the fixed chain length each rule is judged against")
    ap.add_argument("--max-draft-tokens", type=int, default=7, help="auto's largest k")
    ap.add_argument("--theta", type=float, default=0.9)
    ap.add_argument("--new-tokens", type=int, default=None, help="default: the world's max_new_tokens")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument(
        "--skew",
        type=float,
        default=1.0,
        help="multiply the calibrated seconds of every k >= 1 by this (a calibration error of known size, "
        "for every auto engine alike; 1: none)",
    )
    ap.add_argument(
        "--window",
        type=int,
        default=0,
        help="also run each rule's auto (check on) with EngineConfig(drafter_window=W), as {rule}_auto_w{W} "
        "(0: not run)",
    )
    ap.add_argument("--no-off", action="store_true", help="skip the check-off twins ({rule}_auto_off)")
    args = ap.parse_args(argv)
    if args.window and args.window < args.max_draft_tokens + 1:
        ap.error(f"--window: {args.window} must be 0 or at least --max-draft-tokens + 1")
    if args.batch % args.group:
        ap.error(f"--batch: {args.batch} is not a multiple of --group {args.group}")
    if args.calls < 1 or args.warmup < 0:
        ap.error("--calls must be >= 1 and --warmup >= 0")
    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(f"[speed_check] {msg}", file=sys.stderr, flush=True)

    n = args.batch // args.group
    calls = args.warmup + args.calls
    path, target, tok, head, cfg, prompts = world_and_prompts(args.preset, args.world, n * calls)
    n_new = args.new_tokens or cfg.max_new_tokens
    eos = tok.eos_token_id

    common = dict(theta=args.theta, max_batch_size=args.batch)
    cfgs = {"plain": EngineConfig(**common)}
    for rule in RULES:
        cfgs[f"{rule}_k{args.fixed}"] = EngineConfig(rule=rule, num_draft_tokens=args.fixed, **common)
        twins = [(f"{rule}_auto", True, 0)]
        if not args.no_off:
            twins.append((f"{rule}_auto_off", False, 0))
        if args.window:
            twins.append((f"{rule}_auto_w{args.window}", True, args.window))
        for name, check, window in twins:
            cfgs[name] = EngineConfig(
                rule=rule,
                num_draft_tokens="auto",
                max_draft_tokens=args.max_draft_tokens,
                speed_check=check,
                drafter_window=window,
                **common,
            )
    engines = {
        name: SpeculativeEngine(target, None if name == "plain" else head, c) for name, c in cfgs.items()
    }
    autos = [name for name in engines if "_auto" in name]
    wall, model = clock(lambda: engines[autos[0]].calibrate(prompts=prompts[:n]))
    calibration_s = round(wall, 3)
    if args.skew != 1.0:
        for table in (model.rounds, model.per_slot):
            for figures in table.values():
                for k in figures:
                    figures[k] *= args.skew if k else 1.0
    for name in autos:  # each its own copy: the levels fold in each engine's own calls
        engines[name].cost_model = CostModel.from_dict(model.to_dict())
    log(f"cost model measured in {calibration_s} s")

    names = list(engines)

    def measure(name: str, c: int) -> tuple[tuple[int, float], list[int], int]:
        """Call ``c`` of one system: (tokens, seconds), the k's it drafted, the drafter pairs it skipped."""
        sp = SamplingParams(temperature=1.0, max_new_tokens=n_new, eos_token_id=eos, n=args.group, seed=c)
        seconds, trajs = clock(lambda: engines[name].generate(prompts[c * n : (c + 1) * n], sp))
        log(f"call {c + 1}/{calls} {name}" + (" (warm-up)" if c < args.warmup else ""))
        stats = engines[name].stats
        return (
            (sum(len(t.completion_ids) for t in trajs), seconds),
            stats.get("k_per_round") or [],
            stats.get("drafter_pairs_skipped") or 0,
        )

    # the order rotated each call; the warm-up calls rotate with the rest and are dropped
    runs = {name: r[args.warmup :] for name, r in interleaved(names, calls, measure).items()}
    rec = {name: [x[0] for x in runs[name]] for name in names}
    drafted = {name: [k for x in runs[name] for k in x[1]] for name in autos}
    skipped = {name: sum(x[2] for x in runs[name]) for name in autos}

    def rate(name: str) -> float:
        return round(sum(t for t, _ in rec[name]) / sum(s for _, s in rec[name]), 1)

    ratios: dict[str, dict | None] = {
        f"{name}_vs_plain": ratio_of_sums(rec[name], rec["plain"]) for name in names
    }
    for rule in RULES:
        fixed = f"{rule}_k{args.fixed}"
        best = fixed if rate(fixed) > rate("plain") else "plain"
        for auto in (name for name in autos if name.startswith(f"{rule}_")):
            ratios[f"{auto}_vs_{fixed}"] = ratio_of_sums(rec[auto], rec[fixed])
            ratios[f"{auto}_vs_best_fixed"] = {"best": best, **(ratio_of_sums(rec[auto], rec[best]) or {})}
        if not args.no_off:
            ratios[f"{rule}_auto_vs_off"] = ratio_of_sums(rec[f"{rule}_auto"], rec[f"{rule}_auto_off"])
        if args.window:
            w = f"{rule}_auto_w{args.window}"
            ratios[f"{w}_vs_auto"] = ratio_of_sums(rec[w], rec[f"{rule}_auto"])
    out = {
        "bench": "speed_check",
        "preset": args.preset,
        "path": str(path),
        "batch": args.batch,
        "group": args.group,
        "calls": args.calls,
        "warmup": args.warmup,
        "new_tokens": n_new,
        "temperature": 1.0,
        "threads": torch.get_num_threads(),
        "max_draft_tokens": args.max_draft_tokens,
        "calibration_s": calibration_s,
        "skew": args.skew,
        "window": args.window,
        "tokens_per_s": {name: rate(name) for name in names},
        "ratios": ratios,
        "k_per_round": {name: k_summary(ks) for name, ks in drafted.items()},
        "speed_check": {name: engines[name].stats.get("speed_check") for name in autos},
        "drafter_pairs_skipped": skipped,
    }
    return emit(out)


if __name__ == "__main__":
    main()
