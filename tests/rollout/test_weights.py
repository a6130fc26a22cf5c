"""Weights on their way to the workers: a real DeepSpeed ZeRO-3 engine (CPU, gloo, one rank) gathered
into a full state dict equal to the same training step done without DeepSpeed, and loaded into a
worker; key handling of state dicts; the packed form a pool sends (the worker's dtype, no ignored keys,
out-of-band buffers) against the old fp32 path."""

import copy
import pickle
import socket

import pytest
import torch

from marsrl.engine import SamplingParams
from marsrl.rollout import RolloutWorker, WorkerConfig, gather_zero3_state_dict, plan_requests, to_state_dict
from marsrl.rollout.weights import pack_state
from tests.rollout.helpers import record, tiny_head, tiny_qwen3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


@pytest.fixture
def zero3_env(monkeypatch, tmp_path):
    """One-rank gloo environment for DeepSpeed (cpu-stack.md); the process group is destroyed after."""
    for key, value in dict(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
    ).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import deepspeed

    # The CPU accelerator JIT-builds a shared-memory all-reduce op (~50 s here) that one rank never uses.
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", False)
    yield deepspeed
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_zero3_gather_equals_the_unsharded_step_and_feeds_a_worker(zero3_env):
    deepspeed = zero3_env
    start = tiny_qwen3(layers=2, seed=4)
    plain, sharded = copy.deepcopy(start), copy.deepcopy(start)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))

    opt = torch.optim.SGD(plain.parameters(), lr=0.5)
    _loss(plain, ids).backward()
    torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
    opt.step()

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "SGD", "params": {"lr": 0.5}},
        "gradient_clipping": 1.0,
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(model=sharded, model_parameters=sharded.parameters(), config=config)
    assert all(p.numel() == 0 for p in engine.module.parameters())  # really partitioned
    engine.backward(_loss(engine, ids))
    engine.step()

    gathered = gather_zero3_state_dict(engine)
    expected = plain.state_dict()
    assert set(gathered) == set(expected)
    for key, tensor in expected.items():
        assert gathered[key].shape == tensor.shape, key
        torch.testing.assert_close(gathered[key], tensor, rtol=0, atol=1e-6, msg=key)
    moved = [k for k in expected if not torch.equal(expected[k], start.state_dict()[k])]
    assert len(moved) > 10  # the step changed the weights, so the gather did not return stale ones
    assert all(p.numel() == 0 for p in engine.module.parameters())  # partitioned again afterwards

    # a worker fed the ZeRO-3 engine directly (to_state_dict gathers) equals one fed the gathered dict
    sampling = SamplingParams(max_new_tokens=8, n=2, seed=1)
    req = plan_requests([[1, 2, 3], [7, 8]], sampling, num_requests=1)
    via_engine = RolloutWorker(WorkerConfig(torch_threads=1), target=copy.deepcopy(start))
    via_engine.update_weights(engine, version=1)
    via_dict = RolloutWorker(WorkerConfig(torch_threads=1), target=copy.deepcopy(start))
    via_dict.update_weights(gathered, version=1)
    assert [record(t) for t in via_engine.generate(req)] == [record(t) for t in via_dict.generate(req)]


def test_to_state_dict_strips_wrappers_and_copies_to_cpu():
    model = tiny_qwen3(layers=2)
    wrapped = torch.nn.Module()
    wrapped.module = model  # what DDP / a DeepSpeed engine look like from outside
    state = to_state_dict(wrapped)
    assert set(state) == set(model.state_dict())
    assert to_state_dict({"module._orig_mod.a": torch.ones(2)}).keys() == {"a"}
    with pytest.raises(TypeError, match="not a tensor"):
        to_state_dict({"a": [1, 2]})


def test_tied_alias_may_be_omitted():
    model = tiny_qwen3(layers=2, tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    worker = RolloutWorker(WorkerConfig(), target=model)
    state = {k: v.clone() + 1.0 for k, v in model.state_dict().items() if k != "lm_head.weight"}
    worker.update_weights(state)
    assert torch.equal(worker.target.lm_head.weight, state["model.embed_tokens.weight"])


def test_pack_state_casts_trims_and_checks_before_sending():
    trainer = tiny_qwen3(layers=2, tie_word_embeddings=True)  # fp32, lm_head tied to the embedding
    worker = RolloutWorker(WorkerConfig(dtype="bfloat16"), target=copy.deepcopy(trainer))
    spec = worker.weight_spec()["policy"]
    packed = pack_state(trainer, spec, "policy")
    assert "lm_head.weight" not in packed.buffers  # the tied alias travels once, under its first name
    assert set(packed.buffers) == set(trainer.state_dict()) - {"lm_head.weight"}
    assert {str(d) for d in packed.dtypes.values()} == {"torch.bfloat16"}
    assert packed.nbytes == sum(
        t.numel() * 2 for k, t in trainer.state_dict().items() if k != "lm_head.weight"
    )
    # numpy buffers pickle out of band (what lets ray.put write them once and actors read them in place)
    buffers = []
    inline = pickle.dumps(packed, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == len(packed.buffers) and len(inline) < 20_000 < packed.nbytes
    back = pickle.loads(inline, buffers=buffers).tensors()
    assert all(torch.equal(back[k], v) for k, v in packed.tensors().items())
    bad = {k: v for k, v in trainer.state_dict().items() if k != "model.norm.weight"}
    with pytest.raises(
        ValueError, match=r"policy weights do not match the model: missing model\.norm\.weight"
    ):
        pack_state(bad, spec, "policy")
    with pytest.raises(ValueError, match=r"wrong shapes .*model\.norm\.weight \(3,\) vs \(32,\)"):
        pack_state({**trainer.state_dict(), "model.norm.weight": torch.zeros(3)}, spec, "policy")


def test_a_shared_drafter_embedding_is_not_sent():
    target = tiny_qwen3(layers=3)
    head = tiny_head(target)
    worker = RolloutWorker(WorkerConfig(), target=copy.deepcopy(target), drafter=copy.deepcopy(head))
    spec = worker.weight_spec()["draft"]
    assert spec.skip == {"embed_tokens.weight"}
    packed = pack_state(head, spec, "draft")
    assert "embed_tokens.weight" in head.state_dict() and "embed_tokens.weight" not in packed.buffers
    assert worker.update_weights(draft=packed)["bytes"] == packed.nbytes


def test_a_packed_sync_equals_the_old_fp32_path_bit_for_bit():
    """fp32 trainer -> bf16 worker: cast on the trainer's side before the send (new) vs sent as fp32 and
    cast inside the worker's copy (old): the same bf16 weights, the same trajectories."""
    start = tiny_qwen3(layers=2, seed=5)
    trainer = copy.deepcopy(start)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    cfg = WorkerConfig(dtype="bfloat16", torch_threads=1)
    old = RolloutWorker(cfg, target=copy.deepcopy(start))
    new = RolloutWorker(cfg, target=copy.deepcopy(start))
    assert old.update_weights(to_state_dict(trainer))["received_dtypes"] == ["float32"]
    sync = new.update_weights(pack_state(trainer, new.weight_spec()["policy"], "policy"))
    assert sync["received_dtypes"] == ["bfloat16"]
    for (name, a), b in zip(old.target.state_dict().items(), new.target.state_dict().values(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    req = plan_requests([[1, 2, 3], [7, 8]], SamplingParams(max_new_tokens=8, n=2, seed=1), num_requests=1)
    assert [record(t) for t in old.generate(req)] == [record(t) for t in new.generate(req)]
