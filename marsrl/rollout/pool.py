"""A pool of Ray rollout actors: cut a batch of prompts into requests, run them on the actors, put the
trajectories back in input order; send new weights once per update with a version every trajectory
records; replace an actor that dies and re-run exactly its unfinished request.

    pool = RolloutPool(PoolConfig(worker=WorkerConfig(target="Qwen/Qwen3-8B", drafter="my/eagle3"),
                                  num_actors=4, num_gpus_per_actor=1, num_cpus_per_actor=4))
    trajs = pool.generate(prompt_ids, SamplingParams(n=8, max_new_tokens=512, seed=step))
    ...  # train on trajs (behavior_logprobs, provenance, policy_version)
    pool.update_weights(policy_model, draft=drafter_model)       # version += 1
    pool.shutdown()

Scheduling. A batch is planned into requests (``requests.py``): one per actor by default, or fixed-size
ones (``prompts_per_request``). Each request is one engine call with its own seed, so its trajectories do
not depend on which actor runs it or how often it is re-run: a pool run equals running the same planned
requests through a RolloutWorker in-process, bit for bit. Idle actors take the next queued request; an
actor holds one request at a time, so when it dies exactly that request is unfinished.

Faults. A request whose actor dies (killed, crashed, out of memory), or that has no result
``request_timeout_s`` after dispatch (an actor alive but stuck: it is killed), is re-queued; the actor
is replaced in the same placement-group bundle, loaded with the latest weights, and takes work only once
that load has finished (so a replacement's start never counts against a request's timeout). Every
generate call carries the expected version, and a worker holding another version refuses. Results
already returned are kept, and a killed actor's late result is never read, so nothing is lost or
duplicated. After ``max_attempts`` deaths / timeouts on one request, or at once for a Python error raised
inside the worker, ``RolloutError`` names the request and the cause.

Models. ``target`` / ``drafter`` given as modules or ``propose`` objects are pickled into the object
store once and unpickled by every actor (one that does not pickle fails at once, naming it); paths are
loaded by each actor. Devices: see ``placement.py`` (0 GPUs per actor means the CPU; "cuda" with 0 GPUs
is refused before any actor starts).

Weights. ``update_weights`` packs a module / state dict / ZeRO-3 engine into exactly what the workers
load (``weights.pack_state`` against the workers' ``StateSpec``: cast to their dtypes, keys they ignore
left out, numpy buffers Ray stores out of band and actors read in place), checks it on the driver, puts
it in the Ray object store ONCE and hands every actor the reference. What stays alive afterwards is what
a replacement actor needs to reach the current version: the latest packed policy and the latest packed
draft (one object each, released before its successor is put) and the models given at construction.
On GPU a NCCL broadcast from the trainer (``ray.util.collective``) would replace the object-store hop;
not implemented.

Leaves out: several trainer processes sharing one pool (call it from one process; gather ZeRO-3 weights
on every rank with ``gather_zero3_state_dict`` and pass the dict from rank 0), timeouts on weight
updates / sleep / wake, continuous batching across requests.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import time
from collections import deque

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from torch import nn

from ..engine import SamplingParams, Trajectory
from ..prompts import check_prompts
from .actor import RolloutActor
from .config import PoolConfig
from .placement import resolve_device
from .requests import RolloutRequest, plan_requests
from .weights import pack_state
from .worker import check_sources_match, source_name

log = logging.getLogger(__name__)


def start_local_ray() -> None:
    """Start a Ray cluster on this machine for the pool's actors (no dashboard, Ray's INFO lines off the
    console, its warnings kept). Its actors run at niceness 0 unless ``RAY_worker_niceness`` says
    otherwise: at Ray's default of 15 a rollout actor starves behind any other process on the machine,
    the trainer it serves included, and its steps slow down by whatever else runs."""
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(include_dashboard=False, logging_level=logging.WARNING)


class RolloutError(RuntimeError):
    """A request that could not be completed, or actors that could not start (the message says which)."""


class RolloutPool:
    """N RolloutActors behind one ``generate`` / ``update_weights`` / ``sleep`` / ``wake`` interface.

    Args:
        config: PoolConfig (actors, resources, placement, the worker's models and engine).
        target, drafter: paths / hub ids, or already-built objects (a causal LM module; an Eagle3Drafter
            or any object with ``propose(sequences, k)``) to use instead of ``config.worker.target`` /
            ``drafter``: objects are put in the object store once and unpickled by every actor.
    """

    def __init__(self, config: PoolConfig | None = None, *, target=None, drafter=None):
        self.config = config = config or PoolConfig()
        target = target if target is not None else config.worker.target
        drafter = drafter if drafter is not None else config.worker.drafter
        if target is None:
            raise ValueError("no target: set config.worker.target (a folder or hub id) or pass target=")
        _check_source("target", target, allow_propose=False)
        _check_source("drafter", drafter, allow_propose=True)
        # "cuda" with no GPU reserved fails here, before any actor (the actors' CUDA is not ours to probe)
        resolve_device(config.worker.device, config.num_gpus_per_actor, cuda_available=True)
        check_sources_match(target, drafter)  # a mismatched head fails here, naming both, before any actor
        paths = {k: str(v) for k, v in (("target", target), ("drafter", drafter)) if _is_path(v)}
        self._worker_config = dataclasses.replace(config.worker, **paths)
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            if config.address:
                ray.init(address=config.address)
            else:
                start_local_ray()
        self.version = 0
        self.runs = 0  # run() calls so far
        self.events: list[dict] = []  # dispatch / done / died / timeout / replaced of the current run
        self._policy_ref = self._draft_ref = None
        self._restarts = self._retries = self._timeouts = 0
        self._loading: dict[int, tuple] = {}  # slot -> (ref, deadline) of a replacement still loading
        self._last: dict = {}
        self._pg = None
        self._actors: list = []
        self._model_args = (None, None)
        try:
            self._model_args = tuple(_put_model(w, m) for w, m in (("target", target), ("drafter", drafter)))
            self._pg = self._placement_group()
            self._actors = [self._start_actor(i) for i in range(config.num_actors)]
            infos = self._wait_started(self._actors)
            self._specs = ray.get(self._actors[0].weight_spec.remote(), timeout=config.start_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        # vocab_size, max_seq_len, rule, theta, target, drafter, device (+ why) (same on every actor)
        self.info = infos[0]
        if self.info.get("device_reason"):
            log.warning("rollout pool: %s", self.info["device_reason"])

    # ------------------------------------------------------------------ generation
    @property
    def num_actors(self) -> int:
        return len(self._actors)

    @property
    def placement_group(self):
        """The pool's placement group (one bundle per actor), or None."""
        return self._pg

    @property
    def actors(self) -> list:
        """The current actor handles (a replaced actor's slot holds its replacement)."""
        return list(self._actors)

    def plan(self, prompt_ids, sampling: SamplingParams) -> list[RolloutRequest]:
        """The requests ``generate`` runs for this batch (see ``requests.plan_requests``)."""
        if self.config.prompts_per_request is not None:
            return plan_requests(prompt_ids, sampling, prompts_per_request=self.config.prompts_per_request)
        return plan_requests(prompt_ids, sampling, num_requests=self.num_actors)

    def generate(self, prompt_ids, sampling: SamplingParams | None = None) -> list[Trajectory]:
        """Complete every prompt ``sampling.n`` times; trajectories grouped by prompt, in input order,
        each stamped with the weights version that produced it. Bad prompts raise ValueError before
        any work starts."""
        self._check_open()
        sampling = sampling or SamplingParams()
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        prompts = check_prompts(prompt_ids, self.info["vocab_size"], self.info["max_seq_len"])
        return [t for part in self.run(self.plan(prompts, sampling)) for t in part]

    def run(self, requests: list[RolloutRequest]) -> list[list[Trajectory]]:
        """Run planned requests on the actors; one list of trajectories per request, in request order."""
        self._check_open()
        start = time.perf_counter()
        self.runs += 1
        self.events = []
        timeout = self.config.request_timeout_s
        results: list[list[Trajectory] | None] = [None] * len(requests)
        attempts = [0] * len(requests)
        queue = deque(range(len(requests)))
        idle = deque(s for s in range(self.num_actors) if s not in self._loading)
        running: dict = {}  # ObjectRef -> (slot, position in requests, deadline or None)
        while queue or running:
            while queue and idle:
                slot, pos = idle.popleft(), queue.popleft()
                attempts[pos] += 1
                ref = self._actors[slot].generate.remote(requests[pos], self.version)
                running[ref] = (slot, pos, None if timeout is None else time.monotonic() + timeout)
                self._event("dispatch", slot, requests[pos], attempt=attempts[pos])
            loading = {ref: slot for slot, (ref, _) in self._loading.items()}
            deadlines = [d for *_, d in running.values() if d is not None]
            deadlines += [d for _, d in self._loading.values()]
            wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            ready, _ = ray.wait([*running, *loading], num_returns=1, timeout=wait_s)
            if not ready:  # a deadline passed
                self._expire(requests, running, attempts, queue)
                continue
            (ref,) = ready
            if ref in loading:
                self._loaded(loading[ref])
                idle.append(loading[ref])
                continue
            slot, pos, _ = running.pop(ref)
            try:
                results[pos] = ray.get(ref)
            except ray.exceptions.RayActorError as err:  # the actor died: replace it, re-queue the request
                self._event("died", slot, requests[pos], cause=_cause(err))
                self._replace(slot, "died")  # before any raise, so the pool stays usable
                self._retry(requests[pos], attempts[pos], _cause(err), err)
                queue.appendleft(pos)
                continue
            except ray.exceptions.RayTaskError as err:  # a Python error in the worker: not retried
                raise RolloutError(f"{requests[pos].describe()} failed: {_cause(err)}") from err
            self._event("done", slot, requests[pos])
            idle.append(slot)
        self._last = batch_metrics([t for part in results for t in part], time.perf_counter() - start)
        self._last["timeouts"] = sum(e["kind"] == "timeout" for e in self.events)
        return results

    def _expire(self, requests, running: dict, attempts: list[int], queue: deque) -> None:
        """Kill and replace the actor of every request past its deadline and re-queue the request; fail a
        replacement that is not loaded within start_timeout_s."""
        now = time.monotonic()
        for slot, (_, deadline) in list(self._loading.items()):
            if now >= deadline:
                self._loading.pop(slot)
                raise RolloutError(
                    f"the replacement actor in slot {slot} was not ready {self.config.start_timeout_s} s "
                    f"after it started (start_timeout_s); cluster resources: {ray.available_resources()}"
                )
        for ref, (slot, pos, deadline) in list(running.items()):
            if deadline is None or now < deadline:
                continue
            del running[ref]  # its late result, if any, is never read
            seconds = self.config.request_timeout_s
            self._timeouts += 1
            self._event("timeout", slot, requests[pos], seconds=seconds)
            self._replace(slot, "timeout")
            cause = f"no result {seconds:g} s after dispatch (request_timeout_s): the actor was killed"
            self._retry(requests[pos], attempts[pos], cause, None)
            queue.appendleft(pos)

    def _retry(self, request: RolloutRequest, attempts: int, cause: str, err) -> None:
        if attempts >= self.config.max_attempts:
            raise RolloutError(
                f"{request.describe()} failed {attempts} times (max_attempts={self.config.max_attempts}); "
                f"its actor died each time (a request past request_timeout_s counts as a death). "
                f"Last cause: {cause}"
            ) from err
        self._retries += 1

    def _loaded(self, slot: int) -> None:
        """A replacement's constructor and weight load finished: it may take work (or it failed)."""
        ref, _ = self._loading.pop(slot)
        try:
            ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
            raise RolloutError(
                f"the replacement actor in slot {slot} failed to start: {_cause(err)}"
            ) from err

    # ------------------------------------------------------------------ weights and memory
    def update_weights(self, policy=None, draft=None, version: int | None = None) -> dict:
        """Send policy and/or draft weights to every actor once (object store) and set the version
        trajectories record from now on (default: current + 1). ``policy`` / ``draft``: a state dict, an
        nn.Module or a DeepSpeed ZeRO-3 engine (gathered here: only valid with one trainer rank; with
        several, gather on every rank first). They are cast to the workers' dtypes and trimmed to the keys
        the workers load before the put; wrong keys or shapes raise ValueError here, before anything is
        sent or the version changes. Returns timing and size metrics."""
        self._check_open()
        start = time.perf_counter()
        version = self.version + 1 if version is None else int(version)
        if draft is not None and self._specs["draft"] is None:
            raise ValueError("draft weights were sent but the rollout actors have no drafter module")
        # both packed and checked against the workers' specs before anything is released or sent
        packed_policy = None if policy is None else pack_state(policy, self._specs["policy"], "policy")
        packed_draft = None if draft is None else pack_state(draft, self._specs["draft"], "draft")
        pack_s = time.perf_counter() - start
        sent_bytes = 0
        if packed_policy is not None:
            self._policy_ref = None  # the previous version's copy goes before this one is stored
            self._policy_ref = ray.put(packed_policy)
            sent_bytes += packed_policy.nbytes
        if packed_draft is not None:
            self._draft_ref = None
            self._draft_ref = ray.put(packed_draft)
            sent_bytes += packed_draft.nbytes
        del packed_policy, packed_draft  # the object store holds the only copy now
        put_s = time.perf_counter() - start
        self.version = version  # replacements started from now on load these
        policy_ref = self._policy_ref if policy is not None else None
        draft_ref = self._draft_ref if draft is not None else None
        calls = {
            slot: actor.update_weights.remote(policy_ref, draft_ref, version)
            for slot, actor in enumerate(self._actors)
        }
        received, failed = {"bytes": 0, "received_dtypes": []}, []
        for slot, ref in calls.items():
            try:
                received = ray.get(ref)
            except ray.exceptions.RayActorError:
                self._replace(slot, "died")  # the replacement loads the latest weights before any request
            except ray.exceptions.RayTaskError as err:  # nothing was loaded there (keys are checked first)
                failed.append(f"actor {slot}: {_cause(err)}")
        if failed:
            raise RolloutError(f"weights version {version} were refused: " + "; ".join(failed))
        return {
            "version": version,
            "seconds": time.perf_counter() - start,
            "pack_seconds": pack_s,  # cast + trim on the driver (included in put_seconds)
            "put_seconds": put_s,
            "sent_bytes": sent_bytes,  # into the object store, once for all actors
            "bytes": received["bytes"],  # loaded by one actor
            "received_dtypes": received["received_dtypes"],
        }

    def sleep(self, level: int = 1) -> dict:
        """Every actor releases its model memory (RolloutWorker.sleep): for a trainer sharing the devices."""
        return _sum_dicts(ray.get([a.sleep.remote(level) for a in self._actors]))

    def wake(self) -> dict:
        """Every actor takes its weights back (after level 2, send them again with update_weights)."""
        return _sum_dicts(ray.get([a.wake.remote() for a in self._actors]))

    # ------------------------------------------------------------------ reporting and lifetime
    def stats(self) -> dict:
        """Pool counters, the last batch's metrics and each actor's totals (a dead actor: None)."""
        per_actor = []
        for a in self._actors:
            try:
                per_actor.append(ray.get(a.stats.remote()))
            except ray.exceptions.RayActorError:
                per_actor.append(None)
        return {
            "version": self.version,
            "num_actors": self.num_actors,
            "restarts": self._restarts,
            "retries": self._retries,
            "timeouts": self._timeouts,  # requests past request_timeout_s (each replaced its actor)
            "last_batch": dict(self._last),
            "actors": per_actor,
        }

    @property
    def last_batch(self) -> dict:
        """Metrics of the last ``generate`` / ``run`` computed on the driver (no actor call)."""
        return dict(self._last, version=self.version, restarts=self._restarts, retries=self._retries)

    def shutdown(self) -> None:
        """Kill every actor, remove the placement group, drop the stored weights; stop Ray if the pool
        started it. Idempotent."""
        for a in self._actors:
            ray.kill(a, no_restart=True)
        self._actors = []
        self._loading = {}
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None
        self._policy_ref = self._draft_ref = None
        self._model_args = (None, None)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False

    def __enter__(self) -> RolloutPool:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ pieces
    def _check_open(self) -> None:
        if not self._actors:
            raise RuntimeError("the pool has been shut down")

    def _bundle(self) -> dict:
        cfg = self.config
        bundle = {"CPU": cfg.num_cpus_per_actor, "GPU": cfg.num_gpus_per_actor}
        return {k: v for k, v in bundle.items() if v > 0}

    def _placement_group(self):
        cfg = self.config
        if cfg.placement_strategy is None or not self._bundle():
            return None
        pg = placement_group([self._bundle()] * cfg.num_actors, strategy=cfg.placement_strategy)
        try:
            ray.get(pg.ready(), timeout=cfg.start_timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            remove_placement_group(pg)
            raise RolloutError(
                f"placement group of {cfg.num_actors} x {self._bundle()} ({cfg.placement_strategy}) not "
                f"ready after {cfg.start_timeout_s} s; the cluster has {ray.available_resources()} "
                "available. Lower num_actors / num_cpus_per_actor / num_gpus_per_actor or grow the cluster."
            ) from err
        return pg

    def _start_actor(self, slot: int):
        cfg = self.config
        options = dict(num_cpus=cfg.num_cpus_per_actor, num_gpus=cfg.num_gpus_per_actor, max_restarts=0)
        if self._pg is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=slot
            )
        return RolloutActor.options(**options).remote(
            self._worker_config, *self._model_args, num_gpus=cfg.num_gpus_per_actor
        )

    def _wait_started(self, actors) -> list[dict]:
        refs = [a.info.remote() for a in actors]
        try:
            return ray.get(refs, timeout=self.config.start_timeout_s)
        except ray.exceptions.RayActorError as err:
            raise RolloutError(f"a rollout actor failed to start: {_cause(err)}") from err
        except ray.exceptions.GetTimeoutError as err:
            raise RolloutError(
                f"rollout actors not ready after {self.config.start_timeout_s} s (start_timeout_s); "
                f"cluster resources available: {ray.available_resources()}"
            ) from err

    def _replace(self, slot: int, cause: str) -> None:
        """A new actor in ``slot`` (same options and bundle), given the latest weights and version. Its
        constructor and weight load run in submission order before any later call; ``run`` sends it a
        request only once they have finished (``self._loading``). ``cause``: "died" or "timeout"."""
        ray.kill(self._actors[slot], no_restart=True)  # make sure the old one is gone (a hung one too)
        actor = self._start_actor(slot)
        if self.version != 0 or self._policy_ref is not None or self._draft_ref is not None:
            ready = actor.update_weights.remote(self._policy_ref, self._draft_ref, self.version)
        else:
            ready = actor.info.remote()
        self._loading[slot] = (ready, time.monotonic() + self.config.start_timeout_s)
        self._actors[slot] = actor
        self._restarts += 1
        self._event("replaced", slot, None, cause=cause)

    def _event(self, kind: str, slot: int, request: RolloutRequest | None, **extra) -> None:
        rid = None if request is None else request.request_id
        event = dict(kind=kind, slot=slot, request=rid, run=self.runs, time=time.perf_counter(), **extra)
        self.events.append(event)


def batch_metrics(trajectories: list[Trajectory], seconds: float) -> dict:
    """Throughput and speculation metrics of one batch from its trajectories (no actor call).

    tau: tokens emitted per draft-and-verify round (the prefill's first token is not in a round);
    acceptance_rate: accepted / drafted; relaxed_frac: relaxed / emitted tokens."""
    tokens = sum(len(t.completion_ids) for t in trajectories)
    rounds = sum(t.stats.get("rounds", 0) for t in trajectories)
    drafted = sum(t.stats.get("drafted", 0) for t in trajectories)
    accepted = sum(t.stats.get("accepted", 0) for t in trajectories)
    relaxed = sum(t.stats.get("relaxed", 0) for t in trajectories)
    in_rounds = sum(max(len(t.completion_ids) - 1, 0) for t in trajectories)
    return {
        "trajectories": len(trajectories),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "tau": in_rounds / rounds if rounds else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "relaxed_frac": relaxed / tokens if tokens else 0.0,
    }


def _is_path(source) -> bool:
    return isinstance(source, (str, os.PathLike))


def _check_source(what: str, source, allow_propose: bool) -> None:
    """What the actors can build a model from: None (drafter only), a path / hub id, a module, or (for
    the drafter) an object with ``propose``. Anything else is refused here rather than dropped."""
    if source is None or _is_path(source) or isinstance(source, nn.Module):
        return
    if allow_propose and callable(getattr(source, "propose", None)):
        return
    kinds = "a path, a hub id, an nn.Module"
    kinds += " or an object with propose(sequences, k)" if allow_propose else ""
    raise TypeError(f"{what} must be {kinds}, got {type(source).__name__}")


def _put_model(what: str, source):
    """A model object in the object store for the actors' constructors (None for paths: each actor loads
    them). One that cannot be pickled fails here in one line naming it."""
    if source is None or _is_path(source):
        return None
    try:
        return ray.put(source)
    except (TypeError, pickle.PicklingError) as err:
        reason = err.__cause__ or err
        raise TypeError(
            f"{what} {source_name(source)} cannot be sent to the rollout actors: it does not pickle "
            f"({type(reason).__name__}: {str(reason).splitlines()[0] if str(reason) else ''}); make it "
            "picklable, or give a path the actors load"
        ) from None


def _cause(err: BaseException) -> str:
    """The last line of a Ray error (the original exception's type and message), or its first line."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    if isinstance(err, ray.exceptions.RayActorError) and not getattr(err, "actor_init_failed", False):
        return " ".join(lines[:1] + lines[-1:]) if len(lines) > 1 else lines[0]
    return lines[-1]


def _sum_dicts(parts: list[dict]) -> dict:
    out: dict = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out
