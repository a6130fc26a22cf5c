"""What a slot of cache width costs a round drafting k, for every k: the per-k figures the calibration
measures, the line in k the cost model reads through them, and the one figure pooled over every k >= 1
that the model used before 2026-12-04.

    python bench/context_slope.py                  # default world, 32 rows, mars, 3 calibrations
    python bench/context_slope.py --rows 128 --rule strict
    python bench/context_slope.py --preset micro --rows 8 --calibrations 1 --max-draft-tokens 2   # smoke

Each calibration runs what ``SpeculativeEngine.calibrate`` runs at one batch size
(``SpeculativeEngine.calibration_runs``: three calls cycling k = 0 .. K, two rounds a k, the second
timed, up and down in turn) on the world's own prompts, and reads the (width, seconds) of the timed
rounds: ``per_k_us`` is ``context_slope`` over each k's rounds (the
calibration's figures, microseconds a slot), ``line_us`` what the model reads for k = 0 .. K (the plain
step's own figure, then the least-squares line through k >= 1, never below it), ``pooled_us`` one
``context_slope`` over the rounds of every k >= 1.  A slot costs a longer chain more (the target's block
attends from k + 1 queries, the drafter once a draft step) where the line rises; the pooled figure then
prices K's context low and k = 1's high.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys

import torch

from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.engine.adaptive import CostModel, FixedK, context_slope
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids


def _us(seconds: float) -> float:
    return round(1e6 * seconds, 2)


def one_calibration(engine: SpeculativeEngine, prompts, group: int, k_max: int, seed: int) -> dict:
    """The timed rounds of one calibration at ``len(prompts) * group`` rows (``calibration_runs``, as
    ``calibrate`` takes them), as the three figures."""
    ks = list(range(k_max + 1))
    rows = len(prompts) * group
    runs = engine.calibration_runs(prompts, group, seed=10 * seed)
    per_k = {k: context_slope([run[k] for run in runs if k in run]) for k in ks}
    model = CostModel(rounds={rows: dict.fromkeys(ks, 1.0)}, per_slot={rows: per_k})
    pooled = context_slope([points for run in runs for k, points in run.items() if k > 0])
    return dict(
        per_k_us=[_us(per_k[k]) for k in ks],
        line_us=[_us(s) for s in model.slot_seconds_upto(rows, k_max)],
        pooled_us=_us(pooled),
        widths=[
            min(w for run in runs for pts in run.values() for w, _ in pts),
            max(w for run in runs for pts in run.values() for w, _ in pts),
        ],
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="default")
    ap.add_argument("--world", default=None, help="a built world's folder (default: the preset's)")
    ap.add_argument("--rows", type=int, default=32, help="live rows (groups of up to 8 sharing a prompt)")
    ap.add_argument("--rule", choices=["strict", "mars"], default="mars")
    ap.add_argument("--calibrations", type=int, default=3)
    ap.add_argument("--max-draft-tokens", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    for name in ("rows", "calibrations", "max_draft_tokens", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    torch.set_num_threads(args.threads)
    cfg = PRESETS[args.preset]
    with contextlib.redirect_stdout(sys.stderr):
        path = args.world or build_tinyworld(args.preset, progress=False)
        target, tok, head, _ = load_tinyworld(path)
    group = min(8, args.rows)
    n = max(args.rows // group, 1)
    prompts = [chat_prompt_ids(tok, p["question"]) for p in heldout_problems(cfg, n)]
    engine = SpeculativeEngine(
        target,
        head,
        EngineConfig(
            rule=args.rule,
            num_draft_tokens="auto",
            max_draft_tokens=args.max_draft_tokens,
            max_batch_size=n * group,
            theta=0.9,
        ),
    )
    engine._generate(
        prompts, SamplingParams(max_new_tokens=2, n=group, ignore_eos=True), FixedK(0)
    )  # warm-up
    runs = []
    for i in range(args.calibrations):
        print(f"[context_slope] calibration {i + 1}/{args.calibrations}", file=sys.stderr, flush=True)
        runs.append(one_calibration(engine, prompts, group, args.max_draft_tokens, seed=i))
    k_max = args.max_draft_tokens
    result = dict(
        bench="context_slope",
        preset=args.preset,
        path=str(path),
        rows=n * group,
        rule=args.rule,
        max_draft_tokens=k_max,
        threads=args.threads,
        calibrations=runs,
        median=dict(
            line_us=[round(statistics.median(r["line_us"][k] for r in runs), 2) for k in range(k_max + 1)],
            pooled_us=round(statistics.median(r["pooled_us"] for r in runs), 2),
        ),
    )
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
