"""Build the whole report of one experiment into ``<OUT_DIR>/report/``: the side-by-side table
(``table.md``, ``table.json``), the plots with their CSVs, ``completions.html`` and ``verdict.txt``;
optionally log it into each arm's wandb run.  The steps are the modules of this package; this file only
runs them in order and writes their outputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import stats
from .base import ReportError, finite
from .compare import UNFAIR_TIMING, aa_check, compare_arms, projection, void_unfair_timing
from .load import REPORT_DIR, Experiment, load_experiment
from .plots import write_plots
from .table import FINAL_FRAC, comparison_cells, format_markdown, summarize_arm, table_cells, table_json
from .verdict import reference_arm, timing_paragraph, verdict


@dataclass
class Report:
    experiment: Experiment
    out_dir: Path
    summaries: dict[str, dict]
    table: str
    verdict: str
    verdict_metrics: dict
    plots: dict
    skipped_plots: list[str]
    comparisons: dict = field(default_factory=dict)  # {arm: {figure key: compare.Figure}}
    target_reward: float | None = None
    wandb_runs: dict = field(default_factory=dict)


def build_report(
    path: str | Path,
    out_dir: str | Path | None = None,
    final_frac: float = FINAL_FRAC,
    samples_per_arm: int = 20,
    to_wandb: bool = False,
    target_reward: float | None = None,
    n_boot: int = stats.N_BOOT,
    seed: int = stats.SEED,
) -> Report:
    """Read ``path`` (see ``load_experiment``), write every report file and return what was computed.

    ``target_reward``: the reward level whose time to reach is compared; None takes the experiment
    config's ``report.target_reward`` (fixed before the run), else that figure is not compared."""
    if not 0 < final_frac <= 1:
        raise ReportError(f"--final-frac must be in (0, 1], got {final_frac}")
    exp = load_experiment(path)
    target = target_reward if target_reward is not None else configured_target(exp)
    from .html import completions_html  # imports torch (for the provenance codes): only once input is valid

    out = Path(out_dir) if out_dir is not None else exp.path / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    names = [a.name for a in exp.arms]
    summaries = {a.name: summarize_arm(a, final_frac) for a in exp.arms}
    ref = reference_arm(exp.arms)
    others = [a for a in exp.arms if a is not ref]
    comparisons = {a.name: compare_arms(a, ref, target, n_boot, seed, exp.timing) for a in others}
    aa = aa_check(exp.timing, ref.name, n_boot, seed) if ref is not None else None
    comparisons = void_unfair_timing(comparisons, aa)
    projections = {a.name: projection(a, ref, n_boot, seed, exp.timing) for a in others}
    if aa is not None and aa.resolved:  # the projection's speed-up comes from that same timing
        projections = {k: p and {**p, "void": UNFAIR_TIMING} for k, p in projections.items()}
    rows = table_cells(summaries, final_frac) + comparison_cells(comparisons, names, ref.name if ref else "")
    table = format_markdown(rows, names)
    text, metrics = verdict(exp.arms, summaries, comparisons, projections, target, n_boot, seed)
    if exp.timing is not None:
        text = f"{text}\n\n{timing_paragraph(exp.timing, ref.name, aa)}"
    (out / "table.md").write_text(f"# {exp.name}\n\n{table}\n")
    data = table_json(exp.name, summaries, rows, final_frac)
    data["comparisons"] = {a: {k: f.as_dict() for k, f in figs.items()} for a, figs in comparisons.items()}
    data["projection"] = metrics.get("projection", {})
    data["target_reward"] = target
    data["timing"] = (
        None
        if exp.timing is None
        else {
            "method": exp.timing.get("method"),
            "repeats": exp.timing.get("repeats"),
            "aa": aa and aa.as_dict(),
        }
    )
    data["smoothing"] = {"reward": "debiased exponential moving average", "alpha": stats.EMA_ALPHA}
    data["verdict"] = {"text": text, "metrics": metrics}
    (out / "table.json").write_text(json.dumps(data, indent=2, allow_nan=False))
    (out / "verdict.txt").write_text(text + "\n")
    plots, skipped = write_plots(exp.arms, out)
    (out / "completions.html").write_text(completions_html(exp.name, exp.arms, samples_per_arm))
    report = Report(exp, out, summaries, table, text, metrics, plots, skipped, comparisons, target)
    if to_wandb:
        from .wandb_log import log_report_to_wandb

        report.wandb_runs = log_report_to_wandb(out, exp.arms, max_samples=samples_per_arm)
    return report


def configured_target(exp: Experiment) -> float | None:
    """``report.target_reward`` from an arm's resolved config (the level fixed before the run), or None;
    ReportError when arms disagree."""
    found = set()
    for arm in exp.arms:
        section = arm.config.get("report")
        value = section.get("target_reward") if isinstance(section, dict) else None
        if finite(value):
            found.add(float(value))
    if len(found) > 1:
        raise ReportError(f"{exp.path}: arms name different report.target_reward values {sorted(found)}")
    return found.pop() if found else None
