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

Faults. A request whose actor dies (killed, crashed, out of memory) is re-queued; the dead actor is
replaced in the same placement-group bundle and loaded with the latest weights before it takes work
(every generate call carries the expected version, and a worker holding another version refuses).
Results already returned are kept. After ``max_attempts`` deaths on one request, or at once for a Python
error raised inside the worker, ``RolloutError`` names the request and the cause.

Weights. ``update_weights`` turns a module / state dict / ZeRO-3 engine into a CPU state dict, puts it
in the Ray object store ONCE and hands every actor the reference (each actor reads the shared copy).
The pool keeps the latest references for replacement actors. On GPU a NCCL broadcast from the trainer
(``ray.util.collective``) would replace the object-store hop; not implemented.

Leaves out: several trainer processes sharing one pool (call it from one process; gather ZeRO-3 weights
on every rank with ``gather_zero3_state_dict`` and pass the dict from rank 0), per-request timeouts for
actors that hang without dying, continuous batching across requests.
"""

from __future__ import annotations

import time
from collections import deque

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from torch import nn

from ..engine import SamplingParams, Trajectory
from .actor import RolloutActor
from .config import PoolConfig
from .requests import RolloutRequest, check_prompts, plan_requests
from .weights import to_state_dict
from .worker import check_sources_match


class RolloutError(RuntimeError):
    """A request that could not be completed, or actors that could not start (the message says which)."""


class RolloutPool:
    """N RolloutActors behind one ``generate`` / ``update_weights`` / ``sleep`` / ``wake`` interface.

    Args:
        config: PoolConfig (actors, resources, placement, the worker's models and engine).
        target, drafter: already-built modules to use instead of ``config.worker.target`` / ``drafter``
            (put in the object store once and unpickled by every actor).
    """

    def __init__(self, config: PoolConfig | None = None, *, target=None, drafter=None):
        self.config = config = config or PoolConfig()
        target = target if target is not None else config.worker.target
        drafter = drafter if drafter is not None else config.worker.drafter
        if target is None:
            raise ValueError("no target: set config.worker.target (a folder or hub id) or pass target=")
        check_sources_match(target, drafter)  # a mismatched head fails here, naming both, before any actor
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(**({"address": config.address} if config.address else {"include_dashboard": False}))
        self._model_args = tuple(ray.put(m) if isinstance(m, nn.Module) else None for m in (target, drafter))
        self.version = 0
        self.runs = 0  # run() calls so far
        self.events: list[dict] = []  # dispatch / done / died / replaced of the current run (tests, logs)
        self._policy_ref = self._draft_ref = None
        self._restarts = self._retries = 0
        self._last: dict = {}
        self._pg = None
        self._actors: list = []
        try:
            self._pg = self._placement_group()
            self._actors = [self._start_actor(i) for i in range(config.num_actors)]
            infos = self._wait_started(self._actors)
        except BaseException:
            self.shutdown()
            raise
        self.info = infos[0]  # vocab_size, max_seq_len, rule, theta, target, drafter (same on every actor)

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
        results: list[list[Trajectory] | None] = [None] * len(requests)
        attempts = [0] * len(requests)
        queue = deque(range(len(requests)))
        idle = deque(range(self.num_actors))
        running: dict = {}  # ObjectRef -> (slot, position in requests)
        while queue or running:
            while queue and idle:
                slot, pos = idle.popleft(), queue.popleft()
                attempts[pos] += 1
                ref = self._actors[slot].generate.remote(requests[pos], self.version)
                running[ref] = (slot, pos)
                self._event("dispatch", slot, requests[pos], attempt=attempts[pos])
            (ref,), _ = ray.wait(list(running), num_returns=1)
            slot, pos = running.pop(ref)
            try:
                results[pos] = ray.get(ref)
            except ray.exceptions.RayActorError as err:  # the actor died: replace it, re-queue the request
                self._event("died", slot, requests[pos], cause=_cause(err))
                self._replace(slot)  # before any raise, so the pool stays usable
                if attempts[pos] >= self.config.max_attempts:
                    raise RolloutError(
                        f"{requests[pos].describe()} failed {attempts[pos]} times (max_attempts="
                        f"{self.config.max_attempts}); its actor died each time. Last cause: {_cause(err)}"
                    ) from err
                self._retries += 1
                queue.appendleft(pos)
            except ray.exceptions.RayTaskError as err:  # a Python error in the worker: not retried
                raise RolloutError(f"{requests[pos].describe()} failed: {_cause(err)}") from err
            else:
                self._event("done", slot, requests[pos])
            idle.append(slot)
        self._last = batch_metrics([t for part in results for t in part], time.perf_counter() - start)
        return results

    # ------------------------------------------------------------------ weights and memory
    def update_weights(self, policy=None, draft=None, version: int | None = None) -> dict:
        """Send policy and/or draft weights to every actor once (object store) and set the version
        trajectories record from now on (default: current + 1). ``policy`` / ``draft``: a state dict, an
        nn.Module or a DeepSpeed ZeRO-3 engine (gathered here: only valid with one trainer rank; with
        several, gather on every rank first). Returns timing metrics."""
        self._check_open()
        start = time.perf_counter()
        version = self.version + 1 if version is None else int(version)
        if policy is not None:
            self._policy_ref = ray.put(to_state_dict(policy))
        if draft is not None:
            self._draft_ref = ray.put(to_state_dict(draft))
        put_s = time.perf_counter() - start
        self.version = version  # replacements started from now on load these
        policy_ref = self._policy_ref if policy is not None else None
        draft_ref = self._draft_ref if draft is not None else None
        calls = {
            slot: actor.update_weights.remote(policy_ref, draft_ref, version)
            for slot, actor in enumerate(self._actors)
        }
        sent, failed = 0, []
        for slot, ref in calls.items():
            try:
                sent = ray.get(ref)["bytes"]
            except ray.exceptions.RayActorError:
                self._replace(slot)  # the replacement loads the latest weights before any request
            except ray.exceptions.RayTaskError as err:  # nothing was loaded there (keys are checked first)
                failed.append(f"actor {slot}: {_cause(err)}")
        if failed:
            raise RolloutError(f"weights version {version} were refused: " + "; ".join(failed))
        seconds = time.perf_counter() - start
        return {"version": version, "seconds": seconds, "put_seconds": put_s, "bytes": sent}

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
        return RolloutActor.options(**options).remote(cfg.worker, *self._model_args)

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

    def _replace(self, slot: int) -> None:
        """A new actor in ``slot`` (same options and bundle), given the latest weights and version. Its
        constructor and weight load run in submission order before the next request sent to it."""
        ray.kill(self._actors[slot], no_restart=True)  # make sure the old one is gone
        actor = self._start_actor(slot)
        if self.version != 0 or self._policy_ref is not None or self._draft_ref is not None:
            actor.update_weights.remote(self._policy_ref, self._draft_ref, self.version)
        self._actors[slot] = actor
        self._restarts += 1
        self._event("replaced", slot, None)

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
