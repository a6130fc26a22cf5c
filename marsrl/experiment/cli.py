"""``marsrl train``: the strict-vs-MARS GRPO experiment (see ``marsrl.experiment``)."""

from __future__ import annotations

import argparse
import sys

from ..config import add_config_args


def add_train_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train every arm of a GRPO experiment (strict vs MARS) and write the report",
        description="Train each arm of the experiment (same seed, prompts and everything else; each a "
        "MarsGRPOTrainer run with rollouts from the Ray pool), log it to wandb (offline unless you are "
        "logged in), write outputs/<experiment>/<arm>/ (metrics.jsonl, samples.jsonl, eval.json, "
        "checkpoints) and finish with `marsrl report` on the experiment folder.",
    )
    add_config_args(p, "the experiment", "configs/grpo_tiny.yaml", "trainer.max_steps=5")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue a stopped run: each arm from its newest whole checkpoint (one at the last step is "
        "only evaluated; a finished arm is kept), then the report",
    )
    p.add_argument("--overwrite", action="store_true", help="delete an existing experiment folder first")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="build everything that needs no weights (config, resource plan, data) and stop",
    )
    p.add_argument("--no-report", action="store_true", help="skip the report at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from .config import load_experiment
    from .run import ExperimentError, Interrupted, fault_point, run_experiment

    try:
        cfg = load_experiment(args.config, args.set)
        if args.dry_run:
            from .dry_run import dry_run

            print(dry_run(cfg))
            return 0
        root = run_experiment(
            cfg, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress
        )
    except (ConfigError, ExperimentError) as err:
        print(f"marsrl train: {err}", file=sys.stderr)
        return 2
    except Interrupted as err:
        print(f"marsrl train: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("marsrl train: interrupted; continue with --resume", file=sys.stderr)
        return 130
    if args.no_report:
        return 0
    from ..report.cli import main as report_main

    try:
        fault_point("report")
        return report_main([str(root), "--wandb"] if cfg.wandb.mode != "disabled" else [str(root)])
    except KeyboardInterrupt:
        print("marsrl train: interrupted during the report; --resume writes it again", file=sys.stderr)
        return 130
