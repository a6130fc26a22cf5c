"""One bf16 actor with a ``propose()`` drafter and a request timeout, fed by an fp32 trainer: the drafter
reaches the actor (same tau and trajectories as in-process, where it was once dropped for plain
sampling), weights arrive in the worker's dtype and give the trajectories the old fp32 path gave, and an
actor that hangs mid-request is killed, replaced with the latest weights and its requests re-run with
nothing lost or duplicated. One pool serves all three (an actor start is the expensive part here)."""

import copy
import threading

import pytest
import torch

from marsrl.engine import OracleDrafter, SamplingParams
from marsrl.rollout import PoolConfig, RolloutPool, RolloutWorker, WorkerConfig, to_state_dict
from marsrl.rollout.pool import batch_metrics
from tests.rollout.helpers import StallOnce, record, tiny_qwen3

pytestmark = pytest.mark.usefixtures("ray_cluster")

WORKER = WorkerConfig(dtype="bfloat16", torch_threads=1)  # strict, K = 7
TIMEOUT_S = 3.0  # a request here takes ~0.1 s; the stalled one sleeps 600 s
CONFIG = PoolConfig(
    worker=WORKER, num_actors=1, num_cpus_per_actor=0.5, prompts_per_request=1, request_timeout_s=TIMEOUT_S
)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9, 10]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=17, n=2, seed=5)  # prefill + 2 rounds of K + 1


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The fp32 trainer's target, the drafter (an oracle of its greedy answers, stalling when armed),
    the arming file and the pool."""
    target = tiny_qwen3(seed=3)
    armed = tmp_path_factory.mktemp("stall") / "armed"
    drafter = StallOnce(OracleDrafter.from_target(target, PROMPTS, GREEDY.max_new_tokens), armed)
    pool = RolloutPool(CONFIG, target=target, drafter=drafter)
    yield target, drafter, armed, pool
    pool.shutdown()


def in_process(target, drafter, requests, version):
    worker = RolloutWorker(WORKER, target=copy.deepcopy(target), drafter=drafter)
    worker.version = version
    return [t for r in requests for t in worker.generate(r)]


def records(trajs):
    return [record(t) for t in trajs]


def test_a_propose_drafter_reaches_the_actors(world):
    target, drafter, _, pool = world
    assert pool.info["drafter"] == "<StallOnce object>"
    out = pool.generate(PROMPTS, GREEDY)
    expected = in_process(target, drafter, pool.plan(PROMPTS, GREEDY), pool.version)
    assert records(out) == records(expected)
    tau = batch_metrics(expected, 1.0)["tau"]
    assert pool.last_batch["tau"] == tau > 2  # 1.0 if the drafter were dropped


def test_weights_arrive_in_the_workers_dtype(world):
    target, drafter, _, pool = world
    new = copy.deepcopy(target)  # the fp32 trainer after a step
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    sync = pool.update_weights(new)
    assert sync["received_dtypes"] == ["bfloat16"]
    fp32_bytes = sum(t.numel() * t.element_size() for t in new.state_dict().values())
    assert sync["sent_bytes"] == sync["bytes"] == fp32_bytes // 2
    # the old path: the fp32 state dict sent as is and cast inside the worker's copy
    old = RolloutWorker(WORKER, target=copy.deepcopy(target), drafter=drafter)
    old.update_weights(to_state_dict(new), version=pool.version)
    reqs = pool.plan(PROMPTS, GREEDY)
    assert records(pool.generate(PROMPTS, GREEDY)) == records(t for r in reqs for t in old.generate(r))


def test_a_hung_actor_is_replaced_and_its_request_rerun(world):
    *_, armed, pool = world
    reqs = pool.plan(PROMPTS, GREEDY)
    baseline = records(pool.generate(PROMPTS, GREEDY))  # the same batch without the stall
    before = pool.stats()
    armed.write_text("")
    out = pool.generate(PROMPTS, GREEDY)
    assert not armed.exists(), "the drafter never stalled"
    assert records(out) == baseline
    assert [t.prompt_ids for t in out] == [p for p in PROMPTS for _ in range(GREEDY.n)]  # each once, in order
    after = pool.stats()
    assert after["timeouts"] == before["timeouts"] + 1 and after["restarts"] == before["restarts"] + 1
    assert pool.last_batch["timeouts"] == 1 and {t.policy_version for t in out} == {pool.version}
    timeouts = [e for e in pool.events if e["kind"] == "timeout"]
    assert [(e["request"], e["seconds"]) for e in timeouts] == [(0, TIMEOUT_S)]
    assert [e["cause"] for e in pool.events if e["kind"] == "replaced"] == ["timeout"]
    assert sorted(e["request"] for e in pool.events if e["kind"] == "done") == [r.request_id for r in reqs]
    assert [e["attempt"] for e in pool.events if e["kind"] == "dispatch" and e["request"] == 0] == [1, 2]


def test_a_drafter_that_cannot_be_pickled_is_refused(world):
    target = world[0]

    class Locked:  # propose() but a lock inside: it cannot travel to an actor
        lock = None

        def __init__(self):
            self.lock = threading.Lock()

        def propose(self, sequences, k):
            raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"^drafter <Locked object> cannot be sent to the rollout actors: it"):
        RolloutPool(CONFIG, target=target, drafter=Locked())
    with pytest.raises(TypeError, match=r"drafter must be a path, .* or an object with propose"):
        RolloutPool(CONFIG, target=target, drafter=42)
