"""``marsrl tinyworld build``: build (or reuse) the embedded CPU world."""

from __future__ import annotations

import argparse
import json


def _build(args: argparse.Namespace) -> int:
    from .build import PRESETS, build_tinyworld

    if args.preset not in PRESETS:
        print(f"marsrl: --preset must be one of {sorted(PRESETS)}")
        return 2
    if args.threads is not None and args.threads < 1:
        print(f"marsrl: --threads must be >= 1, got {args.threads}")
        return 2
    import torch

    threads = args.threads or torch.get_num_threads()  # the build has the machine: torch's count
    path = build_tinyworld(
        args.preset,
        args.out,
        seed=args.seed,
        force=args.force,
        progress=not args.no_progress,
        threads=threads,
    )
    meta = json.loads((path / "metadata.json").read_text())
    print(f"tiny world '{args.preset}' at {path}")
    print(json.dumps({k: meta[k] for k in ("target_params", "measured_at_build", "timings_s")}, indent=2))
    return 0


def add_tinyworld_parser(subparsers) -> None:
    tw = subparsers.add_parser(
        "tinyworld",
        help="build the embedded CPU world (task, tokenizer, tiny target, EAGLE-3 head)",
        description="Build a GSM-style task, a BPE tokenizer, a tiny Qwen3 target trained by SFT and an "
        "EAGLE-3 head trained on the target's own responses; cached under $MARSRL_CACHE or ~/.cache/marsrl.",
    )
    tw_sub = tw.add_subparsers(dest="tinyworld_command", required=True, metavar="COMMAND")
    build = tw_sub.add_parser("build", help="build or reuse a tiny world (deterministic for a seed)")
    build.add_argument("--preset", default="default", help="micro (< 60 s, for tests) or default (< 10 min)")
    build.add_argument("--out", help="folder to build into (default: the user cache)")
    build.add_argument("--seed", type=int, default=None, help="seed (default: the preset's)")
    build.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    build.add_argument("--no-progress", action="store_true", help="no progress bars")
    build.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads while building (default: torch's count, which honours OMP_NUM_THREADS)",
    )
    build.set_defaults(func=_build)
