"""Checkpoint manifests: a checkpoint is trusted only when every file its marker lists is there with the
recorded size and SHA-256; resume falls back to the newest whole one and says why in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marsrl.experiment.run import ExperimentError, latest_checkpoint
from marsrl.trainer.checkpoint import CHECKPOINT_COMPLETE, check_manifest, write_manifest


def _checkpoint(root: Path, step: int) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 40 + bytes([step]))
    (folder / "optimizer.pt").write_bytes(b"adam" * 100)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 6}))
    (folder / "sub").mkdir()
    (folder / "sub" / "shard.bin").write_bytes(b"x" * 10)
    write_manifest(folder, step)
    return folder


def test_a_whole_checkpoint_passes_and_lists_every_file(tmp_path):
    folder = _checkpoint(tmp_path, 2)
    assert check_manifest(folder) is None
    listed = set(json.loads((folder / CHECKPOINT_COMPLETE).read_text())["files"])
    assert listed == {"model.safetensors", "optimizer.pt", "trainer_state.json", "sub/shard.bin"}


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (
            lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:5000]),
            "bytes",
        ),
        (lambda f: (f / "optimizer.pt").unlink(), "optimizer.pt is missing"),
        (lambda f: (f / "sub" / "shard.bin").unlink(), "shard.bin is missing"),
        (lambda f: (f / "optimizer.pt").write_bytes(b"adaM" * 100), "SHA-256"),  # same size, other bytes
        (lambda f: (f / CHECKPOINT_COMPLETE).write_text(json.dumps({"step": 2})), "lists no files"),
        (lambda f: (f / CHECKPOINT_COMPLETE).unlink(), "did not finish"),
    ],
    ids=[
        "truncated-weights",
        "missing-optimizer",
        "listed-file-gone",
        "same-size-other-bytes",
        "marker-without-manifest",
        "no-marker",
    ],
)
def test_a_damaged_checkpoint_is_named(tmp_path, damage, named):
    folder = _checkpoint(tmp_path, 2)
    damage(folder)
    fault = check_manifest(folder)
    assert fault is not None and named in fault and "\n" not in fault


def test_resume_falls_back_to_the_newest_whole_checkpoint(tmp_path):
    _checkpoint(tmp_path, 2)
    newest = _checkpoint(tmp_path, 4)
    (tmp_path / "checkpoint-6").mkdir()  # a save killed half way: no marker, skipped quietly
    lines: list[str] = []
    assert latest_checkpoint(tmp_path, lines.append) == newest and lines == []
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert latest_checkpoint(tmp_path, lines.append) == tmp_path / "checkpoint-2"
    assert len(lines) == 1 and "checkpoint-4" in lines[0] and "model.safetensors" in lines[0]


def test_no_whole_checkpoint_is_one_error_naming_the_folder(tmp_path):
    for step in (2, 4):
        (_checkpoint(tmp_path, step) / "optimizer.pt").unlink()
    with pytest.raises(ExperimentError, match=str(tmp_path)) as err:
        latest_checkpoint(tmp_path, lambda line: None)
    assert "\n" not in str(err.value)
    assert latest_checkpoint(tmp_path / "nothing-saved-yet", lambda line: None) is None
