"""Where a rollout worker runs, on a CPU machine: the pure resolution of device x GPUs granted x CUDA
visible, the memory cap of a fractional GPU, a worker that sees CUDA but was granted no GPU (CPU, and
it says why), and a pool asked for "cuda" with no GPU refused before anything starts."""

import pytest
import torch

from marsrl.rollout import PoolConfig, RolloutPool, RolloutWorker, WorkerConfig
from marsrl.rollout.placement import apply_gpu_share, gpu_memory_fraction, resolve_device
from tests.rollout.helpers import tiny_qwen3


@pytest.mark.parametrize(
    ("device", "num_gpus", "cuda", "expected", "reason"),
    [
        ("auto", None, True, "cuda", None),  # not a Ray actor: what is visible
        ("auto", None, False, "cpu", None),
        ("auto", 0.0, True, "cpu", "num_gpus_per_actor is 0"),  # the audit's cuda:0 pile-up, now cpu
        ("auto", 0.0, False, "cpu", None),
        ("auto", 1.0, True, "cuda", None),
        ("auto", 0.25, True, "cuda", None),
        ("cpu", 0.0, True, "cpu", None),
        ("cpu", 1.0, True, "cpu", "the reserved GPU stays idle"),
        ("cuda", 1.0, True, "cuda", None),
        ("cuda", None, True, "cuda", None),
    ],
)
def test_resolve_device(device, num_gpus, cuda, expected, reason):
    got, why = resolve_device(device, num_gpus, cuda)
    assert got == expected
    assert (why is None) if reason is None else (reason in why)


@pytest.mark.parametrize(
    ("device", "num_gpus", "cuda", "message"),
    [
        ("cuda", 0.0, True, r"'cuda' but num_gpus_per_actor is 0: .*Set num_gpus_per_actor > 0"),
        ("cuda", 0.0, False, "num_gpus_per_actor is 0"),
        ("cuda", None, False, "no CUDA device is visible"),
        ("auto", 1.0, False, "num_gpus_per_actor is 1 but torch sees no CUDA device"),
        ("gpu", None, True, "device must be"),
    ],
)
def test_resolve_device_refuses(device, num_gpus, cuda, message):
    with pytest.raises(ValueError, match=message):
        resolve_device(device, num_gpus, cuda)


def test_fractional_gpus_cap_the_memory(monkeypatch):
    fractions = [gpu_memory_fraction("cuda", g) for g in (None, 0.0, 0.5, 1.0, 2.0)]
    assert fractions == [None, None, 0.5, None, None]
    assert gpu_memory_fraction("cpu", 0.5) is None
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device=None: calls.append(f))
    assert apply_gpu_share("cuda", 0.25) == 0.25 and apply_gpu_share("cuda", 1.0) is None
    assert calls == [0.25]


def test_a_worker_granted_no_gpu_runs_on_the_cpu_and_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CUDA visible, as Ray 2.60 leaves it
    worker = RolloutWorker(WorkerConfig(torch_threads=1), target=tiny_qwen3(layers=1), num_gpus=0.0)
    info = worker.info()
    assert info["device"] == "cpu" and "num_gpus_per_actor is 0" in info["device_reason"]
    assert info["gpu_memory_fraction"] is None
    assert next(worker.target.parameters()).device.type == "cpu"


def test_a_pool_asked_for_cuda_without_gpus_is_refused_before_starting():
    cfg = PoolConfig(worker=WorkerConfig(device="cuda"), num_actors=1)
    with pytest.raises(ValueError, match="num_gpus_per_actor is 0"):
        RolloutPool(cfg, target=tiny_qwen3(layers=1))


def test_request_timeout_is_validated():
    assert PoolConfig().request_timeout_s is None
    assert PoolConfig.from_dict({"request_timeout_s": 30}).request_timeout_s == 30.0
    with pytest.raises(ValueError, match=r"request_timeout_s must be None \(no timeout\) or > 0, got 0"):
        PoolConfig(request_timeout_s=0)
