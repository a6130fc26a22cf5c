"""The ``marsrl`` command line.

marsrl demo [--config configs/demo.yaml] [--set theta=0.8 --set temperature=0] [--json out.json]
marsrl rollouts [--config configs/rollouts.yaml] [--set num_prompts=4] [--no-progress]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import ConfigError, add_config_args, load_config


def _demo(args: argparse.Namespace) -> int:
    from .commands.demo import DemoConfig, format_table, run_demo

    cfg = load_config(DemoConfig, args.config, args.set)
    report = run_demo(cfg)
    mode = "greedy" if cfg.temperature == 0 else f"T={cfg.temperature}"
    draft = "greedy draft" if cfg.greedy_draft else "sampled draft"
    print(
        f"marsrl demo: {cfg.rounds} rounds of K={cfg.draft_len} drafts, V={cfg.vocab}, {mode}, "
        f"theta={cfg.theta}, {draft}, {cfg.near_tie_frac:.0%} near-tie positions, seed {cfg.seed}\n"
    )
    print(format_table(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}")
    return 0


def _rollouts(args: argparse.Namespace) -> int:
    from .commands.compare import CompareConfig, format_report, run_compare

    cfg = load_config(CompareConfig, args.config, args.set)
    report = run_compare(cfg, progress=not args.no_progress)
    print(
        f"marsrl rollouts: tiny world '{cfg.preset}', {cfg.num_prompts} prompts x G={cfg.group_size}, "
        f"K={cfg.num_draft_tokens}, T={cfg.temperature}, theta={cfg.theta}, seed {cfg.seed}\n"
    )
    print(format_report(report))
    print(f"\nevery trajectory with its per-token record: {report['out']}")
    return 0


def _add_demo_parser(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="compare strict / mars / mars_code verification on synthetic logits",
        description="Verify the same synthetic draft chains under each rule and print acceptance (tau, "
        "per-position acceptance), the relaxed fraction, the top-1/top-2 bias against exact sampling, "
        "and importance-ratio statistics from the recorded behaviour log-probs.",
    )
    add_config_args(demo, "DemoConfig", "configs/demo.yaml", "temperature=0")
    demo.add_argument("--json", help="also write the full report to this JSON file")
    demo.set_defaults(func=_demo)


def _add_rollouts_parser(sub) -> None:
    rollouts = sub.add_parser(
        "rollouts",
        help="strict vs MARS GRPO rollouts on the tiny world through the Ray pool",
        description="Build (or reuse) the tiny world, roll out the same prompts and seed under each rule "
        "through the Ray rollout pool, print a side-by-side table (tau, tokens/s, relaxed fraction, "
        "top-1/top-2 bias against exact sampling, importance ratios, mean reward) and write every "
        "trajectory with its per-token record to JSONL.",
    )
    add_config_args(rollouts, "CompareConfig", "configs/rollouts.yaml", "num_prompts=4")
    rollouts.add_argument("--no-progress", action="store_true", help="no progress bars")
    rollouts.set_defaults(func=_rollouts)


def build_parser() -> argparse.ArgumentParser:
    """Every command registered the same way: an ``add_*_parser(subparsers)`` of its own module, which
    takes its config arguments from ``config.add_config_args``."""
    from .drafter.cli import add_draft_parser
    from .experiment.cli import add_train_parser
    from .report.cli import add_report_parser
    from .tinyworld.cli import add_tinyworld_parser

    parser = argparse.ArgumentParser(
        prog="marsrl",
        description="Speculative rollouts for RL post-training with MARS margin-aware verification.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_demo_parser,
        _add_rollouts_parser,
        add_train_parser,
        add_draft_parser,
        add_tinyworld_parser,
        add_report_parser,
    ):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .quiet import quiet

    quiet()  # only the third-party notices marsrl understands (see marsrl/quiet.py)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"marsrl: config error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"marsrl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
