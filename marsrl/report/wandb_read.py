"""Read finished (offline or synced) wandb run folders without a server: a run's identity, config,
history and summary, and its history as ``metrics.jsonl`` rows.  Logging a report back into the runs
is ``wandb_log``'s.

wandb 0.31 has no local datastore API and offline runs write no ``wandb-summary.json``, so
``run-<id>.wandb`` is parsed here directly (``marsrl report`` reads such folders as an experiment's
arms: ``docs/experiment.md``, "What a run writes"): a 7-byte header (``:W&B``, magic 0xBEE1
little-endian, version), then 32 KiB blocks of chunks, each a 7-byte header (crc32 u32, length u16,
type u8: 1 full, 2 first, 3 middle, 4 last) and its data; a block's last < 7 bytes are zero padding.
Each assembled record is a ``wandb.proto.wandb_internal_pb2.Record``.  Departures: CRCs are not
checked, and a truncated final chunk (a run still writing, or killed) ends the log instead of raising.
A run is ``finished`` once its log holds the exit record.  wandb's service writes the log
asynchronously: right after ``run.finish()`` returns, the file can still hold only its header (seen for
~0.1 s after the first run of a process), so a reader of a run that just ended passes ``wait_s``.  Pure
Python, no subprocess: ``wandb leet inspect --json`` gives the same records but takes over a second per
run.

A run resumed offline (``wandb_log``) is a second ``offline-run-*-<id>`` folder beside the original;
``read_wandb_runs`` merges such folders back by id.
"""

from __future__ import annotations

import json
import math
import re
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import ReportError, finite

_IDENT = b":W&B"
_MAGIC = 0xBEE1
_FILE_HEADER = 7
_BLOCK = 32 * 1024
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def is_run_dir(path: Path) -> bool:
    """A wandb run folder: it holds a ``run-<id>.wandb`` transaction log."""
    return path.is_dir() and any(path.glob("run-*.wandb"))


def named_for_run(folder_name: str, run_id: str) -> bool:
    """Whether a run folder's name is wandb's for ``run_id``: ``[offline-]run-YYYYMMDD_HHMMSS-<id>``, or
    the same with ``-<n>`` appended, which wandb adds when a folder of that name exists already (a run
    resumed within the second it started in)."""
    pattern = rf"(offline-)?run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?"
    return re.fullmatch(pattern, folder_name) is not None


def find_run_dirs(folder: Path) -> list[Path]:
    """wandb run folders directly under ``folder`` or under ``folder/wandb``, oldest first (by name:
    ``offline-run-YYYYMMDD_HHMMSS-<id>``)."""
    found = []
    for parent in (folder, folder / "wandb"):
        if parent.is_dir():
            found += [d for d in parent.iterdir() if d.name != "latest-run" and is_run_dir(d)]
    return sorted(found, key=lambda d: d.name.split("run-", 1)[-1])


def _log_path(run_dir: Path) -> Path:
    logs = sorted(run_dir.glob("run-*.wandb"))
    if not logs:
        raise ReportError(f"{run_dir}: not a wandb run folder (no run-*.wandb file)")
    return logs[0]


def iter_record_bytes(path: Path) -> Iterator[bytes]:
    """The serialized records of one ``.wandb`` log (the chunked block format in the module docstring)."""
    data = path.read_bytes()
    if len(data) < _FILE_HEADER or data[:4] != _IDENT or struct.unpack("<H", data[4:6])[0] != _MAGIC:
        raise ReportError(f"{path}: not a wandb transaction log (bad header)")
    pos, pending = _FILE_HEADER, b""
    while True:
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:  # zero padding to the block end
            pos += left
        if pos + _CHUNK_HEADER > len(data):
            return
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        pos += _CHUNK_HEADER
        if kind == 0 and length == 0:  # zero-filled tail: nothing more was written
            return
        if pos + length > len(data):  # truncated last chunk
            return
        chunk = data[pos : pos + length]
        pos += length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""
        else:
            raise ReportError(f"{path}: corrupt chunk (type {kind}) at byte {pos - length - _CHUNK_HEADER}")


def iter_records(path: Path):
    """``wandb_internal_pb2.Record`` objects of one ``.wandb`` log, in the order they were written."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    for i, raw in enumerate(iter_record_bytes(path)):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(raw)
        except DecodeError:
            raise ReportError(f"{path}: record {i} does not decode") from None
        yield record


def _item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def _set_nested(target: dict, item, value) -> None:
    """Put an item's value at its key path: wandb 0.31 writes a logged media object (an image, a
    table) as one item per field, with the nested key ``[logged key, field]``; a metric is one level,
    ``["train/reward"]``."""
    keys = [item.key] if item.key else list(item.nested_key)
    for k in keys[:-1]:
        if not isinstance(target.get(k), dict):  # a later record replaced a scalar with an object
            target[k] = {}
        target = target[k]
    target[keys[-1]] = value


@dataclass
class WandbRun:
    """What a run folder holds: identity, config, every history row (keys as logged, including wandb's
    ``_step``, ``_runtime``, ``_timestamp``; a media value is a dict of its fields) and the last summary
    values."""

    path: Path
    id: str = ""
    project: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    folders: list[Path] = field(default_factory=list)
    finished: bool = False  # the log holds the exit record

    def identity(self) -> dict:
        return {
            "id": self.id,
            "project": self.project,
            "name": self.name,
            "group": self.group,
            "job_type": self.job_type,
            "tags": list(self.tags),
            "path": str(self.path),
            "finished": self.finished,
        }

    @property
    def last_step(self) -> int:
        steps = [h["_step"] for h in self.history if isinstance(h.get("_step"), int)]
        return max(steps, default=-1)


def read_wandb_run(run_dir: str | Path, wait_s: float = 0.0) -> WandbRun:
    """Parse one run folder's ``run-<id>.wandb``: run record, config updates, history and summary.

    ``wait_s``: re-read until the run is ``finished`` or this many seconds have passed (see the module
    docstring); 0 reads what is there now.
    """
    deadline = time.monotonic() + wait_s
    while True:
        run = _parse_run(Path(run_dir))
        if run.finished or time.monotonic() >= deadline:
            return run
        time.sleep(0.05)


def _parse_run(run_dir: Path) -> WandbRun:
    run = WandbRun(path=run_dir, folders=[run_dir])
    for record in iter_records(_log_path(run_dir)):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.id = run.id or r.run_id
            run.project = r.project or run.project
            run.name = r.display_name or run.name
            run.group = r.run_group or run.group
            run.job_type = r.job_type or run.job_type
            run.tags = list(r.tags) or run.tags
            for item in r.config.update:
                _set_nested(run.config, item, json.loads(item.value_json))
        elif kind == "config":
            for item in record.config.update:
                _set_nested(run.config, item, json.loads(item.value_json))
            for item in record.config.remove:
                run.config.pop(_item_key(item), None)
        elif kind == "history":
            row: dict = {}
            for item in record.history.item:
                _set_nested(row, item, json.loads(item.value_json))
            run.history.append(row)
        elif kind == "summary":
            for item in record.summary.update:
                _set_nested(run.summary, item, json.loads(item.value_json))
        elif kind == "exit":
            run.finished = True
    run.config.pop("_wandb", None)
    return run


def read_wandb_history(run_dir: str | Path, wait_s: float = 0.0) -> list[dict]:
    """The history rows of one run folder, as logged (with wandb's ``_step``/``_runtime``/``_timestamp``)."""
    return read_wandb_run(run_dir, wait_s).history


def merge_runs(runs: list[WandbRun]) -> list[WandbRun]:
    """One record per run id: folders of the same run (an original and its offline resumptions) are
    joined in the given order; identity and config come from the first folder that has them."""
    merged: dict[str, WandbRun] = {}
    for run in runs:
        into = merged.get(run.id)
        if into is None:
            merged[run.id] = WandbRun(**{**run.__dict__, "history": list(run.history), "folders": [run.path]})
            continue
        for attr in ("project", "name", "group", "job_type"):
            setattr(into, attr, getattr(into, attr) or getattr(run, attr))
        into.tags = into.tags or run.tags
        into.config = into.config or run.config
        into.history += run.history
        into.summary.update(run.summary)
        into.folders.append(run.path)
        into.finished = run.finished
    return list(merged.values())


def read_wandb_runs(folder: str | Path) -> list[WandbRun]:
    """Every run under a folder of run folders (or ``folder/wandb``), merged by run id."""
    return merge_runs([read_wandb_run(d) for d in find_run_dirs(Path(folder))])


def _int_step(value: Any) -> int | None:
    if isinstance(value, bool) or not finite(value) or float(value) != int(value):
        return None
    return int(value)


def history_to_metrics(history: list[dict]) -> list[dict]:
    """History rows as ``metrics.jsonl`` rows: one per step (rows of a step merged), keys as logged.

    ``step`` is the row's own ``step``, else ``train/global_step`` (TRL's step metric), else wandb's
    ``_step``; ``wall_s`` the row's own, else ``_runtime``.  wandb's ``_*`` keys and non-numeric values
    (media, tables) are dropped; a row left with no metric is skipped.
    """
    merged: dict[int, dict] = {}
    for h in history:
        metrics = {
            k: v
            for k, v in h.items()
            if not k.startswith("_")
            and k not in ("step", "wall_s")
            and (v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)))
        }
        if not metrics:
            continue
        step = next(
            (
                s
                for s in map(_int_step, (h.get("step"), h.get("train/global_step"), h.get("_step")))
                if s is not None
            ),
            None,
        )
        if step is None:
            continue
        row = merged.setdefault(step, {"step": step})
        row.update(metrics)
        wall = h.get("wall_s") if finite(h.get("wall_s")) else h.get("_runtime")
        if finite(wall):
            row["wall_s"] = max(float(wall), row.get("wall_s", -math.inf))
    return [merged[s] for s in sorted(merged)]
