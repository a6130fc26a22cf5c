"""GRPO in plain PyTorch on a marsrl RolloutPool: no TRL, no trainer framework, one screen per stage.

    python recipes/grpo_plain.py --model Qwen/Qwen3-0.6B --data openai/gsm8k --steps 100
    python recipes/grpo_plain.py --model ./tiny --data problems.jsonl --steps 2

Each step: rollouts (the pool, G completions per prompt) -> rewards (``marsrl.data.gsm8k_reward``: the
number after the completion's ``####`` equals the gold answer) -> group-normalised advantages
(``marsrl.algo.group_advantages``, TRL's computation) -> the policy's log-probs and top-2 tokens by
teacher forcing (``marsrl.metrics.teacher_forcing``: one forward, ``marsrl.algo.token_stats``) -> ratio
exp(logp_policy - behavior_logprobs), clipped -> loss -> optimizer step ->
``pool.update_weights(policy, version=step + 1)``.  One JSON line of metrics per step on stdout, with
the top-1 / top-2 bias family of the batch (``marsrl.algo.bias_metrics``).

How this departs from textbook GRPO (DeepSeekMath):
- One optimizer step per batch (mu = 1): there is no separate pi_old. The ratio's denominator is the
  BEHAVIOUR log-prob the rollout reports, i.e. the probability with which the speculative procedure
  really emitted each token (under MARS it differs from the target's own probability on relaxed tokens).
  One ratio thus corrects both rollout/trainer numerical mismatch and lossy verification.
- The ratio is clipped PPO-style, min(r * A, clip(r, 1 - clip_eps, 1 + clip_eps) * A) per token: tokens
  whose ratio is already outside the band in the direction the advantage pushes get no gradient. This
  bounds the update but leaves a bias where b != p; it is not an unbiased IS estimator.
- No KL penalty to a reference model (beta = 0), as in DAPO / Dr. GRPO.
- The loss is averaged over all completion tokens of the batch (DAPO token-level), not per sequence.
- Advantages are (r - mean_group) / (std_group + 1e-4), std unbiased as in TRL; a group with equal
  rewards contributes nothing.
- Teacher-forced log-probs use the sampling temperature (log softmax(logits / T)), the distribution the
  rollout's log-probs refer to; top-k / top-p are not offered because the ratio would then need the
  truncated distribution.
- The reward is GSM8K exact match only (no format or partial credit); ``main(reward_fn=...)`` takes any
  TRL-style reward function instead.
- Only the policy is synced after each step; an EAGLE-3 head (``--drafter``) is not retrained, so its
  acceptance decays as the policy moves (speed only: the behaviour log-probs stay exact).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from marsrl.algo import bias_metrics, group_advantages
from marsrl.data import gsm8k_reward, load_gsm8k, prompt_messages, render_prompt
from marsrl.engine import EngineConfig, SamplingParams
from marsrl.metrics import teacher_forcing
from marsrl.rollout import PoolConfig, RolloutPool, WorkerConfig
from marsrl.trajectory import collate


@dataclass
class RecipeConfig:
    model: str = "Qwen/Qwen3-0.6B"  # policy: folder or hub id (the pool loads the same)
    drafter: str | None = None  # EAGLE-3 head folder / hub id; None: plain sampling
    rule: str = "strict"  # strict | mars | mars_code (lossy rules must be asked for by name)
    theta: float = 0.9
    data: str = "openai/gsm8k"  # hub id or a local .jsonl / .json / .parquet file (question, answer)
    data_config: str | None = "main"  # hub only
    split: str = "train"  # hub only
    steps: int = 100
    prompts_per_step: int = 8
    group_size: int = 8  # G completions per prompt
    max_new_tokens: int = 256
    temperature: float = 1.0
    lr: float = 1e-6
    clip_eps: float = 0.2
    max_grad_norm: float = 1.0
    num_actors: int = 1
    num_cpus_per_actor: float = 1.0
    num_gpus_per_actor: float | None = None  # None: 1 per actor when this machine has CUDA, else 0 (CPU)
    seed: int = 0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0: the ratio needs the sampling distribution's log-probs")


def parse_args(argv=None) -> RecipeConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f in dataclasses.fields(RecipeConfig):
        kind = (float if f.type.startswith("float") else str) if f.default is None else type(f.default)
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default, help="%(default)s")
    return RecipeConfig(**vars(parser.parse_args(argv)))


def actor_gpus(requested: float | None, cuda_available: bool) -> float:
    """GPUs each rollout actor asks Ray for: ``requested``, or by default one when CUDA is present (a
    zero-GPU actor would run its rollouts on the CPU) and none on a CPU machine."""
    if requested is not None:
        return requested
    return 1.0 if cuda_available else 0.0


def encode(tokenizer, question: str) -> list[int]:
    """The prompt ids: marsrl.data's system + user turns through the chat template, else its plain text."""
    if not tokenizer.chat_template:
        return tokenizer(render_prompt(question))["input_ids"]
    msgs = prompt_messages(question)
    return list(
        tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)["input_ids"]
    )


def grpo_loss(logp, behavior, mask, adv, clip_eps: float):
    """Clipped surrogate with ratio exp(logp - behavior); logp / behavior / mask [N, T], adv [N].
    Returns (loss, metrics)."""
    ratio = torch.exp(logp - behavior)
    a = adv.unsqueeze(1)
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    loss = -(surrogate * mask).sum() / mask.sum()
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > clip_eps) & mask
        metrics = {"loss": loss.item(), "clip_frac": (clipped.sum() / mask.sum()).item()}
    return loss, metrics


def main(argv=None, reward_fn=gsm8k_reward) -> list[dict]:
    """Train; ``reward_fn(completions=texts, answer=golds) -> list[float]`` scores each completion."""
    cfg = parse_args(argv)
    torch.manual_seed(cfg.seed)
    rows = load_gsm8k(cfg.data, split=cfg.split, config=cfg.data_config)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    policy = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy.to(device).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    engine = EngineConfig(rule=cfg.rule, theta=cfg.theta)
    worker = WorkerConfig(target=cfg.model, drafter=cfg.drafter, engine=engine, dtype="float32")
    pool = RolloutPool(
        PoolConfig(
            worker=worker,
            num_actors=cfg.num_actors,
            num_cpus_per_actor=cfg.num_cpus_per_actor,
            num_gpus_per_actor=actor_gpus(cfg.num_gpus_per_actor, torch.cuda.is_available()),
        )
    )
    history = []
    try:
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            batch = [rows[(step * cfg.prompts_per_step + i) % len(rows)] for i in range(cfg.prompts_per_step)]
            sampling = SamplingParams(
                temperature=cfg.temperature,
                max_new_tokens=cfg.max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                n=cfg.group_size,
                seed=cfg.seed + step,
            )
            trajs = pool.generate([encode(tokenizer, row["question"]) for row in batch], sampling)
            texts = tokenizer.batch_decode([t.completion_ids for t in trajs], skip_special_tokens=True)
            golds = [row["answer"] for row in batch for _ in range(cfg.group_size)]
            rewards = torch.tensor(reward_fn(completions=texts, answer=golds), dtype=torch.float32)
            adv, reward_metrics = group_advantages(rewards, cfg.group_size)

            stats, mask = teacher_forcing(policy, trajs, cfg.temperature)  # [N, T] on the policy's device
            record = collate(trajs, device)  # the rollout's per-token record, [N, T]; its mask is the same
            behavior = record["behavior_logprobs"]  # log b(y)
            loss, metrics = grpo_loss(stats["logp"], behavior, mask, adv.to(device), cfg.clip_eps)
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            sync = pool.update_weights(policy, version=step + 1)

            _, bias = bias_metrics(
                stats["logp"].detach(),
                behavior,
                stats["is_t1"],
                stats["is_t2"],
                stats["p_t1"],
                stats["p_t2"],
                record["provenance"],
                mask,
                record["unsupported_mass"],
            )
            rollout = pool.last_batch
            metrics.update(
                step=step,
                **reward_metrics,
                **bias,
                grad_norm=float(grad_norm),
                policy_version=trajs[0].policy_version,
                rollout_tokens_per_s=rollout["tokens_per_s"],
                rollout_tau=rollout["tau"],
                sync_seconds=sync["seconds"],
                step_seconds=time.perf_counter() - t0,
            )
            print(json.dumps(metrics), flush=True)
            history.append(metrics)
    finally:
        pool.shutdown()
    return history


if __name__ == "__main__":
    main()
