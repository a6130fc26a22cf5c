"""RolloutPool on the session's Ray cluster: Ray adds and loses nothing (pool == in-process worker for the
same planned requests), killed actors are replaced with every trajectory returned exactly once, new
weights change the output and the version, bad input fails before any work, shutdown leaves nothing."""

import copy
import subprocess
import sys
import threading
import time

import pytest
import ray
import torch

from marsrl.config import ConfigError
from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, SamplingParams
from marsrl.rollout import (
    PoolConfig,
    RolloutError,
    RolloutPool,
    RolloutRequest,
    RolloutWorker,
    WorkerConfig,
    plan_requests,
)
from tests.rollout.helpers import record, tiny_head, tiny_qwen3

pytestmark = pytest.mark.usefixtures("ray_cluster")

WORKER = WorkerConfig(engine=EngineConfig(rule="mars", num_draft_tokens=3), torch_threads=1)
CONFIG = PoolConfig(worker=WORKER, num_actors=2, num_cpus_per_actor=0.5, max_attempts=3)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9], [10, 11], [12, 13, 14]]
SAMPLING = SamplingParams(max_new_tokens=10, n=3, seed=7)
LONG = SamplingParams(max_new_tokens=80, n=6, seed=8)  # ~1 s per request: long enough to kill mid-way


@pytest.fixture(scope="module")
def models():
    target = tiny_qwen3(max_positions=256)
    return target, tiny_head(target)


@pytest.fixture(scope="module")
def pool(models):
    target, head = models
    p = RolloutPool(CONFIG, target=target, drafter=head)
    yield p
    p.shutdown()


def in_process(models, requests, version=0):
    """The same planned requests through a RolloutWorker in this process."""
    target, head = copy.deepcopy(models)
    worker = RolloutWorker(WORKER, target=target, drafter=head)
    worker.version = version
    return [worker.generate(r) for r in requests]


def records(trajs):
    return [record(t) for t in trajs]


def flat(parts):
    return [t for part in parts for t in part]


def kinds(pool, kind, slot=None):
    return [e for e in pool.events if e["kind"] == kind and (slot is None or e["slot"] == slot)]


def kill_when(pool, predicate, delay=0.0, timeout=60.0):
    """Start a thread that kills the actor of the first event of the NEXT run matching ``predicate``
    (after ``delay``)."""
    run_id = pool.runs + 1

    def run():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = next((e for e in list(pool.events) if e["run"] == run_id and predicate(e)), None)
            if hit is not None:
                time.sleep(delay)
                killed.append((hit, [e["kind"] for e in pool.events if e["request"] == hit["request"]]))
                ray.kill(pool.actors[hit["slot"]])
                return
            time.sleep(0.005)

    killed: list = []
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, killed


def test_pool_equals_in_process_worker(pool, models):
    reqs = pool.plan(PROMPTS, SAMPLING)
    assert [len(r.prompt_ids) for r in reqs] == [3, 2]  # one request per actor
    out = pool.generate(PROMPTS, SAMPLING)
    assert len(out) == len(PROMPTS) * SAMPLING.n
    assert records(out) == records(flat(in_process(models, reqs, pool.version)))
    assert [t.prompt_ids for t in out] == [p for p in PROMPTS for _ in range(SAMPLING.n)]  # input order
    # fixed-size requests: more requests than actors, scheduled on whichever actor is idle
    small = plan_requests(PROMPTS, SAMPLING, prompts_per_request=1)
    assert records(flat(pool.run(small))) == records(flat(in_process(models, small, pool.version)))
    assert {e["slot"] for e in kinds(pool, "dispatch")} == {0, 1}
    metrics = pool.last_batch
    assert metrics["trajectories"] == 15 and metrics["tokens"] == sum(len(t.completion_ids) for t in out)


def test_resources_come_from_the_config(pool):
    table = ray.util.placement_group_table(pool.placement_group)
    assert table["strategy"] == "PACK"
    assert list(table["bundles"].values()) == [{"CPU": 0.5}, {"CPU": 0.5}]


def test_kill_before_the_batch_starts(pool, models):
    restarts = pool.stats()["restarts"]
    ray.kill(pool.actors[1])
    reqs = pool.plan(PROMPTS, SAMPLING)
    out = pool.generate(PROMPTS, SAMPLING)
    assert records(out) == records(flat(in_process(models, reqs, pool.version)))
    assert pool.stats()["restarts"] == restarts + 1
    assert [e["request"] for e in kinds(pool, "died")] == [1]
    assert [e["request"] for e in kinds(pool, "done")] == [0, 1]  # each request returned exactly once
    assert [e["attempt"] for e in kinds(pool, "dispatch") if e["request"] == 0] == [1]  # survivor untouched


def test_kill_mid_batch(pool, models):
    reqs = pool.plan(PROMPTS, LONG)
    expected = records(flat(in_process(models, reqs, pool.version)))
    thread, killed = kill_when(pool, lambda e: e["kind"] == "dispatch" and e["request"] == 0, delay=0.2)
    out = pool.generate(PROMPTS, LONG)
    thread.join()
    assert killed and killed[0][1] == ["dispatch"], "the actor must be killed while its request runs"
    assert records(out) == expected
    assert [e["request"] for e in kinds(pool, "died")] == [0]
    assert sorted(e["request"] for e in kinds(pool, "done")) == [0, 1]
    assert [e["attempt"] for e in kinds(pool, "dispatch") if e["request"] == 1] == [1]  # survivor kept


def test_kill_after_its_request_finished(pool, models):
    quick = plan_requests(PROMPTS[:2], SamplingParams(max_new_tokens=2, n=1, seed=1), num_requests=1)[0]
    slow = plan_requests(PROMPTS, LONG, num_requests=1)[0]
    reqs = [quick, RolloutRequest(1, slow.prompt_ids, slow.sampling, first_prompt=2)]
    expected = [records(part) for part in in_process(models, reqs, pool.version)]
    restarts = pool.stats()["restarts"]
    thread, killed = kill_when(pool, lambda e: e["kind"] == "done" and e["request"] == 0)
    out = pool.run(reqs)
    thread.join()
    assert killed, "the actor of request 0 was never killed"
    assert [records(part) for part in out] == expected
    assert kinds(pool, "died") == []  # its result was in: nothing re-run
    # the dead actor is found and replaced by the next batch, which still comes out right
    again = pool.generate(PROMPTS, SAMPLING)
    assert records(again) == records(flat(in_process(models, pool.plan(PROMPTS, SAMPLING), pool.version)))
    assert pool.stats()["restarts"] == restarts + 1


def test_update_weights_changes_output_and_version(pool, models):
    before = pool.generate(PROMPTS, SAMPLING)
    target = copy.deepcopy(models[0])
    with torch.no_grad():
        for p in target.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    head = Eagle3Drafter.from_target(target)
    old = pool.version
    try:
        sync = pool.update_weights(target, draft=head)
        assert sync["version"] == old + 1 == pool.version and sync["bytes"] > 0
        sizes = {k: t.numel() * t.element_size() for k, t in head.state_dict().items()}
        assert "embed_tokens.weight" in sizes  # the head shares it with the target: not sent again
        head_bytes = sum(sizes.values()) - sizes["embed_tokens.weight"]
        target_bytes = sum(t.numel() * t.element_size() for t in target.state_dict().values())
        assert sync["sent_bytes"] == sync["bytes"] == target_bytes + head_bytes
        after = pool.generate(PROMPTS, SAMPLING)
        assert {t.policy_version for t in after} == {old + 1}
        assert [t.completion_ids for t in after] != [t.completion_ids for t in before]
        expected = in_process((target, head), pool.plan(PROMPTS, SAMPLING), old + 1)
        assert records(after) == records(flat(expected))
        # a replacement actor gets the latest weights and version too
        ray.kill(pool.actors[0])
        assert records(pool.generate(PROMPTS, SAMPLING)) == records(flat(expected))
    finally:
        pool.update_weights(models[0], draft=models[1])  # back to the module's weights for other tests
    assert {t.policy_version for t in pool.generate(PROMPTS, SAMPLING)} == {old + 2}


def test_sleep_and_wake_every_actor(pool, models):
    before = records(pool.generate(PROMPTS, SAMPLING))
    assert pool.sleep()["released_bytes"] > 0
    assert all(s["asleep"] for s in pool.stats()["actors"])
    with pytest.raises(RolloutError, match=r"request [01] .*failed: RuntimeError: the worker is asleep"):
        pool.generate(PROMPTS, SAMPLING)
    pool.wake()
    assert records(pool.generate(PROMPTS, SAMPLING)) == before
    pool.sleep(level=2)  # weights dropped: the trainer sends them again after wake
    pool.wake()
    pool.update_weights(models[0], draft=models[1], version=pool.version)
    assert records(pool.generate(PROMPTS, SAMPLING)) == before


def test_a_request_that_keeps_failing_names_itself(pool):
    thread_stop = threading.Event()

    run_id = pool.runs + 1

    def killer():  # kill whichever actor takes request 0 in the next run, every time
        seen = 0
        while not thread_stop.is_set():
            events = list(pool.events)
            hits = [e for e in events if e["run"] == run_id and e["kind"] == "dispatch" and e["request"] == 0]
            if len(hits) > seen:
                seen = len(hits)
                ray.kill(pool.actors[hits[-1]["slot"]])
            time.sleep(0.005)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        with pytest.raises(
            RolloutError, match=r"request 0 \(prompts 0\.\.2 .*failed 3 times .*its actor died each time"
        ):
            pool.generate(PROMPTS, LONG)
    finally:
        thread_stop.set()
        thread.join()
    assert len(pool.generate(PROMPTS, SAMPLING)) == 15  # the pool is usable afterwards


def test_python_error_in_a_worker_is_not_retried(pool):
    bad = RolloutRequest(4, ((1, 2, 99),), SAMPLING, first_prompt=12)  # bypasses the driver's check
    with pytest.raises(RolloutError, match=r"request 4 \(prompts 12\.\.12.*outside the vocabulary"):
        pool.run([bad])
    assert [e["attempt"] for e in kinds(pool, "dispatch")] == [1]


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([], "non-empty list"),
        ([[1, 2], []], r"prompt_ids\[1\] is empty"),
        ([[1, 2], [3, 64]], r"prompt_ids\[1\] has token ids outside the vocabulary \[0, 64\)"),
        ([[1] * 300], "300 tokens; the model's context is 256"),
        (["a prompt"], "tokenize it first"),
    ],
)
def test_bad_input_fails_before_any_work(pool, prompts, message):
    calls = [s["calls"] for s in pool.stats()["actors"]]
    events = list(pool.events)
    with pytest.raises(ValueError, match=message):
        pool.generate(prompts, SAMPLING)
    assert [s["calls"] for s in pool.stats()["actors"]] == calls
    assert pool.events == events


def test_bad_config_fails_at_construction():
    with pytest.raises(ValueError, match="n must be >= 1"):
        SamplingParams(n=0)
    with pytest.raises(
        ConfigError, match=r"'rule' = 'lenient' does not match .*'strict', 'mars', 'mars_code'"
    ):
        PoolConfig.from_dict({"worker": {"engine": {"rule": "lenient"}}})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['num_actor'\]"):
        PoolConfig.from_dict({"num_actor": 2})
    cfg = PoolConfig.from_dict(
        {"num_actors": 2, "worker": {"engine": {"rule": "mars", "tree": {"top_k": 2}}}}
    )
    assert cfg.num_actors == 2 and cfg.worker.engine.tree.top_k == 2
    with pytest.raises(ValueError, match="num_actors must be >= 1"):
        PoolConfig(num_actors=0)


def test_mismatched_drafter_fails_at_pool_start(models, tmp_path):
    other = tiny_qwen3(vocab=80)
    head = Eagle3Drafter.from_target(other)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"drafter '<Eagle3Drafter module>' does not match target '<Qwen3"):
        RolloutPool(CONFIG, target=models[0], drafter=head)
    models[0].save_pretrained(tmp_path / "target")
    head.save_pretrained(tmp_path / "head")
    cfg = PoolConfig(worker=WorkerConfig(target=str(tmp_path / "target"), drafter=str(tmp_path / "head")))
    with pytest.raises(ValueError, match=r"drafter '.*head' does not match target '.*target'.*80.*64"):
        RolloutPool(cfg)
    assert time.monotonic() - start < 10  # fails in the driver: no actor was started


def test_an_actor_that_cannot_start_fails_the_pool_start(tmp_path):
    cfg = PoolConfig(
        worker=WorkerConfig(target=str(tmp_path / "missing")), num_actors=1, num_cpus_per_actor=0.5
    )

    def live_groups():
        return sum(g["state"] != "REMOVED" for g in ray.util.placement_group_table().values())

    before = live_groups()
    with pytest.raises(RolloutError, match=r"failed to start: .*missing' is neither a local model folder"):
        RolloutPool(cfg)
    assert live_groups() == before  # its placement group was removed: nothing left holding resources


def test_shutdown_leaves_no_processes(models):
    cfg = PoolConfig(worker=WorkerConfig(torch_threads=1), num_actors=1, num_cpus_per_actor=0.5)
    pool = RolloutPool(cfg, target=models[0])
    pids = [s["pid"] for s in pool.stats()["actors"]]
    assert len(pool.generate([[1, 2]], SamplingParams(max_new_tokens=3))) == 1
    pool.shutdown()
    pool.shutdown()  # idempotent
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)
    assert ray.is_initialized()  # the session's cluster was not the pool's to stop
    assert pool.actors == []
    with pytest.raises(RuntimeError, match="shut down"):
        pool.generate([[1, 2]])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


ATTACH = """
import sys
from marsrl.engine import SamplingParams
from marsrl.rollout import PoolConfig, RolloutPool, WorkerConfig
worker = WorkerConfig(target=sys.argv[2])
cfg = PoolConfig(worker=worker, num_actors=1, num_cpus_per_actor=0.5, address=sys.argv[1])
with RolloutPool(cfg) as pool:
    print(len(pool.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, n=2))))
"""


def test_attaches_to_a_running_cluster_by_address(models, tmp_path):
    models[0].save_pretrained(tmp_path / "target")
    address = ray.get_runtime_context().gcs_address
    cmd = [sys.executable, "-c", ATTACH, address, str(tmp_path / "target")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "2"
    assert ray.is_initialized() and ray.cluster_resources()["CPU"] == 2  # the cluster outlived the client
