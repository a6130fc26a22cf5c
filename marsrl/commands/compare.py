"""``marsrl rollouts``: strict vs MARS rollouts of GRPO groups on the tiny world, through the Ray pool.

Builds (or reuses) the tiny world, rolls out the same prompts with the same seed under each rule
(G completions per prompt, one GRPO group each), and reports side by side: tau, tokens/s, relaxed
fraction, the top-1 / top-2 rates against exact sampling (teacher-forced), importance-ratio statistics
and the mean reward.  Every trajectory is written with its per-token record to a JSONL file.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..data import gsm8k_reward
from ..engine import EngineConfig, SamplingParams
from ..metrics import bias_metrics, teacher_forced
from ..verify import DEFAULT_THETA, RULES
from .table import BIAS_ROWS, side_by_side


@dataclass(frozen=True)
class CompareConfig:
    """Settings of ``marsrl rollouts`` (override in YAML or with --set)."""

    preset: str = "default"  # tiny-world preset (built on first use, then cached)
    rules: tuple[str, ...] = ("strict", "mars")
    theta: float = DEFAULT_THETA
    num_draft_tokens: int = 7
    num_prompts: int = 16
    group_size: int = 8  # G completions per prompt
    temperature: float = 1.0
    num_actors: int = 1
    seed: int = 0
    out: str = "outputs/rollouts.jsonl"

    def __post_init__(self):
        bad = sorted(set(self.rules) - set(RULES))
        if not self.rules or bad:
            raise ValueError(f"rules must be a non-empty subset of {list(RULES)}, got {list(self.rules)}")
        for name in ("num_draft_tokens", "num_prompts", "group_size", "num_actors"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.theta >= 0:
            raise ValueError(f"theta must be >= 0, got {self.theta}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


def run_compare(cfg: CompareConfig, progress: bool = True) -> dict:
    from ..tinyworld import PRESETS, build_tinyworld, load_tinyworld
    from ..tinyworld.build import heldout_problems
    from ..tinyworld.tokenizer import chat_prompt_ids

    if cfg.preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {cfg.preset!r}")
    world = build_tinyworld(cfg.preset, progress=progress)
    target, tok, _, meta = load_tinyworld(world)
    problems = heldout_problems(PRESETS[cfg.preset], cfg.num_prompts)
    prompts = [chat_prompt_ids(tok, p["question"]) for p in problems]
    sampling = SamplingParams(
        temperature=cfg.temperature,
        max_new_tokens=PRESETS[cfg.preset].max_new_tokens,
        eos_token_id=tok.eos_token_id,
        n=cfg.group_size,
        seed=cfg.seed,
    )
    out_path = Path(cfg.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {"world": str(world), "rules": {}}
    own_ray = _start_local_ray()
    try:
        _roll_out_each_rule(cfg, world, target, tok, problems, prompts, sampling, out_path, report)
    finally:
        if own_ray:
            import ray

            ray.shutdown()
    report["out"] = str(out_path)
    report["world_measured_at_build"] = meta.get("measured_at_build")
    return report


def _start_local_ray() -> bool:
    """A quiet single-machine Ray cluster on loopback, unless one is already up (returns True if started)."""
    import os

    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    return True


def _roll_out_each_rule(cfg, world, target, tok, problems, prompts, sampling, out_path, report) -> None:
    from ..rollout import PoolConfig, RolloutPool, WorkerConfig, batch_metrics

    with out_path.open("w") as sink:
        for rule in cfg.rules:
            engine = EngineConfig(rule=rule, theta=cfg.theta, num_draft_tokens=cfg.num_draft_tokens)
            worker = WorkerConfig(target=str(world / "target"), drafter=str(world / "draft"), engine=engine)
            pool_cfg = PoolConfig(worker=worker, num_actors=cfg.num_actors, num_cpus_per_actor=1.0)
            with RolloutPool(pool_cfg) as pool:
                warm = SamplingParams(max_new_tokens=2, eos_token_id=tok.eos_token_id, seed=cfg.seed)
                pool.generate(prompts[:1], warm)  # actor imports and first-call costs stay out of tokens/s
                start = time.perf_counter()
                trajs = pool.generate(prompts, sampling)
                wall = time.perf_counter() - start
                stats = pool.stats()
            texts = [tok.decode(t.completion_ids, skip_special_tokens=True) for t in trajs]
            golds = [problems[i // cfg.group_size]["gold"] for i in range(len(trajs))]
            rewards = gsm8k_reward(completions=texts, answer=golds)
            figures = bias_metrics(trajs, teacher_forced(target, trajs, cfg.temperature))
            tokens = sum(len(t.completion_ids) for t in trajs)
            figures.update(
                tau=batch_metrics(trajs, wall)["tau"],
                tokens_per_s=tokens / wall,
                mean_reward=sum(rewards) / len(rewards),
                completions=len(trajs),
                pool_stats={k: v for k, v in stats.items() if isinstance(v, (int, float))},
            )
            report["rules"][rule] = figures
            for i, (t, r) in enumerate(zip(trajs, rewards, strict=True)):
                row = {"rule": rule, "prompt_index": i // cfg.group_size, "sample": i % cfg.group_size}
                row.update(vars(t))
                row.update(reward=r, text=texts[i])
                sink.write(json.dumps(row) + "\n")


ROWS = [
    ("tau (tokens / target forward)", "tau", "{:.3f}"),
    ("tokens/s", "tokens_per_s", "{:.1f}"),
    *BIAS_ROWS,
    ("KL(b || pi) per token", "kl_behavior", "{:.5f}"),
    ("mean reward", "mean_reward", "{:.3f}"),
]


def format_report(report: dict) -> str:
    return side_by_side(report["rules"], ROWS)
