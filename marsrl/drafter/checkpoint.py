"""Reading and writing EAGLE-3 head folders: locating the folder (local or hub), ``config.json``, the
weight files (safetensors, sharded safetensors, or a plain-tensor ``pytorch_model.bin``), and the key
spellings of the different releases.

Weights are read without executing code: safetensors, or ``torch.load(weights_only=True)``, which
refuses a pickle that carries anything but tensors and containers.

Leaves out: building the module and checking it against a target (``eagle3.py`` does both).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .config import Eagle3Config

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
HUB_PATTERNS = ["*.json", "*.safetensors", "*.bin"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_folder(path_or_hub_id: str | os.PathLike) -> Path:
    """A local folder as is; otherwise a hub id ("owner/name") fetched with ``snapshot_download``.

    Raises FileNotFoundError naming the path or id when neither works (e.g. offline)."""
    path = Path(path_or_hub_id).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path} is a file; pass the folder holding config.json and the weights")
    name = str(path_or_hub_id)
    if not _HUB_ID.match(name):
        raise FileNotFoundError(f"EAGLE-3 head folder not found: {name}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=name, allow_patterns=HUB_PATTERNS))
    # The hub raises many error types (offline, missing repo, gated, network); all mean the same here.
    except Exception as err:
        raise FileNotFoundError(
            f"EAGLE-3 head {name!r} is neither a local folder nor fetchable from the Hugging Face hub "
            f"({type(err).__name__}: {err}). Download it first (`hf download {name}`) or pass a "
            "local folder."
        ) from err


def read_config(folder: Path) -> Eagle3Config:
    """Parse ``folder/config.json`` (either published layout)."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {CONFIG_FILE}")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    return Eagle3Config.from_hf_dict(d, source=str(path))


def read_weights(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """All tensors of the head on the CPU, and the file(s) they came from (for messages).

    Looks for model.safetensors, then model.safetensors.index.json (shards), then pytorch_model.bin."""
    single = folder / SAFETENSORS_FILE
    if single.is_file():
        return load_file(str(single)), str(single)
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        return _read_sharded(index), str(index)
    pickled = folder / BIN_FILE
    if pickled.is_file():
        return _read_bin(pickled), str(pickled)
    raise FileNotFoundError(f"{folder}: no {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {BIN_FILE}")


def _read_sharded(index: Path) -> dict[str, torch.Tensor]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{index}: not a safetensors index with a weight_map ({err})") from err
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        for key, tensor in load_file(str(index.parent / shard)).items():
            if key in out:
                raise ValueError(f"{index}: key {key!r} appears in more than one shard")
            out[key] = tensor
    return out


def _read_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"refusing to load {path}: it is not a plain tensor pickle (torch.load with weights_only=True "
            f"rejected it: {err})"
        ) from err
    if not isinstance(sd, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()
    ):
        raise ValueError(f"{path}: expected a flat state dict of name -> tensor")
    return sd


def normalize_keys(tensors: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Rename keys to ours: drop a leading ``model.``; vLLM's ``layers.0.`` -> ``midlayer.``."""
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for key, tensor in tensors.items():
        new = key.removeprefix("model.")
        if new.startswith("layers.0."):
            new = "midlayer." + new[len("layers.0.") :]
        if new in out:
            raise ValueError(f"{source}: keys {origin[new]!r} and {key!r} both mean {new!r}")
        out[new] = tensor
        origin[new] = key
    return out


def write_checkpoint(folder: str | os.PathLike, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (tensors must be CPU, contiguous, unshared)."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(path / SAFETENSORS_FILE), metadata={"format": "pt"})
    return path
