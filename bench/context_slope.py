"""What a slot of cache width costs a round drafting k, for every k: each k's own figure, the line in k
the cost model reads (fitted to the rounds of every k at once, ``context_line``), the line through each
k's own figure (an alternative), and one figure pooled over every k >= 1 (a simpler alternative); all
four from the same timed rounds.

    python -m bench.context_slope                  # default world, 32 rows, mars, 3 calibrations
    python -m bench.context_slope --rows 128 --rule strict
    python -m bench.context_slope --rows 128 --rule strict --repeats 6   # twice the timed rounds a k
    python -m bench.context_slope --preset micro --rows 8 --calibrations 1 --max-draft-tokens 2   # smoke

Each calibration runs what ``SpeculativeEngine.calibrate`` runs at one batch size
(``SpeculativeEngine.calibration_runs``: ``--repeats`` calls, three by default, cycling k = 0 .. K, two
rounds a k, the second timed, up and down in turn) on the world's own prompts, and reads the (width,
seconds) of the timed rounds, in microseconds a slot for k = 0 .. K: ``per_k_us`` is ``context_slope``
over each k's rounds, ``line_us`` what the model reads (``CostModel`` over ``context_line``'s figures:
the plain step's own, then one Theil-Sen line through the pair slopes of every k >= 1, never below it),
``per_k_line_us`` the model over ``per_k_us`` instead (a least-squares line through each k's own
figure), ``pooled_us`` one ``context_slope`` over the rounds of every k >= 1. A slot costs a longer
chain more (the target's block attends from k + 1 queries, the drafter once a draft step) where the line
rises; the pooled figure then prices K's context low and k = 1's high.

``steadiness`` compares the two lines over the calibrations, which measured the same thing, at every
k >= 1: ``cv`` the median over k of a line's coefficient of variation across calibrations, ``error``
the mean |relative error| of a calibration's line against ``all_rounds_us`` (the line through each k's
own figure over the rounds of every calibration at once, as many times the pairs a k as there are
calibrations: the closest this bench has to the truth).  The lower, the steadier the model one
calibration leaves.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys

import torch

from bench._common import emit, spread
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.engine.adaptive import CostModel, FixedK, context_line, context_slope
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids


def _us(seconds: float) -> float:
    return round(1e6 * seconds, 2)


def median(values: list[float]) -> float:
    """The calibrations' median of a figure, in microseconds to 0.01 (``spread``'s median)."""
    return spread(values, 2)["median"]


def _model_line(figures: dict[int, float], rows: int, k_max: int) -> list[float]:
    """The model's slot cost for k = 0 .. k_max from per-k figures, in microseconds."""
    model = CostModel(rounds={rows: dict.fromkeys(range(k_max + 1), 1.0)}, per_slot={rows: figures})
    return [_us(s) for s in model.slot_seconds_upto(rows, k_max)]


def one_calibration(
    engine: SpeculativeEngine, prompts, group: int, k_max: int, seed: int, repeats: int = 3
) -> tuple[dict, dict]:
    """The timed rounds of one calibration at ``len(prompts) * group`` rows (``calibration_runs``, as
    ``calibrate`` takes them), as the four figures, and the rounds (k -> one list a run)."""
    ks = list(range(k_max + 1))
    rows = len(prompts) * group
    runs = engine.calibration_runs(prompts, group, repeats=repeats, seed=10 * seed)
    groups = {k: [run[k] for run in runs if k in run] for k in ks}
    per_k = {k: context_slope(g) for k, g in groups.items()}
    pooled = context_slope([points for run in runs for k, points in run.items() if k > 0])
    return dict(
        per_k_us=[_us(per_k[k]) for k in ks],
        line_us=_model_line(context_line(groups), rows, k_max),
        per_k_line_us=_model_line(per_k, rows, k_max),
        pooled_us=_us(pooled),
        widths=[
            min(w for run in runs for pts in run.values() for w, _ in pts),
            max(w for run in runs for pts in run.values() for w, _ in pts),
        ],
    ), groups


def steadiness(lines: list[list[float]], truth: list[float]) -> dict:
    """Over k >= 1: each k's coefficient of variation across the calibrations' lines (their median over
    k: ``cv``), and the mean |relative error| of every calibration's figure against ``truth``."""
    cv = []
    for figures in list(zip(*lines, strict=True))[1:]:
        mean = statistics.fmean(figures)
        cv.append(round(statistics.pstdev(figures) / mean, 3) if mean > 0 else 0.0)
    errors = [
        abs(line[k] - truth[k]) / truth[k] for line in lines for k in range(1, len(truth)) if truth[k] > 0
    ]
    return dict(
        cv_per_k=cv, cv=statistics.median(cv), error=round(statistics.fmean(errors), 3) if errors else None
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="default")
    ap.add_argument("--world", default=None, help="a built world's folder (default: the preset's)")
    ap.add_argument("--rows", type=int, default=32, help="live rows (groups of up to 8 sharing a prompt)")
    ap.add_argument("--rule", choices=["strict", "mars"], default="mars")
    ap.add_argument("--calibrations", type=int, default=3)
    ap.add_argument(
        "--repeats", type=int, default=3, help="runs a calibration (calibrate's repeats; its default 3)"
    )
    ap.add_argument("--max-draft-tokens", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    for name in ("rows", "calibrations", "repeats", "max_draft_tokens", "threads"):
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
    k_max = args.max_draft_tokens
    runs, rounds = [], {k: [] for k in range(k_max + 1)}
    for i in range(args.calibrations):
        print(f"[context_slope] calibration {i + 1}/{args.calibrations}", file=sys.stderr, flush=True)
        figures, groups = one_calibration(engine, prompts, group, k_max, seed=i, repeats=args.repeats)
        runs.append(figures)
        for k, g in groups.items():
            rounds[k] += g
    truth = _model_line({k: context_slope(g) for k, g in rounds.items()}, n * group, k_max)
    result = dict(
        bench="context_slope",
        preset=args.preset,
        path=str(path),
        rows=n * group,
        rule=args.rule,
        max_draft_tokens=k_max,
        repeats=args.repeats,
        threads=args.threads,
        calibrations=runs,
        median=dict(
            line_us=[median([r["line_us"][k] for r in runs]) for k in range(k_max + 1)],
            per_k_line_us=[median([r["per_k_line_us"][k] for r in runs]) for k in range(k_max + 1)],
            pooled_us=median([r["pooled_us"] for r in runs]),
        ),
        all_rounds_us=truth,
        steadiness=dict(
            line=steadiness([r["line_us"] for r in runs], truth),
            per_k_line=steadiness([r["per_k_line_us"] for r in runs], truth),
        ),
    )
    return emit(result, indent=1)


if __name__ == "__main__":
    main()
