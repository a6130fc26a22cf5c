"""The rollout worker: one SpeculativeEngine with its target (the policy) and drafter, the weights
version it holds, and sleep / wake for sharing a device with a trainer. A plain class: the Ray actor
(``actor.py``) is a thin shell around it, and tests build it without Ray.

Device: ``placement.resolve_device`` from ``config.device`` and the GPUs Ray granted the process
(``num_gpus``; None outside Ray): "auto" with 0 GPUs is the CPU (``info()["device_reason"]`` says why), a
fractional GPU caps this process's CUDA memory at that fraction.

Sleep / wake (``sleep(level)``, ``wake()``):
- On GPU, level 1 copies every parameter into page-locked host memory (one flat buffer per dtype,
  asynchronous copies, one synchronisation) and frees the device copy (``empty_cache``); ``wake`` copies
  them back the same way. The pinned buffer (the models' size) is kept after ``wake`` for the next
  level-1 sleep, since page-locking it is the slow part; level 2 frees it. Level 2 drops the parameters:
  after ``wake`` the worker refuses to generate until ``update_weights`` (what a colocated trainer sends
  anyway). Buffers (RoPE tables, vocab maps) stay.
- On CPU host memory IS the device: level 1 moves the parameters out of the modules into a stored state
  (nothing is freed, nothing copied: the point is the same life cycle as on GPU); level 2 frees them.
KV caches exist only inside a ``generate`` call, so there is nothing else to release.

Leaves out: tensor / pipeline parallel targets (one process holds the whole target), LoRA adapters.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..engine import SpeculativeEngine, Trajectory
from ..prompts import check_prompts
from .config import WorkerConfig
from .placement import apply_gpu_share, resolve_device
from .requests import RolloutRequest
from .weights import StateSpec, copy_pairs_, match_state, state_spec, to_state_dict

_EMBED_KEY = "embed_tokens.weight"
_TOTAL_KEYS = ("target_forwards", "draft_forwards", "drafted", "accepted", "relaxed", "rounds", "tokens")


class RolloutWorker:
    """Generate rollouts with the weights it was last sent, and say which version produced them.

    Args:
        config: what to load and how the engine runs (WorkerConfig).
        target: an already-built causal LM to use instead of ``config.target`` (taken over, not copied:
            ``update_weights`` writes into it).
        drafter: an Eagle3Drafter (or any object with ``propose``) instead of ``config.drafter``.
        num_gpus: GPUs Ray reserved for this process (the pool passes ``num_gpus_per_actor``); None for
            a process Ray does not manage. Decides what device "auto" means (``placement.py``).
    """

    def __init__(
        self, config: WorkerConfig | None = None, *, target=None, drafter=None, num_gpus: float | None = None
    ):
        self.config = config = config or WorkerConfig()
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        device, self.device_reason = resolve_device(config.device, num_gpus, torch.cuda.is_available())
        self.device = torch.device(device)
        self.gpu_memory_fraction = apply_gpu_share(device, num_gpus)
        target_src = target if target is not None else config.target
        drafter_src = drafter if drafter is not None else config.drafter
        self.target_name, self.drafter_name = source_name(target_src), source_name(drafter_src)
        self.target = load_target(target_src, self.device, config.dtype)
        self.drafter = load_drafter(drafter_src, self.target, self.target_name, config.dtype)
        self.engine = SpeculativeEngine(self.target, self.drafter, config.engine)
        self.version = 0  # weights as loaded; update_weights sets it
        has_head = isinstance(self.drafter, nn.Module)
        self._specs = {
            "policy": state_spec(self.target),
            "draft": state_spec(self.drafter, self._draft_skip()) if has_head else None,
        }
        self._stored: dict[tuple[str, str], torch.Tensor] | None = None
        self._pinned: dict[tuple[str, str], torch.Tensor] | None = None  # CUDA sleep's host buffer views
        self._shapes: dict[tuple[str, str], torch.Size] = {}
        self._asleep = False
        self._missing: set[str] = set()  # weights to be sent before generating (after a level-2 wake)
        self._totals = dict.fromkeys(("calls", "requests", "trajectories", "wall_seconds", *_TOTAL_KEYS), 0)
        self._totals["wall_seconds"] = 0.0
        self._last_engine_stats: dict = {}

    # ------------------------------------------------------------------ generation
    def generate(
        self, requests: RolloutRequest | Sequence[RolloutRequest], expect_version: int | None = None
    ) -> list[Trajectory]:
        """Run each request as one engine call; trajectories concatenated in request order, each grouped
        by prompt (a prompt's n completions consecutive) and stamped with ``policy_version``.

        ``expect_version``: refuse to run (RuntimeError) unless the worker holds exactly this version,
        so a worker that missed a weight update can never return trajectories under a wrong version."""
        if isinstance(requests, RolloutRequest):
            requests = [requests]
        self._check_ready(expect_version)
        start = time.perf_counter()
        out: list[Trajectory] = []
        for req in requests:
            prompts = check_prompts(
                req.prompt_ids, self.engine.vocab_size, self.engine.max_seq_len, f"request {req.request_id}"
            )
            trajs = self.engine.generate(prompts, req.sampling)
            for t in trajs:
                t.policy_version = self.version
            out.extend(trajs)
            self._last_engine_stats = dict(self.engine.stats)
            for key in _TOTAL_KEYS:
                self._totals[key] += self.engine.stats.get(key, 0)
            self._totals["requests"] += 1
        self._totals["calls"] += 1
        self._totals["trajectories"] += len(out)
        self._totals["wall_seconds"] += time.perf_counter() - start
        return out

    # ------------------------------------------------------------------ weights
    def update_weights(self, policy=None, draft=None, version: int | None = None) -> dict:
        """Load new policy (target) and/or draft weights in place and set the version.

        ``policy`` / ``draft``: a state dict, an nn.Module, a DeepSpeed engine or a PackedState (see
        ``to_state_dict``); keys must match exactly (a tied alias may be omitted). A drafter sharing the
        target's embedding takes it from the policy: an ``embed_tokens.weight`` in ``draft`` is then
        ignored. ``version``: what trajectories record from now on (default: current + 1). Returns
        metrics: ``bytes`` received (as sent, before any cast here) and their ``received_dtypes``."""
        if self._asleep:
            raise RuntimeError("the worker is asleep: call wake() before update_weights()")
        start = time.perf_counter()
        pairs = []  # both checked before either is written: a refused update changes nothing
        if policy is not None:
            pairs += match_state(self.target, to_state_dict(policy), f"policy (target {self.target_name})")
        if draft is not None:
            if not isinstance(self.drafter, nn.Module):
                raise ValueError("draft weights were sent but this worker has no drafter module")
            what = f"draft ({self.drafter_name})"
            pairs += match_state(self.drafter, to_state_dict(draft), what, skip=self._draft_skip())
        received = sorted({str(src.dtype).removeprefix("torch.") for _, src in pairs})
        copied = copy_pairs_(pairs)
        self._missing -= {name for name, w in (("policy", policy), ("draft", draft)) if w is not None}
        self.version = self.version + 1 if version is None else int(version)
        seconds = time.perf_counter() - start
        return {"version": self.version, "bytes": copied, "received_dtypes": received, "seconds": seconds}

    def weight_spec(self) -> dict[str, StateSpec | None]:
        """What ``update_weights`` loads, per side ("policy", "draft"; None: no drafter module): every
        key's shape and dtype, tied aliases, ignored keys. A pool casts and trims weights to it before
        sending them."""
        return dict(self._specs)

    # ------------------------------------------------------------------ memory
    def sleep(self, level: int = 1) -> dict:
        """Release the models' parameters (see the module docstring). Returns {"released_bytes": ...}."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 (keep weights in host memory) or 2 (drop), got {level}")
        if self._asleep:
            return {"released_bytes": 0}
        owned = {}  # parameters with storage of their own (the shared embedding is the target's)
        for key, param in self._parameters():
            self._shapes[key] = param.shape
            if not (key == ("drafter", _EMBED_KEY) and self._embedding_shared()):
                owned[key] = param
        released = sum(p.numel() * p.element_size() for p in owned.values())
        if level == 2:
            self._stored = self._pinned = None
        elif self.device.type == "cuda":
            layout = {key: (p.shape, p.dtype) for key, p in owned.items()}
            if self._pinned is None or {k: (v.shape, v.dtype) for k, v in self._pinned.items()} != layout:
                self._pinned = None  # free the old buffer before pinning a new one
                self._pinned = host_views(layout, pin=True)
            for key, param in owned.items():
                self._pinned[key].copy_(param.data, non_blocking=True)
            torch.cuda.synchronize(self.device)  # the host copy is complete before device memory goes
            self._stored = dict(self._pinned)
        else:
            self._stored = {key: param.data for key, param in owned.items()}  # host memory is the device
        for _, param in self._parameters():
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self._asleep = True
        return {"released_bytes": released}

    def wake(self) -> dict:
        """Give the models their parameters back (after level 2: uninitialised until update_weights)."""
        if not self._asleep:
            return {"restored_bytes": 0}
        restored = 0
        for key, param in self._parameters():
            if key == ("drafter", _EMBED_KEY) and self._embedding_shared():
                continue  # re-shared from the target below
            kept = self._stored.get(key) if self._stored is not None else None
            if kept is None:
                param.data = torch.empty(self._shapes[key], dtype=param.dtype, device=self.device)
            elif kept.device == self.device:
                param.data = kept
                restored += kept.numel() * kept.element_size()
            else:  # from the pinned buffer, asynchronously; synchronised once below
                param.data = torch.empty(kept.shape, dtype=kept.dtype, device=self.device)
                param.data.copy_(kept, non_blocking=True)
                restored += kept.numel() * kept.element_size()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the pinned buffer may be reused by the next sleep
        if self._embedding_shared():
            self.drafter.share_embedding(self.target)
        if self._stored is None:
            self._missing = {"policy"} | ({"draft"} if isinstance(self.drafter, nn.Module) else set())
        self._stored = None
        self._asleep = False
        return {"restored_bytes": restored}

    # ------------------------------------------------------------------ reporting
    def info(self) -> dict:
        """What a pool needs to check prompts before sending them, and to name the models."""
        return {
            "vocab_size": self.engine.vocab_size,
            "max_seq_len": self.engine.max_seq_len,
            "rule": self.engine.config.rule if self.drafter is not None else "strict",
            "theta": self.engine.config.theta,
            "target": self.target_name,
            "drafter": self.drafter_name,
            "device": str(self.device),
            "device_reason": self.device_reason,
            "gpu_memory_fraction": self.gpu_memory_fraction,
            "pid": os.getpid(),
        }

    def stats(self) -> dict:
        """Totals since start (calls, requests, trajectories, tokens, forwards, drafted / accepted /
        relaxed, rounds, wall_seconds), the last engine call's stats, version, asleep."""
        return {
            **self._totals,
            "version": self.version,
            "asleep": self._asleep,
            "pid": os.getpid(),
            "last": dict(self._last_engine_stats),
        }

    # ------------------------------------------------------------------ pieces
    def _check_ready(self, expect_version: int | None) -> None:
        if self._asleep:
            raise RuntimeError("the worker is asleep: call wake() before generate()")
        if self._missing:
            raise RuntimeError(
                f"the worker woke from sleep(level=2) without weights: send {sorted(self._missing)} "
                "with update_weights() first"
            )
        if expect_version is not None and expect_version != self.version:
            raise RuntimeError(f"the worker holds weights version {self.version}, expected {expect_version}")

    def _parameters(self):
        """(("target" | "drafter", name), Parameter) for every parameter, tied ones once."""
        for prefix, module in (("target", self.target), ("drafter", self.drafter)):
            if isinstance(module, nn.Module):
                for name, param in module.named_parameters():
                    yield (prefix, name), param

    def _embedding_shared(self) -> bool:
        return bool(getattr(self.drafter, "embedding_shared", False))

    def _draft_skip(self) -> tuple[str, ...]:
        return (_EMBED_KEY,) if self._embedding_shared() else ()


# ---------------------------------------------------------------------- loading and checking
def source_name(source) -> str | None:
    """How messages name a model: its path / hub id, or the module's ``name_or_path`` / class."""
    if source is None:
        return None
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    cfg = getattr(source, "config", None)
    name = getattr(cfg, "name_or_path", None) or getattr(cfg, "_name_or_path", None)
    kind = "module" if isinstance(source, nn.Module) else "object"
    return f"{type(source).__name__}({name})" if name else f"<{type(source).__name__} {kind}>"


def host_views(layout: dict, pin: bool) -> dict:
    """Host tensors for ``layout`` (key -> (shape, dtype)) laid back to back in one flat buffer per dtype,
    page-locked when ``pin`` (CUDA only): one allocation per dtype instead of one per tensor, and
    device <-> host copies that run asynchronously at full bus speed. Returns key -> view (its shape)."""
    sizes: dict[torch.dtype, int] = {}
    for shape, dtype in layout.values():
        sizes[dtype] = sizes.get(dtype, 0) + torch.Size(shape).numel()
    flat = {dtype: torch.empty(n, dtype=dtype, pin_memory=pin) for dtype, n in sizes.items()}
    offsets = dict.fromkeys(sizes, 0)
    views = {}
    for key, (shape, dtype) in layout.items():
        n = torch.Size(shape).numel()
        views[key] = flat[dtype][offsets[dtype] : offsets[dtype] + n].view(shape)
        offsets[dtype] += n
    return views


def load_target(source, device: torch.device, dtype: str) -> nn.Module:
    """A causal LM from a folder / hub id (AutoModelForCausalLM) or a module, on ``device``, in eval mode."""
    if source is None:
        raise ValueError("no target: set WorkerConfig.target to a folder or hub id, or pass a module")
    if isinstance(source, nn.Module):
        model = source
    elif isinstance(source, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(str(source), dtype=_torch_dtype(dtype) or "auto")
        except OSError as err:
            raise FileNotFoundError(
                f"target {str(source)!r} is neither a local model folder nor fetchable from the hub: {err}"
            ) from err
    else:
        raise TypeError(f"target must be a path, a hub id or an nn.Module, got {type(source).__name__}")
    if _torch_dtype(dtype) is not None:
        model.to(_torch_dtype(dtype))
    return model.to(device).eval()


def load_drafter(source, target: nn.Module, target_name: str | None, dtype: str):
    """None, an EAGLE-3 head from a folder / hub id, an Eagle3Drafter module, or a ``propose`` object;
    checked against the target first (ValueError naming both)."""
    from ..drafter import Eagle3Drafter

    if source is None or hasattr(source, "propose"):
        return source
    if isinstance(source, Eagle3Drafter):
        check_drafter_matches(target.config, source.config, target_name, source_name(source))
        drafter = source.to(next(target.parameters()).device)
        if _torch_dtype(dtype) is not None:
            drafter.to(_torch_dtype(dtype))
        if drafter.embedding_shared:  # pickling (Ray) or a copy broke the sharing: share again
            drafter.share_embedding(target)
        return drafter.eval()
    if isinstance(source, (str, os.PathLike)):
        from ..drafter.checkpoint import read_config, resolve_folder

        folder = resolve_folder(source)
        check_drafter_matches(target.config, read_config(folder), target_name, str(source))
        return Eagle3Drafter.from_pretrained(folder, target=target, dtype=_torch_dtype(dtype)).eval()
    raise TypeError(
        "drafter must be None, a path, a hub id, an Eagle3Drafter or have propose(), "
        f"got {type(source).__name__}"
    )


def check_drafter_matches(target_config, drafter_config, target_name, drafter_name) -> None:
    """The drafter's vocabulary, feature width and feature layers against the target's config.
    Raises ValueError naming both models and every mismatch."""
    tcfg = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    problems = []
    if drafter_config.vocab_size != tcfg.vocab_size:
        problems.append(
            f"vocab_size: the drafter's is {drafter_config.vocab_size}, the target's {tcfg.vocab_size}"
        )
    if drafter_config.target_hidden_size != tcfg.hidden_size:
        problems.append(
            f"hidden size: the drafter reads target features of width {drafter_config.target_hidden_size}, "
            f"the target's hidden_size is {tcfg.hidden_size}"
        )
    aux = drafter_config.aux_layer_ids
    layers = getattr(tcfg, "num_hidden_layers", None)
    if aux is not None and layers is not None and max(aux) > layers:
        problems.append(f"feature layers {aux} do not exist in a target with {layers} decoder layers")
    if problems:
        raise ValueError(
            f"drafter {drafter_name!r} does not match target {target_name!r}: " + "; ".join(problems)
        )


def check_sources_match(target, drafter) -> None:
    """Driver-side check before any actor starts: reads only the configs (AutoConfig for a target
    path or hub id, config.json for a head). Objects with ``propose`` and None are not checked."""
    from ..drafter import Eagle3Drafter

    if drafter is None or hasattr(drafter, "propose") or target is None:
        return
    if isinstance(target, nn.Module):
        tcfg = target.config
    else:
        from transformers import AutoConfig

        tcfg = AutoConfig.from_pretrained(str(target))
    dcfg = drafter.config if isinstance(drafter, Eagle3Drafter) else _read_head_config(drafter)
    check_drafter_matches(tcfg, dcfg, source_name(target), source_name(drafter))


def _read_head_config(source):
    """An EAGLE-3 head's config from a local folder, or config.json alone from the hub."""
    from ..drafter.checkpoint import CONFIG_FILE, read_config

    path = Path(str(source)).expanduser()
    if path.is_dir():
        return read_config(path)
    from huggingface_hub import hf_hub_download

    try:
        return read_config(Path(hf_hub_download(str(source), CONFIG_FILE)).parent)
    except Exception as err:  # offline, missing, gated: all mean "cannot check it from here"
        raise FileNotFoundError(
            f"EAGLE-3 head {str(source)!r} is neither a local folder nor fetchable from the hub ({err})"
        ) from err


def _torch_dtype(name: str) -> torch.dtype | None:
    return None if name == "auto" else getattr(torch, name)
