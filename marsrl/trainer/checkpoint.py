"""Whole-checkpoint manifests: the completion marker a trainer writes last into each checkpoint folder
records every other file's size and SHA-256, so a resume can tell a whole checkpoint from one that was
cut short (no marker), truncated on disk, or lost a file after the save.

``write_manifest`` is called once every file of the checkpoint is on disk; ``check_manifest`` returns
None for a whole checkpoint or one line saying what is wrong. A marker written before manifests existed
(``{"step": N}`` only) is reported as unverifiable, not trusted."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHECKPOINT_COMPLETE = "marsrl_complete.json"  # written last: a checkpoint without it was cut short
_CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks (a checkpoint's weights do not fit in memory twice)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    skip = lambda p: p.name == CHECKPOINT_COMPLETE or p.name.endswith(".tmp")  # noqa: E731
    return sorted(p for p in folder.rglob("*") if p.is_file() and not skip(p))


def write_manifest(folder: str | Path, step: int) -> dict:
    """Write ``folder/marsrl_complete.json`` (atomically, last) listing every file under ``folder`` with
    its size and SHA-256; returns what it wrote."""
    folder = Path(folder)
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": file_digest(p)}
        for p in _files(folder)
    }
    manifest = {"step": int(step), "files": files}
    marker = folder / CHECKPOINT_COMPLETE
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, marker)
    return manifest


def check_manifest(folder: str | Path) -> str | None:
    """None when ``folder`` holds its marker and every file the marker lists, with the recorded size and
    hash; otherwise one line naming the first fault. Sizes are checked for every file before any hash is
    computed, so a truncated file is found without reading the rest."""
    folder = Path(folder)
    marker = folder / CHECKPOINT_COMPLETE
    if not marker.is_file():
        return f"{folder}: no {CHECKPOINT_COMPLETE} (the save did not finish)"
    try:
        manifest = json.loads(marker.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{folder}: {CHECKPOINT_COMPLETE} lists no files (unreadable, or written without a manifest)"
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            return f"{folder}: {name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{folder}: {name} has {size} bytes, the manifest recorded {entry['size']}"
    for name, entry in files.items():
        if file_digest(folder / name) != entry["sha256"]:
            return f"{folder}: {name} does not match its recorded SHA-256"
    return None


def checkpoint_step(folder: str | Path) -> int:
    """The global step in a ``checkpoint-<step>`` folder's name."""
    return int(Path(folder).name.split("-")[-1])
