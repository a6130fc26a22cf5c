"""Rollout pool costs side by side in one run: the engine called in-process, the pool with 1 actor on
the same single request (the Ray hop: ratio = pool / in-process), the pool with 2 actors (the batch
split in two), weight updates through the object store, and a probe of how far two single-thread
processes overlap on the machine it runs on (``cpu_probe.parallel_speedup``: read speedup_2_actors
against it).

Weight updates: the pool's path (``RolloutPool.update_weights``: cast to the worker's dtype and trimmed
on the driver, numpy buffers Ray stores out of band and the actor reads in place) against the path it
replaced, kept here as the slow reference (``legacy_update``: ``ray.put(to_state_dict(...))`` in the
trainer's dtype, torch tensors pickled by copy, every key). Repeats alternate which path goes first;
medians are reported. ``weight_update``: the bench target on the 1-actor pool; ``weight_update_large``:
a ``--update-mb`` state dict in ``--trainer-dtype`` sent to a 1-actor pool in ``--worker-dtype`` (the
audit's case: an fp32 trainer, a bf16 worker).

    python -m bench.rollout            # Qwen3-architecture target of ~6.6M params; 1 GB fp32 -> bf16 update
    python -m bench.rollout --prompts 16 --new-tokens 32 --repeats 3 --update-mb 0

Every configuration runs with one torch thread per worker (in-process too) so the comparison is fair on
a small machine; actors ask Ray for ``--cpus-per-actor`` CPUs each. Starts a local Ray cluster unless one
is already running in this process. Prints one JSON object; read the ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

from bench._common import compare, emit
from marsrl.engine import SamplingParams
from marsrl.rollout import PoolConfig, RolloutPool, RolloutWorker, WorkerConfig, plan_requests, to_state_dict
from marsrl.testing import tiny_causal_lm


def build_target(seed: int, layers: int, hidden: int, vocab: int):
    return tiny_causal_lm(
        vocab=vocab, hidden=hidden, layers=layers, seed=seed, max_positions=2048, lm_head_scale=4.0
    )


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median wall seconds over ``repeats`` calls after one warm-up call (the bench harness), and the
    last call's result."""
    timings = compare({"call": fn}, repeats, warmup=1)
    return timings.median("call"), timings.results["call"][-1]


def sized_target(mb: float, dtype: str, seed: int):
    """A Qwen3-architecture model whose state dict is about ``mb`` MiB in ``dtype`` (hidden 1024, vocab
    32768, as many layers as it takes; ~9.4M parameters a layer, 67M in the embeddings)."""
    hidden, vocab = 1024, 32768
    params = mb * 2**20 / torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    layers = max(1, round((params - 2 * vocab * hidden) / (9 * hidden * hidden + 2 * hidden)))
    model = tiny_causal_lm(vocab=vocab, hidden=hidden, layers=layers, seed=seed, max_positions=2048)
    return model.to(getattr(torch, dtype))


def legacy_update(pool: RolloutPool, weights) -> dict:
    """The update path the pool used before packing, the slow reference: the trainer's state dict in
    its own dtype with every key, ``ray.put`` (torch tensors pickled by copy), every actor loads it. The
    version is left as it is."""
    import ray

    start = time.perf_counter()
    ref = ray.put(to_state_dict(weights))
    put_s = time.perf_counter() - start
    ray.get([a.update_weights.remote(ref, None, pool.version) for a in pool.actors])
    seconds = time.perf_counter() - start
    sent = sum(t.numel() * t.element_size() for t in to_state_dict(weights).values())
    return {"seconds": seconds, "put_seconds": put_s, "sent_bytes": sent}


def compare_updates(pool: RolloutPool, weights, repeats: int) -> dict:
    """legacy_update vs pool.update_weights (same version kept), after one warm-up each, ``repeats``
    rounds alternating which goes first; medians, every time, bytes sent, ratio old / new."""

    def new() -> dict:
        out = pool.update_weights(weights, version=pool.version)
        return {k: out[k] for k in ("seconds", "put_seconds", "sent_bytes")}

    paths = {"old": lambda: legacy_update(pool, weights), "new": new}
    runs = compare(paths, repeats, warmup=1).results  # each path's own seconds, not the call's wall time
    times = {name: [r["seconds"] for r in runs[name]] for name in paths}
    last = {name: runs[name][-1] for name in paths}
    out = {"mb": sum(t.numel() * t.element_size() for t in to_state_dict(weights).values()) / 2**20}
    for name in paths:
        out[name] = {
            "seconds": statistics.median(times[name]),
            "put_seconds": last[name]["put_seconds"],
            "sent_mb": last[name]["sent_bytes"] / 2**20,
            "times": times[name],
        }
    out["ratio_old_over_new"] = out["old"]["seconds"] / out["new"]["seconds"]
    out["zero_copy_env"] = os.environ.get(
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS"
    )  # legacy's speed depends on it
    return out


def parallel_probe(cpus: float) -> dict:
    """The same single-thread matmul loop as 1 Ray task, then as 2 concurrent ones: how much two actors
    can overlap on the machine it runs on (2.0 = two real cores, 1.0 = they share one)."""
    import ray

    def matmul_loop(steps: int = 300) -> float:  # nested: Ray ships it by value, whatever imports bench
        torch.set_num_threads(1)
        a = torch.randn(384, 384)
        start = time.perf_counter()
        for _ in range(steps):
            a @ a
        return time.perf_counter() - start

    work = ray.remote(num_cpus=cpus)(matmul_loop)
    ray.get([work.remote(), work.remote()])  # start and warm two workers
    start = time.perf_counter()
    ray.get(work.remote())
    one = time.perf_counter() - start
    start = time.perf_counter()
    ray.get([work.remote(), work.remote()])
    two = time.perf_counter() - start
    return {"one_task_s": one, "two_tasks_s": two, "parallel_speedup": 2 * one / two}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cpus-per-actor", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--update-mb", type=float, default=1024, help="size of the large update; 0: skip it")
    p.add_argument("--trainer-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--worker-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True, help="run cpu_probe")
    args = p.parse_args(argv)

    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(include_dashboard=False, logging_level="WARNING")
    target = build_target(args.seed, args.layers, args.hidden, args.vocab)
    params = sum(t.numel() for t in target.parameters())
    g = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, args.vocab, (args.prompts, args.prompt_len), generator=g).tolist()
    sampling = SamplingParams(max_new_tokens=args.new_tokens, n=args.n, seed=args.seed, ignore_eos=True)
    tokens = args.prompts * args.n * args.new_tokens
    worker_cfg = WorkerConfig(torch_threads=1)

    threads = torch.get_num_threads()
    worker = RolloutWorker(worker_cfg, target=target)
    request = plan_requests(prompts, sampling, num_requests=1)
    t_local, local = timed(lambda: worker.generate(request), args.repeats)
    torch.set_num_threads(threads)

    out: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "target_params": params,
        "batch": {"prompts": args.prompts, "n": args.n, "new_tokens": args.new_tokens, "tokens": tokens},
        "in_process": {"seconds": t_local, "tokens_per_s": tokens / t_local},
    }
    for actors in (1, 2):
        cfg = PoolConfig(worker=worker_cfg, num_actors=actors, num_cpus_per_actor=args.cpus_per_actor)
        with RolloutPool(cfg, target=target) as pool:
            seconds, trajs = timed(lambda pool=pool: pool.generate(prompts, sampling), args.repeats)
            out[f"pool_{actors}"] = {"seconds": seconds, "tokens_per_s": tokens / seconds}
            if actors == 1:
                same = [t.completion_ids for t in trajs] == [t.completion_ids for t in local]
                out["pool_1"]["equals_in_process"] = same
                out["weight_update"] = compare_updates(pool, target, args.repeats)
    if args.update_mb > 0:
        trainer = sized_target(args.update_mb, args.trainer_dtype, args.seed)
        cfg = PoolConfig(
            worker=WorkerConfig(dtype=args.worker_dtype, torch_threads=1),
            num_actors=1,
            num_cpus_per_actor=args.cpus_per_actor,
        )
        with RolloutPool(cfg, target=trainer) as pool:
            large = compare_updates(pool, trainer, args.repeats)
        out["weight_update_large"] = {
            "trainer_dtype": args.trainer_dtype,
            "worker_dtype": args.worker_dtype,
            **large,
        }
        del trainer
    if args.probe:
        out["cpu_probe"] = parallel_probe(args.cpus_per_actor)
    out["ray_hop_ratio"] = out["pool_1"]["seconds"] / t_local
    out["speedup_2_actors"] = out["pool_1"]["seconds"] / out["pool_2"]["seconds"]
    return emit(out)


if __name__ == "__main__":
    main()
