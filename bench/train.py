"""GRPO step cost side by side in one run, on the tiny world, G = 8: rollouts with plain sampling (no
drafter), strict and mars verification at the engine's default K = 7 and with adaptive speculation
(``num_draft_tokens="auto"``, ``strict_auto`` / ``mars_auto``; ``--no-auto`` leaves them out); and the
draft kept in step (tau with and without refresh over a
policy that moves).

    python bench/train.py                         # step costs, 2 interleaved rounds
    python bench/train.py --refresh --steps 30    # tau over 30 steps with and without draft refresh (--lr)
    python bench/train.py --preset micro --steps 4 --rounds 1   # a quick look

Each configuration is one ``marsrl train`` arm (in-process rollout worker, wandb off) whose per-step rows
are read back; the first step of each run (warm-up, and under auto the engine's calibration) is left
out of the medians. Rounds interleave the
configurations (plain, strict, mars, plain, ...) so a noisy neighbour hits them alike. Prints one JSON.

Figures per configuration (medians over steps and rounds): seconds per step, rollout share of the step,
rollout tokens/s, tau, mean completion length (runs sample different completions, so their lengths,
and with them the step's training part, differ), the share of the step spent on the correction, bias
metrics and taps (``timing/correction_seconds``: the importance weights, the lm_head top-2 pass, the
statistics and the hooks), apart from the no-grad policy forward itself
(``timing/policy_forward_seconds``: the forward TRL runs only on its vLLM path), and the draft
refresh's share of the step it runs in; and for each auto configuration its rollout tokens/s over
the fixed-K one of its rule (``<rule>_auto_rollout_vs_<rule>``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marsrl.experiment.config import ArmConfig, load_experiment
from marsrl.experiment.run import run_experiment


def run(
    preset: str, arm: ArmConfig, steps: int, out: Path, drafter: bool, overrides: list[str]
) -> list[dict]:
    sets = [
        f"model=tinyworld:{preset}",
        f"drafter={'tinyworld:' + preset if drafter else 'null'}",
        "pool_backend=local",
        "wandb.mode=disabled",
        "data.n_eval=8",
        f"trainer.max_steps={steps}",
        "trainer.save_steps=100000",
        f"output_dir={out}",
        "samples_per_step=0",
        *([] if drafter else ["trainer.draft_refresh_every=0"]),
        *overrides,
    ]
    cfg = load_experiment("configs/grpo_tiny.yaml", sets)
    cfg = dataclasses.replace(cfg, arms=(arm,))
    root = run_experiment(cfg, overwrite=True, progress=False)
    return [json.loads(line) for line in (root / arm.name / "metrics.jsonl").read_text().splitlines()]


def med(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def step_costs(args) -> dict:
    auto = ["pool.worker.engine.num_draft_tokens=auto"]  # adaptive speculation, K <= 7
    configs = {
        "plain": (ArmConfig("plain", rule="strict"), False, []),
        "strict": (ArmConfig("strict", rule="strict"), True, []),
        "mars": (ArmConfig("mars", rule="mars"), True, []),
        "strict_auto": (ArmConfig("strict_auto", rule="strict"), True, auto),
        "mars_auto": (ArmConfig("mars_auto", rule="mars"), True, auto),
    }
    if args.no_auto:
        configs = {k: v for k, v in configs.items() if not k.endswith("_auto")}
    rows: dict[str, list[dict]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, (arm, drafter, extra) in configs.items():
                sets = [*extra, *(args.set or [])]
                got = run(args.preset, arm, args.steps, Path(tmp) / f"{name}{r}", drafter, sets)
                # the first step carries the warm-up (and, under auto, the engine's calibration)
                rows[name] += got[1:]
    out = {}
    for name, rs in rows.items():
        step = med([r["train/step_seconds"] for r in rs])
        refresh = [r for r in rs if r.get("train/timing/draft_refresh_seconds") is not None]
        out[name] = {
            "seconds_per_step": step,
            "rollout_share": med([r["train/rollout/share_of_step"] for r in rs]),
            "rollout_tokens_per_s": med([r["train/rollout/tokens_per_s"] for r in rs]),
            "tau": med([r["train/rollout/tau"] for r in rs]),
            "completion_mean_length": med([r.get("train/completions/mean_length") for r in rs]),
            "policy_forward_share": med(
                [r["train/timing/policy_forward_seconds"] / r["train/step_seconds"] for r in rs]
            ),
            "correction_share": med(
                [r["train/timing/correction_seconds"] / r["train/step_seconds"] for r in rs]
            ),
            "refresh_share_of_its_step": med(
                [r["train/timing/draft_refresh_seconds"] / r["train/step_seconds"] for r in refresh]
            ),
            "steps_measured": len(rs),
        }
    for name in [k for k in configs if k != "plain"]:
        out[f"{name}_step_vs_plain"] = out[name]["seconds_per_step"] / out["plain"]["seconds_per_step"]
    out["mars_step_vs_strict"] = out["mars"]["seconds_per_step"] / out["strict"]["seconds_per_step"]
    for name in [k for k in configs if k.endswith("_auto")]:
        fixed = name.removesuffix("_auto")
        out[f"{name}_rollout_vs_{fixed}"] = (
            out[name]["rollout_tokens_per_s"] / out[fixed]["rollout_tokens_per_s"]
        )
    return out


def refresh(args) -> dict:
    """tau over ``--steps`` of a moving policy (``--lr``): head refreshed every 2 steps vs never."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, every in (("refresh", 2), ("no_refresh", 0)):
            sets = [
                f"trainer.learning_rate={args.lr}",
                f"trainer.draft_refresh_every={every}",
                *(args.set or []),
            ]
            rs = run(
                args.preset, ArmConfig("strict", rule="strict"), args.steps, Path(tmp) / name, True, sets
            )
            taus = [r["train/rollout/tau"] for r in rs]
            start = statistics.mean(taus[:3])
            end = statistics.mean(taus[-3:])
            out[name] = {
                "tau_first3": start,
                "tau_last3": end,
                "end_over_start": end / start,
                "tau": taus,
                "reward": [r["train/reward"] for r in rs],
                "draft_loss": [r.get("train/draft/loss") for r in rs],
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="default", help="tiny-world preset (default: default; micro)")
    parser.add_argument("--steps", type=int, default=6, help="training steps a run (the first is left out)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the configurations")
    parser.add_argument(
        "--no-auto", action="store_true", help='leave out the num_draft_tokens="auto" configurations'
    )
    parser.add_argument("--refresh", action="store_true", help="the draft-refresh comparison instead")
    parser.add_argument("--lr", type=float, default=2e-4, help="policy learning rate of the refresh runs")
    parser.add_argument(
        "--set", action="append", help="experiment overrides, e.g. trainer.max_completion_length=64"
    )
    args = parser.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON (DeepSpeed logs to it)
        result = refresh(args) if args.refresh else step_costs(args)
    print(json.dumps({"bench": "train", "preset": args.preset, "steps": args.steps, **result}, indent=2))


if __name__ == "__main__":
    main()
