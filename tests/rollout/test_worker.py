"""RolloutWorker in-process (no Ray): it equals the engine, stamps versions, loads weights in place,
sleeps and wakes, and refuses mismatched models and stale versions with messages that name them."""

import copy

import pytest
import torch

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.rollout import RolloutWorker, WorkerConfig, plan_requests
from marsrl.rollout.worker import host_views
from tests.rollout.helpers import record, tiny_head, tiny_qwen3

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9], [10, 11]]
SAMPLING = SamplingParams(max_new_tokens=10, n=2, seed=3)
CONFIG = WorkerConfig(engine=EngineConfig(rule="mars", num_draft_tokens=3), torch_threads=1)


@pytest.fixture(scope="module")
def models():
    target = tiny_qwen3()
    return target, tiny_head(target)


def fresh(models, config=CONFIG):
    target, head = copy.deepcopy(models)
    return RolloutWorker(config, target=target, drafter=head)


def records(trajs):
    return [record(t) for t in trajs]


def test_each_request_equals_one_engine_call(models):
    worker = fresh(models)
    reqs = plan_requests(PROMPTS, SAMPLING, num_requests=2)
    out = worker.generate(reqs)
    target, head = copy.deepcopy(models)
    engine = SpeculativeEngine(target, head, CONFIG.engine)
    expected = []
    for r in reqs:
        trajs = engine.generate([list(p) for p in r.prompt_ids], r.sampling)
        for t in trajs:
            t.policy_version = 0
        expected += trajs
    assert records(out) == records(expected)
    assert len(out) == len(PROMPTS) * SAMPLING.n
    assert [t.prompt_ids for t in out[:2]] == [PROMPTS[0]] * 2  # a prompt's group is consecutive
    stats = worker.stats()
    assert stats["requests"] == 2 and stats["trajectories"] == 8 and stats["tokens"] == 80


def test_update_weights_changes_output_and_version(models):
    worker = fresh(models)
    before = worker.generate(plan_requests(PROMPTS, SAMPLING, num_requests=1))
    new_target = copy.deepcopy(models[0])
    with torch.no_grad():
        for p in new_target.parameters():
            p.add_(0.5 * torch.randn_like(p))
    new_head = Eagle3Drafter.from_target(new_target)
    metrics = worker.update_weights(new_target.state_dict(), draft=new_head, version=7)
    assert metrics["version"] == 7 and metrics["bytes"] > 0
    after = worker.generate(plan_requests(PROMPTS, SAMPLING, num_requests=1))
    assert {t.policy_version for t in after} == {7}
    assert [t.completion_ids for t in after] != [t.completion_ids for t in before]
    reference = RolloutWorker(CONFIG, target=copy.deepcopy(new_target), drafter=copy.deepcopy(new_head))
    reference.version = 7
    assert records(after) == records(reference.generate(plan_requests(PROMPTS, SAMPLING, num_requests=1)))
    assert worker.update_weights()["version"] == 8  # default: current + 1


def test_drafter_shares_the_updated_embedding(models):
    worker = fresh(models)
    new = copy.deepcopy(models[0])
    with torch.no_grad():
        new.model.embed_tokens.weight.mul_(-1.0)
    worker.update_weights(new)
    assert torch.equal(worker.drafter.embed_tokens.weight, new.model.embed_tokens.weight)


def test_bad_weights_name_the_keys(models):
    worker = fresh(models)
    state = models[0].state_dict()
    missing = {k: v for k, v in state.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"missing model\.norm\.weight, unexpected none"):
        worker.update_weights(missing)
    with pytest.raises(ValueError, match=r"unexpected extra\.weight"):
        worker.update_weights({**state, "extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"wrong shapes .*model\.norm\.weight \(3,\) vs \(32,\)"):
        worker.update_weights({**state, "model.norm.weight": torch.zeros(3)})
    assert worker.version == 0  # nothing was loaded
    wrapped = {"module." + k: v for k, v in state.items()}  # DDP / DeepSpeed prefixes are stripped
    assert worker.update_weights(wrapped)["version"] == 1


def test_a_refused_update_changes_nothing(models):
    worker = fresh(models)
    req = plan_requests(PROMPTS, SAMPLING, num_requests=1)
    before = records(worker.generate(req))
    new_target = copy.deepcopy(models[0])
    with torch.no_grad():
        new_target.lm_head.weight.mul_(-1.0)
    bad_draft = {k: v for k, v in models[1].state_dict().items() if k != "fc.weight"}
    with pytest.raises(ValueError, match=r"draft .* missing fc\.weight"):
        worker.update_weights(new_target, draft=bad_draft)
    assert worker.version == 0 and records(worker.generate(req)) == before


def test_expected_version_is_enforced(models):
    worker = fresh(models)
    req = plan_requests(PROMPTS, SAMPLING, num_requests=1)
    worker.generate(req, expect_version=0)
    with pytest.raises(RuntimeError, match="holds weights version 0, expected 3"):
        worker.generate(req, expect_version=3)


def test_sleep_and_wake(models):
    worker = fresh(models)
    req = plan_requests(PROMPTS, SAMPLING, num_requests=1)
    before = records(worker.generate(req))
    released = worker.sleep()["released_bytes"]
    assert released > 0 and worker.stats()["asleep"]
    assert all(p.numel() == 0 for p in worker.target.parameters())
    with pytest.raises(RuntimeError, match="asleep"):
        worker.generate(req)
    with pytest.raises(RuntimeError, match="asleep"):
        worker.update_weights(models[0].state_dict())
    assert worker.wake()["restored_bytes"] == released
    assert records(worker.generate(req)) == before

    worker.sleep(level=2)
    worker.wake()
    with pytest.raises(RuntimeError, match=r"send \['draft', 'policy'\]"):
        worker.generate(req)
    worker.update_weights(copy.deepcopy(models[0]).state_dict(), draft=copy.deepcopy(models[1]), version=0)
    assert records(worker.generate(req)) == before


def test_mismatched_drafter_names_both(models, tmp_path):
    other = tiny_qwen3(vocab=80)
    head = Eagle3Drafter.from_target(other)
    with pytest.raises(
        ValueError, match=r"drafter '<Eagle3Drafter module>' does not match target .*vocab_size"
    ):
        RolloutWorker(CONFIG, target=copy.deepcopy(models[0]), drafter=head)
    head.save_pretrained(tmp_path / "head")
    models[0].save_pretrained(tmp_path / "target")
    cfg = WorkerConfig(target=str(tmp_path / "target"), drafter=str(tmp_path / "head"))
    with pytest.raises(
        ValueError, match=r"drafter '.*head' does not match target '.*target': vocab_size: the dr"
    ):
        RolloutWorker(cfg)


def test_loads_from_folders(models, tmp_path):
    target, head = copy.deepcopy(models)
    target.save_pretrained(tmp_path / "target")
    head.save_pretrained(tmp_path / "head")
    cfg = WorkerConfig(
        target=str(tmp_path / "target"), drafter=str(tmp_path / "head"), engine=CONFIG.engine, torch_threads=1
    )
    from_disk = RolloutWorker(cfg)
    req = plan_requests(PROMPTS, SAMPLING, num_requests=1)
    assert records(from_disk.generate(req)) == records(fresh(models).generate(req))
    info = from_disk.info()
    assert info["vocab_size"] == 64 and info["max_seq_len"] == 128 and info["rule"] == "mars"
    assert info["target"].endswith("target") and info["drafter"].endswith("head")


def test_missing_target_is_a_clear_error():
    with pytest.raises(ValueError, match="no target"):
        RolloutWorker(WorkerConfig())
    with pytest.raises(FileNotFoundError, match="neither a local model folder nor fetchable"):
        RolloutWorker(WorkerConfig(target="/nonexistent/model-folder"))


def test_sleep_buffers_round_trip():
    """The host layout a CUDA sleep copies into (page-locked there; here, without CUDA, not pinned): one
    flat buffer per dtype, every tensor back exactly, whatever its dtype or shape."""
    tensors = {
        ("target", "a"): torch.randn(3, 4),
        ("target", "b"): torch.randn(5).to(torch.bfloat16),
        ("target", "c"): torch.randn(2, 2, 2),
        ("drafter", "d2t"): torch.arange(6).view(2, 3),
        ("drafter", "scale"): torch.tensor(1.5),
        ("drafter", "t2d"): torch.tensor([True, False, True]),
    }
    views = host_views({k: (v.shape, v.dtype) for k, v in tensors.items()}, pin=False)
    for key, tensor in tensors.items():
        views[key].copy_(tensor)
    for key, tensor in tensors.items():
        assert views[key].dtype == tensor.dtype and torch.equal(views[key], tensor), key
    storages = {views[k].untyped_storage().data_ptr() for k in views}
    assert len(storages) == 4  # float32, bfloat16, int64, bool
