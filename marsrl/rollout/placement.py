"""Where a rollout worker runs: the device its configured ``device`` resolves to given the GPUs Ray
granted its process, and the memory cap of a fractional GPU. Pure functions (the CUDA probe is an
argument), so tests cover every case on a CPU machine.

Why the GPU count matters: Ray 2.60 no longer hides CUDA devices from an actor that asked for none
(``ray/_private/accelerators/accelerator.py``), so ``"auto"`` alone would put every zero-GPU actor on
cuda:0 beside the trainer, outside Ray's accounting.

Leaves out: choosing a GPU index (Ray sets CUDA_VISIBLE_DEVICES; the actor uses its device 0).
"""

from __future__ import annotations

import torch


def resolve_device(device: str, num_gpus: float | None, cuda_available: bool) -> tuple[str, str | None]:
    """The device a worker uses, and why when it is not what ``device`` alone would say.

    Args:
        device: WorkerConfig.device ("auto", "cpu" or "cuda").
        num_gpus: GPUs Ray reserved for this process (PoolConfig.num_gpus_per_actor); None for a process
            Ray does not manage (an in-process worker, LocalPool): then "auto" means cuda when visible.
        cuda_available: ``torch.cuda.is_available()`` in this process.

    Returns ``("cpu" | "cuda", reason)``; ``reason`` is None unless "auto" was resolved to the CPU
    although CUDA is visible, or "cpu" leaves a reserved GPU idle (a warning for the caller to log).
    Raises ValueError for "cuda" with no GPU reserved (naming num_gpus_per_actor), for "cuda" without a
    visible device, and for GPUs reserved where this process sees none (a CPU-only torch).
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if num_gpus is not None and num_gpus < 0:
        raise ValueError(f"num_gpus must be None or >= 0, got {num_gpus}")
    if device == "cuda" and num_gpus == 0:
        raise ValueError(
            "worker.device is 'cuda' but num_gpus_per_actor is 0: Ray reserved no GPU for the actor, so it "
            "would load onto cuda:0 outside Ray's accounting. Set num_gpus_per_actor > 0 (or device 'cpu')"
        )
    if device != "cpu" and num_gpus and not cuda_available:
        raise ValueError(
            f"num_gpus_per_actor is {num_gpus:g} but torch sees no CUDA device in the actor "
            f"(torch {torch.__version__}: a CPU-only build?)"
        )
    if device == "cuda" and not cuda_available:
        raise ValueError("device='cuda' but no CUDA device is visible to this process")
    if device == "auto":
        if not cuda_available:
            return "cpu", None
        if num_gpus == 0:
            return "cpu", (
                "worker.device 'auto' resolved to cpu: num_gpus_per_actor is 0, so Ray reserved no GPU for "
                "the actor (set num_gpus_per_actor > 0 to roll out on CUDA)"
            )
        return "cuda", None
    if device == "cpu" and num_gpus:
        return "cpu", (
            f"worker.device is 'cpu' with num_gpus_per_actor {num_gpus:g}: the reserved GPU stays idle "
            "(set num_gpus_per_actor 0, or device 'auto')"
        )
    return device, None


def gpu_memory_fraction(device: str, num_gpus: float | None) -> float | None:
    """The share of its GPU's memory a worker may allocate: ``num_gpus`` when it is a fraction (0 < g < 1)
    on cuda, else None (no cap). Several actors with fractional GPUs share one device; without a cap
    the first to grow its KV cache takes everything."""
    if device == "cuda" and num_gpus is not None and 0 < num_gpus < 1:
        return float(num_gpus)
    return None


def apply_gpu_share(device: str, num_gpus: float | None) -> float | None:
    """Cap this process's CUDA allocations at ``gpu_memory_fraction`` (on the current device, which Ray
    made the actor's granted GPU). Returns the fraction set, or None."""
    fraction = gpu_memory_fraction(device, num_gpus)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction)
    return fraction
