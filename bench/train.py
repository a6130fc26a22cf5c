"""GRPO step cost side by side in one run, on the tiny world, G = 8: rollouts with plain sampling (no
drafter), strict and mars verification at the engine's default K = 7 and with adaptive speculation
(``num_draft_tokens="auto"``, ``strict_auto`` / ``mars_auto``; ``--no-auto`` leaves them out); the
draft kept in step (tau with and without refresh over a policy that moves); and the mars step with the
policy forward fused into the training one against the separate no-grad forward.

    python bench/train.py                         # step costs, 2 interleaved rounds
    python bench/train.py --refresh --steps 30    # tau over 30 steps with and without draft refresh (--lr)
    python bench/train.py --fused --steps 6 --rounds 3   # fused vs two-forward mars steps, interleaved
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

``--refresh``: two strict runs of ``--steps`` from the same seed, the head refreshed every ``--every``
steps (the trainer's ``draft_refresh_*`` defaults unless ``--set`` changes them) and never; per run tau
per step and over the first and last 3 steps, the reward over the same steps (is the policy learning?),
the head's loss on the policy's states before each refresh (the learning head's and the served head's,
and how many refreshes were served: ``draft_refresh_gate``), and the refresh's seconds and share of its
step.

``--fused``: mars runs with ``fuse_policy_forward`` true and false, ``--rounds`` repeats interleaved
(the order rotated each repeat); per configuration the median seconds per step (first step left out), and
the fused / two-forward ratio of step time over every step, paired by step within a repeat, with a 90%
bootstrap interval (``_common.pooled_ratio_of_sums``), also over the steps without a refresh alone.
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

from bench._common import interleaved, pooled_ratio_of_sums, spread
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
    """tau over ``--steps`` of a moving policy (``--lr``): head refreshed every ``--every`` steps vs never."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, every in (("refresh", args.every), ("no_refresh", 0)):
            sets = [
                *([] if args.lr is None else [f"trainer.learning_rate={args.lr}"]),
                f"trainer.draft_refresh_every={every}",
                *(args.set or []),
            ]
            rs = run(
                args.preset, ArmConfig("strict", rule="strict"), args.steps, Path(tmp) / name, True, sets
            )
            taus = [r["train/rollout/tau"] for r in rs]
            rewards = [r["train/reward"] for r in rs]
            start = statistics.mean(taus[:3])
            end = statistics.mean(taus[-3:])
            refreshed = [r for r in rs if r.get("train/draft/seconds") is not None]
            out[name] = {
                "tau_first3": start,
                "tau_last3": end,
                "end_over_start": end / start,
                "reward_first3": statistics.mean(rewards[:3]),
                "reward_last3": statistics.mean(rewards[-3:]),
                "tau": taus,
                "reward": rewards,
                "draft_loss": [r.get("train/draft/loss") for r in rs],
                "draft_served_loss": [r.get("train/draft/served_loss") for r in rs],
                "served": sum(bool(r.get("train/draft/published")) for r in refreshed),
                "refreshes": len(refreshed),
                "refresh_seconds": spread([r["train/draft/seconds"] for r in refreshed]),
                "refresh_share_of_its_step": spread([r["train/draft/share_of_step"] for r in refreshed]),
                "seconds_per_step": med([r["train/step_seconds"] for r in rs[1:]]),
            }
    out["refresh_tau_last3_over_no_refresh"] = out["refresh"]["tau_last3"] / out["no_refresh"]["tau_last3"]
    return out


def fused(args) -> dict:
    """mars steps with the policy forward fused into the training one vs the separate no-grad forward."""
    configs = {"fused": "true", "two_forward": "false"}
    with tempfile.TemporaryDirectory() as tmp:

        def measure(name: str, rep: int) -> list[dict]:
            sets = [f"trainer.fuse_policy_forward={configs[name]}", *(args.set or [])]
            rows = run(args.preset, ArmConfig("mars", rule="mars"), args.steps, Path(tmp) / f"{name}{rep}",
                       True, sets)  # fmt: skip
            return rows[1:]  # the first step carries the warm-up

        runs = interleaved(list(configs), args.rounds, measure)
    out: dict = {}
    for name, reps in runs.items():
        seconds = [r["train/step_seconds"] for rows in reps for r in rows]
        out[name] = {
            "seconds_per_step": spread(seconds),
            "policy_forward_share": med(
                [
                    r["train/timing/policy_forward_seconds"] / r["train/step_seconds"]
                    for rows in reps
                    for r in rows
                ]
            ),
            "completion_mean_length": med(
                [r.get("train/completions/mean_length") for rows in reps for r in rows]
            ),
            "steps_measured": len(seconds),
        }

    def ratio(keep) -> dict | None:
        # pooled_ratio_of_sums reads (tokens, seconds) pairs as a speed ratio num/den; one "token" a step
        # with the two-forward side as num gives sum(fused seconds) / sum(two-forward seconds)
        strata = [
            [((1.0, b["train/step_seconds"]), (1.0, a["train/step_seconds"]))
             for a, b in zip(fa, ta, strict=False) if keep(a) and keep(b)]
            for fa, ta in zip(runs["fused"], runs["two_forward"], strict=True)
        ]  # fmt: skip
        return pooled_ratio_of_sums(strata)

    out["fused_over_two_forward"] = ratio(lambda r: True)
    out["fused_over_two_forward_no_refresh_steps"] = ratio(lambda r: r.get("train/draft/seconds") is None)
    out["median_ratio"] = (
        out["fused"]["seconds_per_step"]["median"] / out["two_forward"]["seconds_per_step"]["median"]
    )
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
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="policy learning rate of the refresh runs (default: the config's)",
    )
    parser.add_argument("--every", type=int, default=1, help="refresh the head every this many steps")
    parser.add_argument(
        "--fused", action="store_true", help="fused vs two-forward mars steps, interleaved, instead"
    )
    parser.add_argument(
        "--set", action="append", help="experiment overrides, e.g. trainer.max_completion_length=64"
    )
    args = parser.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON (DeepSpeed logs to it)
        result = refresh(args) if args.refresh else fused(args) if args.fused else step_costs(args)
    print(json.dumps({"bench": "train", "preset": args.preset, "steps": args.steps, **result}, indent=2))


if __name__ == "__main__":
    main()
