"""How steady the adaptive mode's cost model is: calibrate the same engine several times and compare.

    python -m bench.calibration                     # default world, max batch 128, K = 7, 4 calibrations
    python -m bench.calibration --calibrations 8 --acceptance 0.8 0.9
    python -m bench.calibration --preset micro --max-batch 8 --calibrations 2   # a smoke run
    python -m bench.calibration --repeats 3 6      # calibrate's runs a size: 3 (the default) against 6

``num_draft_tokens="auto"`` chooses each round's k from a cost model measured once per engine
(``SpeculativeEngine.calibrate``).  Near the optimum the expected tokens per second of neighbouring k
differ by a few percent, so the timing noise of one calibration decides which of them ``auto`` drafts.
This bench runs ``--calibrations`` calibrations back to back on the run's own prompts and judges
them at a cache ``--width`` (slots; the model adds each k's measured cost per slot of context to its
empty-cache figure, ``CostModel.per_slot``).  It reports:

- ``figures_ms``: per measured batch size and k, the round time at that width of each calibration (ms),
  and its coefficient of variation across them (``cv``); ``per_slot_us``, the same for the seconds a
  slot of context adds (microseconds; ``cv`` left out where the mean is 0);
- ``choices``: for each flat per-position acceptance rate a in ``--acceptance`` (every draft position
  accepted with probability a given the ones before it: E[tokens | k] = 1 + a + ... + a^k) and each live
  batch in ``--batches``, the k each calibration's model chooses, and ``regret``: how much slower that
  choice is than the best k, both judged by the mean of all calibrations' models (the best estimate
  here of the true costs).  A steady calibration chooses one k, or neighbours with regret near 0.

``--repeats R1 R2 ...`` calibrates with each number of runs a batch size (``calibrate(repeats=R)``, whose
figure for a k is the lower quartile of its runs), the settings interleaved calibration by calibration
so a slow spell of the machine falls on each alike.  Each setting's calibrations are then judged by the
mean of *every* setting's models (one truth for all), under ``by_repeats``, with ``mean_regret``: the
mean over every acceptance rate and batch of the mean regret (the figure that tells whether more runs
buy a steadier choice).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

from bench._common import clock, emit, interleaved
from marsrl.engine import EngineConfig, SpeculativeEngine
from marsrl.engine.adaptive import CostModel
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids


def rates(model: CostModel, rows: int, k_max: int, a: float, width: int = 0) -> list[float]:
    """Expected tokens per second of a round at each k = 0 .. k_max under a flat acceptance a, over a
    cache ``width`` slots wide."""
    seconds = model.round_seconds_upto(rows, k_max, width)
    return [rows * sum(a**j for j in range(k + 1)) / seconds[k] for k in range(k_max + 1)]


def mean_model(models: list[CostModel]) -> CostModel:
    """The figure-by-figure mean of models measured on one grid."""

    def mean(table: str) -> dict[int, dict[int, float]]:
        grid = getattr(models[0], table)
        return {
            r: {k: statistics.fmean(getattr(m, table)[r][k] for m in models) for k in ks}
            for r, ks in grid.items()
        }

    return CostModel(rounds=mean("rounds"), per_slot=mean("per_slot"))


def _spread(values: list[float], key: str = "values") -> dict:
    """{key: the values, cv: their coefficient of variation (left out where the mean is 0)}."""
    mean = statistics.fmean(values)
    out: dict = {key: [round(v, 2) for v in values]}
    if mean > 0:
        out["cv"] = round(statistics.pstdev(values) / mean, 4)
    return out


def summarise(
    models: list[CostModel],
    batches: list[int],
    k_max: int,
    acceptance: list[float],
    width: int = 0,
    truth: CostModel | None = None,
) -> dict:
    """``figures_ms``, ``per_slot_us``, ``choices`` and ``mean_regret`` (see the module's docstring) of
    calibrations on one grid, judged at a cache ``width`` slots wide by ``truth`` (default: the mean of
    ``models``)."""
    grid = sorted(models[0].rounds)
    figures, slots = {}, {}
    for r in grid:
        figures[str(r)], slots[str(r)] = {}, {}
        for k in sorted(models[0].rounds[r]):
            figures[str(r)][str(k)] = _spread([1e3 * m.round_seconds(r, k, width) for m in models], "ms")
            if models[0].per_slot:
                slots[str(r)][str(k)] = _spread([1e6 * m.slot_seconds(r, k) for m in models])
    truth = truth or mean_model(models)
    choices, regrets = {}, []
    for a in acceptance:
        choices[str(a)] = {}
        for rows in batches:
            true = rates(truth, rows, k_max, a, width)
            best = max(range(k_max + 1), key=lambda k: (true[k], -k))
            picked = []
            for m in models:
                own = rates(m, rows, k_max, a, width)
                picked.append(max(range(k_max + 1), key=lambda k, own=own: (own[k], -k)))
            regret = [1 - true[k] / true[best] for k in picked]
            regrets.append(statistics.fmean(regret))
            choices[str(a)][str(rows)] = {
                "best_by_mean_model": best,
                "chosen": picked,
                "counts": dict(sorted(Counter(map(str, picked)).items())),
                "regret": {"mean": round(statistics.fmean(regret), 4), "max": round(max(regret), 4)},
            }
    return {
        "width": width,
        "figures_ms": figures,
        "per_slot_us": slots,
        "choices": choices,
        "mean_regret": round(statistics.fmean(regrets), 4),
    }


def compare_settings(
    models: dict[int, list[CostModel]],
    batches: list[int],
    k_max: int,
    acceptance: list[float],
    width: int = 0,
) -> dict[str, dict]:
    """``summarise`` of each setting's calibrations (setting -> its models), every setting judged by one
    truth: the mean of *all* settings' models, so a setting whose models agree with each other but not
    with the rest shows its regret (judged by its own mean it would read none)."""
    truth = mean_model([m for ms in models.values() for m in ms])
    return {str(r): summarise(ms, batches, k_max, acceptance, width, truth=truth) for r, ms in models.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--world", type=Path, default=None, help="a built world's folder (default: the preset's)")
    ap.add_argument("--max-batch", type=int, default=128, help="the engine's max_batch_size (sets the grid)")
    ap.add_argument("--max-draft-tokens", type=int, default=7, help="K: calibrates k = 0 .. K")
    ap.add_argument("--calibrations", type=int, default=4, help="calibrations to compare (>= 2)")
    ap.add_argument(
        "--acceptance", type=float, nargs="+", default=[0.8, 0.85, 0.9], help="flat per-position rates"
    )
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128], help="live batches to judge")
    ap.add_argument(
        "--width",
        type=int,
        default=160,
        help="cache width (slots) to judge the models at (160: about the middle of a tiny-world call)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        nargs="+",
        default=[3],
        help="calibrate's runs a batch size (its default 3); several values are compared, interleaved",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    if args.calibrations < 2:
        ap.error("--calibrations: at least 2 to compare")
    if args.width < 0:
        ap.error("--width: a cache width is a number of slots >= 0")
    if not all(0 < a < 1 for a in args.acceptance):
        ap.error("--acceptance: rates must lie in (0, 1)")
    if min(args.repeats) < 1 or len(set(args.repeats)) < len(args.repeats):
        ap.error("--repeats: distinct numbers of runs, each >= 1")
    torch.set_num_threads(args.threads)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON
        path = args.world or build_tinyworld(args.preset, progress=False)
        target, tok, head, _ = load_tinyworld(path)
    cfg = PRESETS[args.preset]
    prompts = [
        chat_prompt_ids(tok, p["question"]) for p in heldout_problems(cfg, max(args.max_batch // 8, 1))
    ]
    k_max = args.max_draft_tokens
    config = EngineConfig(num_draft_tokens="auto", max_draft_tokens=k_max, max_batch_size=args.max_batch)
    engine = SpeculativeEngine(target, head, config)

    def measure(r: int, i: int) -> tuple[float, CostModel]:
        wall, model = clock(lambda: engine.calibrate(prompts=prompts, repeats=r))
        print(
            f"[calibration] {i + 1}/{args.calibrations} repeats={r}: {round(wall, 2)} s",
            file=sys.stderr,
            flush=True,
        )
        return round(wall, 2), model

    # the settings' order rotated each calibration, so none always runs first
    runs = interleaved(args.repeats, args.calibrations, measure)
    models = {r: [m for _, m in rs] for r, rs in runs.items()}
    seconds = {r: [s for s, _ in rs] for r, rs in runs.items()}
    out = {
        "bench": "calibration",
        "preset": args.preset,
        "max_batch": args.max_batch,
        "max_draft_tokens": k_max,
        "threads": args.threads,
    }
    if len(args.repeats) == 1:
        (r,) = args.repeats
        out |= {"repeats": r, "seconds": seconds[r]}
        out |= summarise(models[r], args.batches, k_max, args.acceptance, args.width)
    else:
        judged = compare_settings(models, args.batches, k_max, args.acceptance, args.width)
        out["by_repeats"] = {str(r): {"seconds": seconds[r], **judged[str(r)]} for r in args.repeats}
    return emit(out, indent=1)


if __name__ == "__main__":
    main()
