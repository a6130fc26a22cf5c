"""``marsrl report OUT_DIR``: the strict-vs-MARS report of one experiment.

    marsrl report outputs/<experiment> [--out DIR] [--target-reward 0.5] [--final-frac 0.2] [--samples 20]
                                       [--wandb]

OUT_DIR is an experiment folder (one sub-folder per arm, as ``marsrl train`` writes), a wandb run folder
(``.../wandb/offline-run-*``) or a folder of them. An experiment run at several seeds (``seed-<s>/``
sub-folders) gets each seed's report in its folder and the aggregate over seeds (``seeds.md``,
``seeds.json``) in OUT_DIR/report.  Input problems print one line naming the file and
exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .base import ReportError
from .table import FINAL_FRAC


def _seed_folders(folder: Path) -> list[Path]:
    """The ``seed-<s>`` sub-folders of an experiment run at several seeds (none for one seed)."""
    if not folder.is_dir():
        return []
    return sorted(
        (p for p in folder.glob("seed-*") if p.is_dir() and p.name[5:].lstrip("-").isdigit()),
        key=lambda p: int(p.name[5:]),
    )


def _report(args: argparse.Namespace) -> int:
    seeds = _seed_folders(Path(args.out_dir))
    if not seeds:
        return _one_report(args, args.out_dir, args.out)
    from .seeds import format_markdown, write_seed_report

    root = Path(args.out_dir)
    out = Path(args.out) if args.out else root / "report"
    tables = {}
    for folder in seeds:
        code = _one_report(args, folder, str(out / folder.name) if args.out else None)
        if code:
            return code
        tables[folder.name] = json.loads(
            ((out / folder.name) if args.out else folder / "report").joinpath("table.json").read_text()
        )
    agg = write_seed_report(root, tables, out)
    print(format_markdown(agg, root.name))
    print(f"wrote {out}: seeds.md, seeds.json (each seed's report in its folder)")
    return 0


def _one_report(args: argparse.Namespace, path, out) -> int:
    from .build import build_report

    try:
        report = build_report(
            path,
            out_dir=out,
            final_frac=args.final_frac,
            samples_per_arm=args.samples,
            to_wandb=args.wandb,
            target_reward=args.target_reward,
        )
    except ReportError as err:
        print(f"marsrl report: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"marsrl report: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        return 2
    exp = report.experiment
    print(
        f"marsrl report: experiment '{exp.name}', arms {', '.join(a.name for a in exp.arms)} ({exp.path})\n"
    )
    for arm in exp.arms:
        if arm.run is not None and not arm.run.get("finished"):
            print(
                f"note: {arm.name}: wandb run {arm.run['path']} has no exit record (still running, or "
                "crashed); its last rows may be missing"
            )
    print(report.table)
    print(f"\n{report.verdict}\n")
    files = ["table.md", "table.json", "verdict.txt", "completions.html"]
    files += [f"{name}.png/.csv" for name in report.plots]
    print(f"wrote {report.out_dir}: {', '.join(files)}")
    if report.skipped_plots:
        print(f"no arm logged the metric of: {', '.join(report.skipped_plots)} (not plotted)")
    for arm, run_dir in report.wandb_runs.items():
        print(f"logged to wandb: {arm} -> {run_dir}")
    if args.wandb:
        missing = [a.name for a in exp.arms if a.name not in report.wandb_runs]
        if missing:
            print(f"no wandb run folder for: {', '.join(missing)} (not logged)")
    return 0


def add_report_parser(subparsers) -> None:
    rep = subparsers.add_parser(
        "report",
        help="side-by-side report of an experiment's arms (table, plots, completions, verdict)",
        description="Read an experiment folder written by `marsrl train` (one sub-folder per arm) or wandb "
        "run folders, and write into OUT_DIR/report/: table.md and table.json (one column per arm), PNG "
        "plots each with the CSV of the series drawn, completions.html (relaxed tokens highlighted) and "
        "verdict.txt; print the table and the verdict.",
    )
    rep.add_argument(
        "out_dir", metavar="OUT_DIR", help="outputs/<experiment>, a wandb run folder, or a folder of them"
    )
    rep.add_argument("--out", help="write the report here instead of OUT_DIR/report")
    rep.add_argument(
        "--target-reward",
        type=float,
        help="the reward level (fixed before the run) whose time to reach each arm is compared on the "
        "EMA-smoothed reward curve (default: the experiment config's report.target_reward, else not "
        "compared)",
    )
    rep.add_argument(
        "--final-frac",
        type=float,
        default=FINAL_FRAC,
        help=f"share of the last steps averaged into the final reward (default {FINAL_FRAC})",
    )
    rep.add_argument("--samples", type=int, default=20, help="sample completions shown per arm (default 20)")
    rep.add_argument(
        "--wandb",
        action="store_true",
        help="also log the plots and a completions table into each arm's wandb run (resumed by id)",
    )
    rep.set_defaults(func=_report)


def main(argv: list[str] | None = None) -> int:
    """``marsrl report`` on its own: ``main(["outputs/exp"])``."""
    parser = argparse.ArgumentParser(prog="marsrl")
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
