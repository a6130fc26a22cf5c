"""Read one experiment's output into plain per-arm records: the folders ``marsrl train`` writes, or wandb
run folders (one run per arm).  Validation only; no figures are computed here.

The on-disk contract, ``outputs/<experiment>/<arm>/``:
    config.yaml     the resolved config: ``experiment: <name>``, ``arm: {name, rule, theta, ...}``
    metrics.jsonl   one object per logged step: ``step`` (int), ``wall_s`` and the keys as logged to
                    wandb (``train/reward``, ``train/rollout/tau``, ``train/bias/top2_excess``, ...);
                    any metric may be absent, null or NaN in a row
    eval.json       ``{"before": R, "after": R, "tau": float}``, R either one result {accuracy, ci_low,
                    ci_high, n[, correct]} or one per temperature {"t1": {...}, "greedy": {...}} (as
                    ``marsrl.experiment.evaluate`` writes); ``correct``, a 0/1 list over the held-out
                    problems in a fixed order, makes the arms' accuracy comparison paired
    samples.jsonl   sample trajectories (step, prompt, completion, tokens, token_ids, provenance,
                    target_logprobs, behavior_logprobs, reward[, gold, answer]); ``tokens`` are
                    the decoded texts of the ids (their concatenation is the completion)
    wandb_run       optional: the path of the arm's wandb run folder
Only ``metrics.jsonl`` is required (or, without it, a ``wandb_run`` whose history replaces it).

Every problem with the input is a ``ReportError`` whose message is one line naming the file (and the
line, for JSON Lines and YAML).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..config import load_yaml
from .base import ReportError
from .wandb_read import find_run_dirs, history_to_metrics, is_run_dir, merge_runs, read_wandb_run

ARM_FILES = ("metrics.jsonl", "config.yaml", "wandb_run")
"""Any of these makes a sub-folder of an experiment an arm."""
REPORT_DIR = "report"


@dataclass
class Arm:
    """One arm of an experiment: its resolved config, metric rows and (optional) evaluation and samples.

    ``rows`` are sorted by step, one per step, with keys as logged to wandb plus ``step`` and ``wall_s``.
    ``run`` holds the wandb run identity (id, project, group, job_type, tags, name) when the arm was read
    from a wandb run folder.
    """

    name: str
    path: Path
    config: dict = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    eval: dict | None = None
    samples: list[dict] = field(default_factory=list)
    wandb_run: Path | None = None
    run: dict | None = None

    @property
    def rule(self) -> str | None:
        arm = self.config.get("arm")
        return arm.get("rule") if isinstance(arm, dict) else None


@dataclass
class Experiment:
    name: str
    path: Path
    arms: list[Arm]
    timing: dict | None = None  # timing.json (the interleaved per-step rollout timing), when present


def _numbered_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON Lines file; each must be a JSON object."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ReportError(f"{path}: cannot read ({err.strerror})") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ReportError(f"{path}:{lineno}: malformed JSON ({err.msg}, column {err.colno})") from None
        if not isinstance(row, dict):
            raise ReportError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append((lineno, row))
    return rows


def read_jsonl(path: Path) -> list[dict]:
    """The objects of a JSON Lines file; blank lines are skipped, anything else must be a JSON object."""
    return [row for _, row in _numbered_jsonl(path)]


def read_metrics(path: Path) -> list[dict]:
    """``metrics.jsonl`` rows sorted by step; every row needs an integer ``step``."""
    numbered = _numbered_jsonl(path)
    for lineno, row in numbered:
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise ReportError(f"{path}:{lineno}: 'step' must be an integer, got {step!r}")
    return sorted((row for _, row in numbered), key=lambda r: r["step"])


def read_yaml(path: Path) -> dict:
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ReportError(f"{where}: malformed YAML ({getattr(err, 'problem', None) or err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def read_eval(path: Path) -> dict:
    """``eval.json``: ``before`` / ``after`` (accuracy, ci_low, ci_high, n) and ``tau``; any may be absent."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(data).__name__}")
    for part in ("before", "after"):
        if part in data and data[part] is not None and not isinstance(data[part], dict):
            raise ReportError(f"{path}: '{part}' must be an object with accuracy, ci_low, ci_high, n")
    return data


def _wandb_run_path(pointer: Path) -> Path | None:
    """The run folder a ``wandb_run`` file names: absolute, or relative to the arm folder, else to the
    working directory; ``run.dir`` (the run's ``files/`` folder) is taken as its run folder."""
    text = pointer.read_text().strip()
    if not text:
        return None
    path = Path(text)
    if not path.is_absolute() and (pointer.parent / path).exists():
        path = pointer.parent / path
    if path.name == "files" and any(path.parent.glob("run-*.wandb")):
        path = path.parent
    return path.resolve() if path.exists() else path


def load_arm(folder: Path) -> Arm:
    """One ``outputs/<experiment>/<arm>/`` folder."""
    config = read_yaml(folder / "config.yaml") if (folder / "config.yaml").is_file() else {}
    arm_cfg = config.get("arm")
    name = arm_cfg.get("name") if isinstance(arm_cfg, dict) and arm_cfg.get("name") else folder.name
    wandb_run = _wandb_run_path(folder / "wandb_run") if (folder / "wandb_run").is_file() else None
    run = None
    if (folder / "metrics.jsonl").is_file():
        rows = read_metrics(folder / "metrics.jsonl")
    elif wandb_run is not None and wandb_run.is_dir():
        wrun = read_wandb_run(wandb_run)
        rows, run = history_to_metrics(wrun.history), wrun.identity()
    else:
        raise ReportError(f"{folder / 'metrics.jsonl'}: no such file (and no wandb_run to read instead)")
    return Arm(
        name=str(name),
        path=folder,
        config=config,
        rows=rows,
        eval=read_eval(folder / "eval.json") if (folder / "eval.json").is_file() else None,
        samples=read_jsonl(folder / "samples.jsonl") if (folder / "samples.jsonl").is_file() else [],
        wandb_run=wandb_run,
        run=run,
    )


def _arms_from_wandb(run_dirs: list[Path]) -> list[Arm]:
    arms = []
    for wrun in merge_runs([read_wandb_run(d) for d in run_dirs]):
        arm_cfg = wrun.config.get("arm")
        name = (arm_cfg.get("name") if isinstance(arm_cfg, dict) else None) or wrun.job_type or wrun.name
        arms.append(
            Arm(
                name=str(name or wrun.id),
                path=wrun.path,
                config=wrun.config,
                rows=history_to_metrics(wrun.history),
                wandb_run=wrun.path,
                run=wrun.identity(),
            )
        )
    return arms


def order_arms(arms: list[Arm], order: list[str] | None = None) -> list[Arm]:
    """Arms in ``order`` (names) where given; the rest strict first, then by name."""
    order = order or []
    rank = {name: i for i, name in enumerate(order)}

    def key(arm: Arm):
        strict = arm.rule == "strict" or arm.name == "strict"
        return (rank.get(arm.name, len(order)), not strict, arm.name)

    return sorted(arms, key=key)


def _declared_order(folder: Path, arms: list[Arm]) -> list[str]:
    """Arm names in the order an experiment config lists them: ``<experiment>/config.yaml`` or any arm's
    resolved config, under ``arms:`` (a list of names or of mappings with ``name``)."""
    configs = [read_yaml(folder / "config.yaml")] if (folder / "config.yaml").is_file() else []
    for cfg in [*configs, *(a.config for a in arms)]:
        listed = cfg.get("arms")
        if isinstance(listed, list):
            names = [a.get("name") if isinstance(a, dict) else a for a in listed]
            return [str(n) for n in names if n is not None]
    return []


def _unique_names(arms: list[Arm]) -> None:
    seen: dict[str, int] = {}
    for arm in arms:
        seen[arm.name] = seen.get(arm.name, 0) + 1
    for arm in arms:
        if seen[arm.name] > 1:
            arm.name = f"{arm.name} ({arm.run['id'] if arm.run else arm.path.name})"


def load_experiment(path: str | Path) -> Experiment:
    """An experiment folder (one sub-folder per arm), a wandb run folder, or a folder of wandb runs."""
    folder = Path(path)
    if not folder.exists():
        raise ReportError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise ReportError(f"{folder}: not a folder")
    if is_run_dir(folder):
        arms = _arms_from_wandb([folder])
    else:
        subdirs = sorted(p for p in folder.iterdir() if p.is_dir() and p.name != REPORT_DIR)
        arm_dirs = [d for d in subdirs if any((d / f).exists() for f in ARM_FILES)]
        if arm_dirs:
            arms = [load_arm(d) for d in arm_dirs]
        else:
            runs = find_run_dirs(folder)
            if not runs:
                raise ReportError(
                    f"{folder}: no arms (no sub-folder with metrics.jsonl, config.yaml or wandb_run, "
                    "and no wandb run folders)"
                )
            arms = _arms_from_wandb(runs)
    _unique_names(arms)
    arms = order_arms(arms, _declared_order(folder, arms))
    names = [a.config.get("experiment") for a in arms] + [a.run.get("group") if a.run else None for a in arms]
    name = next((str(n) for n in names if n), folder.name)
    return Experiment(name=name, path=folder, arms=arms, timing=read_timing(folder))


TIMING_FILE = "timing.json"


def read_timing(folder: Path) -> dict | None:
    """``timing.json`` of the experiment (in ``folder``, or its parent for one seed's folder), or None;
    ReportError naming the file when it is not the shape ``marsrl train`` writes."""
    for path in (folder / TIMING_FILE, folder.parent / TIMING_FILE):
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
            arms = data["arms"]
            ok = all(len(v["seconds"]) == len(v["tokens"]) for v in arms.values())
        except (ValueError, KeyError, TypeError) as err:
            raise ReportError(f"{path}: not a timing file ({type(err).__name__}: {err})") from err
        if not ok:
            raise ReportError(f"{path}: an arm's seconds and tokens differ in length")
        return data
    return None
