"""Does the adaptive mode's calibration price each k as a run at that k costs?  Its figures against
runs at fixed k, for two ways of cycling the k's.

    python -m bench.calibration_bias                          # default world, 32 rows, mars, 4 repeats
    python -m bench.calibration_bias --rows 128 --rule strict --repeats 3
    python -m bench.calibration_bias --preset micro --rows 8 --repeats 1 --max-draft-tokens 2   # smoke

A round's drafter first absorbs what the round before it kept.  ``SpeculativeEngine.calibrate`` cycles
k = 0 .. K; with one round a k (``--repeat`` 1) a timed round
follows another k (passing up, k = 1 follows a plain step and absorbs what that step and K kept),
with two (``calibrate``'s default) only the second of each pair is timed.  Each repeat, interleaved in
rotated order: one calibration of each kind at ``--rows`` live rows on the world's own prompts, and
one call a k in ``--ks`` drafting that k every round (``--rounds`` rounds, every row live, the first
two rounds left out).  Reports, per k: the fixed runs' median round (ms) at their median cache width,
and each kind's model at that width (the median over its calibrations), as ms and as model / fixed.
A calibration that prices the k's right reads one ratio at every k (its level, which the engine's
calls correct, may differ from 1); a bias shows as one k off its neighbours.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys

import torch

from bench._common import emit, interleaved
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids

KINDS = {"one_round": dict(cycles=4, repeat=1), "two_rounds": {}}  # {}: calibrate's defaults


class _Fixed:
    """Drafts k every round and ends the call after ``rounds`` rounds."""

    exhausted = False

    def __init__(self, k: int, rounds: int):
        self.k, self.left = k, rounds

    def choose(self, rows: int, width: int = 0, debt: int = 0, made: float = 0.0, **rows_named) -> int:
        self.left -= 1
        self.exhausted = self.left <= 0
        return self.k

    def observe(self, drafted, accepted, keys=None) -> None:
        pass

    def timed(self, seconds: float) -> None:
        pass


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--world", default=None, help="a built world's folder (default: the preset's)")
    ap.add_argument("--rows", type=int, default=32, help="live rows (groups of 8 sharing a prompt)")
    ap.add_argument("--rule", default="mars", choices=["strict", "mars"])
    ap.add_argument("--repeats", type=int, default=4, help="calibrations of each kind, and fixed runs a k")
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 3, 5, 7], help="the fixed runs' k's")
    ap.add_argument("--rounds", type=int, default=16, help="rounds of a fixed run")
    ap.add_argument("--max-draft-tokens", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.rounds < 3:
        ap.error("--repeats must be >= 1 and --rounds >= 3")
    if not all(0 <= k <= args.max_draft_tokens for k in args.ks):
        ap.error(f"--ks: every k must be in 0..--max-draft-tokens ({args.max_draft_tokens})")
    torch.set_num_threads(args.threads)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON
        path = args.world or build_tinyworld(args.preset, progress=False)
        target, tok, head, _ = load_tinyworld(path)
    group = min(8, args.rows)
    n = max(args.rows // group, 1)
    prompts = [chat_prompt_ids(tok, p["question"]) for p in heldout_problems(PRESETS[args.preset], n)]
    rows = n * group
    cfg = EngineConfig(
        rule=args.rule, num_draft_tokens="auto", max_draft_tokens=args.max_draft_tokens, max_batch_size=rows
    )
    engine = SpeculativeEngine(target, head, cfg)

    def measure(name: str, rep: int):
        """A calibration of the kind ``name``, or (``fixed``) per k the (width, seconds) of the fixed
        run's timed rounds."""
        print(f"[calibration_bias] repeat {rep + 1}/{args.repeats}: {name}", file=sys.stderr, flush=True)
        if name in KINDS:
            return engine.calibrate(rows=[rows], prompts=prompts, **KINDS[name])
        rounds = {}
        for k in args.ks:
            new = (k + 1) * args.rounds + 1  # no row finishes before the run ends
            sp = SamplingParams(max_new_tokens=new, n=group, ignore_eos=True, seed=rep)
            engine._generate(prompts, sp, _Fixed(k, args.rounds))
            rounds[k] = [(w, t) for _, live, _, t, w in engine.stats["trace"][2:] if live == rows]
        return rounds

    runs = interleaved([*KINDS, "fixed"], args.repeats, measure)  # the order rotated each repeat
    models = {kind: runs[kind] for kind in KINDS}
    fixed = {k: [point for rounds in runs["fixed"] for point in rounds[k]] for k in args.ks}
    per_k = {}
    for k in args.ks:
        width = statistics.median(w for w, _ in fixed[k])
        ms = 1e3 * statistics.median(t for _, t in fixed[k])
        row = {"width": width, "fixed_ms": round(ms, 3)}
        for kind, ms_models in models.items():
            pred = 1e3 * statistics.median(m.round_seconds(rows, k, width) for m in ms_models)
            row[kind] = {"ms": round(pred, 3), "over_fixed": round(pred / ms, 3)}
        per_k[str(k)] = row
    out = {
        "bench": "calibration_bias",
        "preset": args.preset,
        "path": str(path),
        "rows": rows,
        "rule": args.rule,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "max_draft_tokens": args.max_draft_tokens,
        "threads": torch.get_num_threads(),
        "per_k": per_k,
        "over_fixed": {kind: [per_k[str(k)][kind]["over_fixed"] for k in args.ks] for kind in KINDS},
    }
    return emit(out)


if __name__ == "__main__":
    main()
