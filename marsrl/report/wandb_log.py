"""Log a written report back into each arm's wandb run: the plots as images, the completions and the
side-by-side figures as tables, the figures and the verdict in the run summary.  Reading runs is
``wandb_read``'s.

An offline run cannot be reopened in place: ``wandb.init(id=..., resume="allow")`` in offline mode
starts a new ``offline-run-*-<id>`` folder beside the original.  That folder carries the original's
project, group, job type, tags and name, and logs at one step past the original's last, so
``wandb sync`` appends it to the same run (and ``wandb_read.read_wandb_runs`` merges it back by id).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import finite
from .load import Arm
from .wandb_read import find_run_dirs, is_run_dir, named_for_run, read_wandb_run


def completions_table(arm: Arm, max_samples: int = 50):
    """A ``wandb.Table`` of the arm's sample completions, one row per sample, with per-token provenance
    (codes and names), both log-prob lists and an HTML cell with relaxed tokens highlighted."""
    import wandb

    from .html import PROVENANCE_NAMES, sample_html, select_samples

    columns = [
        "step",
        "prompt",
        "completion",
        "reward",
        "relaxed_tokens",
        "tokens",
        "provenance",
        "provenance_names",
        "target_logprobs",
        "behavior_logprobs",
        "highlighted",
    ]
    table = wandb.Table(columns=columns, allow_mixed_types=True)
    for s in select_samples(arm.samples, max_samples):
        prov = [int(p) for p in s.get("provenance") or []]
        table.add_data(
            s.get("step"),
            str(s.get("prompt", "")),
            str(s.get("completion", "")),
            s.get("reward"),
            sum(p == 2 for p in prov),
            json.dumps(s.get("tokens") or []),
            json.dumps(prov),
            json.dumps([PROVENANCE_NAMES.get(p, str(p)) for p in prov]),
            json.dumps(s.get("target_logprobs") or []),
            json.dumps(s.get("behavior_logprobs") or []),
            wandb.Html(sample_html(s, standalone=True), inject=False, data_is_not_path=True),
        )
    return table


def _figures_table(table_json: dict):
    import wandb

    arms = table_json.get("arms", [])
    rows = [[r["label"], *(r["cells"].get(a, "n/a") for a in arms)] for r in table_json.get("rows", [])]
    return wandb.Table(columns=["figure", *arms], data=rows)


def _payload(report_dir: Path, arm: Arm, max_samples: int) -> tuple[dict, dict]:
    """(what to log, what to put in the summary) for one arm's run."""
    import wandb

    payload: dict[str, Any] = {
        f"report/{png.stem}": wandb.Image(str(png), caption=png.stem)
        for png in sorted(report_dir.glob("*.png"))
    }
    payload["report/completions"] = completions_table(arm, max_samples)
    summary: dict[str, Any] = {}
    if (report_dir / "table.json").is_file():
        table_json = json.loads((report_dir / "table.json").read_text())
        payload["report/table"] = _figures_table(table_json)
        figures = table_json.get("figures", {}).get(arm.name, {})
        summary.update({f"report/figure/{k}": v for k, v in figures.items() if finite(v)})
    if (report_dir / "verdict.txt").is_file():
        summary["report/verdict"] = (report_dir / "verdict.txt").read_text().strip()
    return payload, summary


_RESUME_WAIT_S = 2.0  # for a run that has just finished; a crashed run (no exit record) costs this once


def _resume_offline(run_dir: Path):
    """Start a run continuing ``run_dir``'s id (see the module docstring); returns (run, step to log at)."""
    import wandb

    original = read_wandb_run(run_dir, wait_s=_RESUME_WAIT_S)
    same_id = [d for d in find_run_dirs(run_dir.parent) if named_for_run(d.name, original.id)]
    last = max([original.last_step, *(read_wandb_run(d).last_step for d in same_id)])
    root = run_dir.parent.parent if run_dir.parent.name == "wandb" else run_dir.parent
    offline = run_dir.name.startswith("offline-run-")
    run = wandb.init(
        id=original.id,
        resume="allow",
        project=original.project or None,
        name=original.name or None,
        group=original.group or None,
        job_type=original.job_type or None,
        tags=original.tags or None,
        dir=str(root),
        mode="offline" if offline else None,
        settings=wandb.Settings(quiet=True) if offline else None,  # the run was announced when it began
        reinit="create_new",
    )
    return run, last + 1


def log_report_to_wandb(
    report_dir: str | Path,
    arms: list[Arm],
    runs: Mapping[str, Any] | None = None,
    max_samples: int = 50,
) -> dict[str, Path]:
    """Log a written report into each arm's wandb run: every ``*.png`` of ``report_dir`` as a
    ``wandb.Image`` (``report/<plot>``), the arm's completions as a ``wandb.Table``
    (``report/completions``), the side-by-side figures as ``report/table``; in the run summary the arm's
    figures (``report/figure/<key>``) and the verdict (``report/verdict``).

    ``runs`` maps arm names to live run objects, which are logged into and left open.  Other arms are
    resumed by id from their wandb run folder (``arm.wandb_run``) and finished; arms with neither are
    skipped.  Returns arm name -> the run folder written.
    """
    report_dir = Path(report_dir)
    runs = runs or {}
    written: dict[str, Path] = {}
    for arm in arms:
        live = runs.get(arm.name)
        if live is None and (arm.wandb_run is None or not is_run_dir(arm.wandb_run)):
            continue
        payload, summary = _payload(report_dir, arm, max_samples)
        if live is not None:
            live.log(payload)
            live.summary.update(summary)
            written[arm.name] = Path(live.dir).parent
            continue
        run, step = _resume_offline(arm.wandb_run)
        try:
            run.log(payload, step=step)
            run.summary.update(summary)
            written[arm.name] = Path(run.dir).parent
        finally:
            run.finish()
    return written
