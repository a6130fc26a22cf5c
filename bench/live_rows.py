"""The planner on the live rows' acceptance against the call's pooled estimates.

    python -m bench.live_rows                                   # default world, B = 128, mars, K=3 beside
    python -m bench.live_rows --batch 32 --rule mars --ks 5 --calls 30
    python -m bench.live_rows --preset micro --batch 8 --calls 1 --warmup 0 --new-tokens 8   # smoke

Two auto engines share one calibration: ``live`` (``SpeculativeEngine.row_prior`` 4, the default: the
planner's E[tokens | k] from the live rows' counts, ``RowAcceptance``) and ``pooled`` (``row_prior``
None: the call's pooled estimates), with fixed-k engines beside (``--ks``; 0 the plain engine), called
in turn on the same prompts and seeds, the order rotated each call, after ``--warmup`` untimed calls.
Per system: tokens/s and, by live-row bucket, rounds, seconds and tokens/s; per auto engine: the k's
it drafted and, by bucket and k, the tokens a row the planner expected from each round it chose
against the drafts kept plus one (``kept_over_expected``).  Ratios are ``ratio_of_sums`` over the paired
calls with a 90% bootstrap interval.  Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import collections
import copy
import sys
from pathlib import Path
from typing import ClassVar

import torch

import marsrl.engine.engine as engine_module
from bench._common import clock, emit, interleaved, ratio_of_sums, world_and_prompts
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine, adaptive
from marsrl.tinyworld import PRESETS


def bucket(live: int, full: int) -> str:
    if live == full:
        return "full"
    for share, name in ((3 / 4, "3/4+"), (1 / 2, "1/2+"), (1 / 4, "1/4+")):
        if live >= full * share:
            return name
    return "8+" if live >= 8 else "<8"


class Recorded(adaptive.KPlanner):
    """The planner as the engine builds it, recording each choice's expected tokens a row and each
    observed round's drafts kept plus one a row (the bench's view; the engine is not changed)."""

    log: ClassVar[list] = []

    def choose(self, rows, width=0, debt=0, made=0.0, keys=None, left=None):
        k = super().choose(rows, width, debt, made, keys=keys, left=left)
        if keys is not None and self.live_rows is not None:
            tokens = self.live_rows.expected_tokens_upto(self.estimates.rates(), keys, left)
        else:
            tokens = self.estimates.expected_tokens_upto(self.k_max)
        Recorded.log.append(["choose", rows, k, tokens[k]])
        return k

    def observe(self, drafted, accepted, keys=None):
        Recorded.log.append(["observe", sum(a + 1 for a in accepted) / len(accepted)])
        super().observe(drafted, accepted, keys=keys)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--world", type=Path, default=None, help="a built world's folder (default: the preset's)")
    ap.add_argument("--batch", type=int, default=128, help="sequences per call (prompts x --group)")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (1 where --batch < it)")
    ap.add_argument("--rule", default="mars", choices=("strict", "mars"))
    ap.add_argument("--ks", type=int, nargs="*", default=[3], help="fixed k's beside (0: the plain engine)")
    ap.add_argument("--calls", type=int, default=16, help="timed calls of each system")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls of each system first")
    ap.add_argument("--new-tokens", type=int, default=None, help="default: the world's max_new_tokens")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    group = args.group if args.batch >= args.group else 1
    if args.batch % group:
        ap.error(f"--batch: {args.batch} is not a multiple of --group {group}")
    if args.calls < 1 or args.warmup < 0:
        ap.error("--calls must be >= 1 and --warmup >= 0")
    torch.set_num_threads(args.threads)
    n = args.batch // group
    _, target, tok, head, cfg, prompts = world_and_prompts(
        args.preset, args.world, n * (args.calls + args.warmup + 1)
    )
    n_new = args.new_tokens or cfg.max_new_tokens

    def engine(**kw):
        return SpeculativeEngine(target, head, EngineConfig(rule=args.rule, max_batch_size=args.batch, **kw))

    live = engine(num_draft_tokens="auto", max_draft_tokens=7)
    pooled = engine(num_draft_tokens="auto", max_draft_tokens=7)
    wall, live.cost_model = clock(lambda: live.calibrate(prompts=prompts[:n]))
    calibration_s = round(wall, 3)
    pooled.cost_model, pooled.row_prior = copy.deepcopy(live.cost_model), None
    systems = {"live": live, "pooled": pooled}
    for k in args.ks:
        plain = SpeculativeEngine(target, None, EngineConfig(max_batch_size=args.batch))
        systems[f"k{k}"] = plain if k == 0 else engine(num_draft_tokens=k)
    engine_planner, engine_module.KPlanner = engine_module.KPlanner, Recorded  # the engine builds it there
    buckets = collections.defaultdict(lambda: [0, 0.0, 0])
    plans = collections.defaultdict(lambda: [0, 0.0, 0.0])  # (system, bucket, k) -> rounds, expected, kept
    ks = {name: collections.Counter() for name in ("live", "pooled")}

    def measure(name: str, c: int) -> tuple[int, float] | None:
        """Call ``c`` of one system: (tokens, seconds), its rounds and choices tallied; None for a
        warm-up call (untimed, nothing tallied)."""
        eng = systems[name]
        sp = SamplingParams(
            temperature=1.0, max_new_tokens=n_new, eos_token_id=tok.eos_token_id, n=group, seed=c
        )
        Recorded.log = []
        seconds, trajs = clock(lambda: eng.generate(prompts[(c + 1) * n : (c + 2) * n], sp))
        print(f"[live_rows] call {c + 1}/{args.warmup + args.calls}: {name}", file=sys.stderr, flush=True)
        if c < args.warmup:
            return None
        trace, kept = eng.stats["trace"], eng.stats["tokens_per_round"]
        for (_, rows, _, sec, _), tokens in zip(trace, kept, strict=True):
            b = buckets[(name, bucket(rows, args.batch))]
            b[0], b[1], b[2] = b[0] + 1, b[1] + sec, b[2] + tokens
        if name in ks:
            ks[name].update(eng.stats["k_per_round"])
            choice = None
            for event in Recorded.log:  # each choice, then its round's outcome when it drafted
                if event[0] == "choose":
                    choice = event[1:]
                elif choice is not None and choice[1] > 0:
                    p = plans[(name, bucket(choice[0], args.batch), choice[1])]
                    p[0], p[1], p[2] = p[0] + 1, p[1] + choice[2], p[2] + event[1]
        return sum(len(t.completion_ids) for t in trajs), seconds

    try:  # the order rotated each call; the warm-up calls rotate with the rest and are dropped
        runs = interleaved(list(systems), args.warmup + args.calls, measure)
    finally:
        engine_module.KPlanner = engine_planner
    rec = {name: r[args.warmup :] for name, r in runs.items()}
    out = {
        "bench": "live_rows",
        "preset": args.preset,
        "batch": args.batch,
        "rule": args.rule,
        "calls": args.calls,
        "calibration_s": calibration_s,
        "tokens_per_s": {
            name: round(sum(t for t, _ in r) / sum(s for _, s in r), 1) for name, r in rec.items()
        },
        "live_vs_pooled": ratio_of_sums(rec["live"], rec["pooled"]),
        "vs_fixed": {
            f"{a}/k{k}": ratio_of_sums(rec[a], rec[f"k{k}"]) for a in ("live", "pooled") for k in args.ks
        },
        "k_per_round": {name: dict(sorted(c.items())) for name, c in ks.items()},
        "buckets": {
            f"{name}:{b}": {"rounds": r, "s": round(s, 3), "tokens_per_s": round(t / s, 1)}
            for (name, b), (r, s, t) in sorted(buckets.items())
        },
        "kept_over_expected": {
            f"{name}:{b}:k{k}": {
                "rounds": r,
                "expected": round(e / r, 2),
                "kept": round(kp / r, 2),
                "ratio": round(kp / e, 3),
            }
            for (name, b, k), (r, e, kp) in sorted(plans.items())
        },
    }
    return emit(out, indent=1)


if __name__ == "__main__":
    main()
