"""GRPO in plain PyTorch on a marsrl RolloutPool: no TRL, no trainer framework, one screen per stage.

    python recipes/grpo_plain.py --model Qwen/Qwen3-0.6B --data openai/gsm8k --steps 100
    python recipes/grpo_plain.py --model ./tiny --data prompts.jsonl --prompt-field question --steps 2

Each step: rollouts (the pool, G completions per prompt) -> rewards (the reference answer appears as a
word of the completion) -> group-normalised advantages -> the policy's log-probs recomputed by teacher
forcing -> importance ratio exp(logp_policy - behavior_logprobs), clipped -> loss -> optimizer step ->
``pool.update_weights(policy, version=step + 1)``. One JSON line of metrics per step on stdout.

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
- Advantages are (r - mean_group) / (std_group + 1e-4); a group with equal rewards contributes nothing.
- Teacher-forced log-probs use the sampling temperature (log softmax(logits / T)), the distribution the
  rollout's log-probs refer to; top-k / top-p are not offered because the ratio would then need the
  truncated distribution.
- The reward is a stand-in (answer word match); swap in a real verifier for a real task.
- Only the policy is synced after each step; an EAGLE-3 head (``--drafter``) is not retrained, so its
  acceptance decays as the policy moves (speed only: the behaviour log-probs stay exact).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from dataclasses import dataclass

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from marsrl.engine import EngineConfig, SamplingParams
from marsrl.rollout import PoolConfig, RolloutPool, WorkerConfig


@dataclass
class RecipeConfig:
    model: str = "Qwen/Qwen3-0.6B"  # policy: folder or hub id (the pool loads the same)
    drafter: str | None = None  # EAGLE-3 head folder / hub id; None: plain sampling
    rule: str = "strict"  # strict | mars | mars_code (lossy rules must be asked for by name)
    theta: float = 0.9
    data: str = "openai/gsm8k"  # hub id or a local .json / .jsonl file
    data_config: str | None = "main"
    prompt_field: str = "question"
    answer_field: str = "answer"  # a GSM-style "... #### 42" keeps the part after ####
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
    num_gpus_per_actor: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0: the ratio needs the sampling distribution's log-probs")


def parse_args(argv=None) -> RecipeConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f in dataclasses.fields(RecipeConfig):
        kind = str if f.default is None else type(f.default)
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default, help="%(default)s")
    return RecipeConfig(**vars(parser.parse_args(argv)))


def load_rows(cfg: RecipeConfig) -> list[tuple[str, str]]:
    if cfg.data.endswith((".json", ".jsonl")):
        ds = load_dataset("json", data_files=cfg.data, split="train")
    else:
        ds = load_dataset(cfg.data, cfg.data_config, split="train")
    return [(row[cfg.prompt_field], str(row[cfg.answer_field])) for row in ds]


def encode(tokenizer, prompt: str) -> list[int]:
    if not tokenizer.chat_template:
        return tokenizer(prompt)["input_ids"]
    msgs = [{"role": "user", "content": prompt}]
    return list(
        tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)["input_ids"]
    )


def reward(completion: str, answer: str) -> float:
    """1 if the reference answer (after '####' if present) is a word of the completion, else 0."""
    ref = answer.split("####")[-1].strip().replace(",", "")
    words = [w.rstrip(".") for w in re.findall(r"[\w.\-]+", completion.replace(",", ""))]
    return float(bool(ref) and ref in words)


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """rewards [N] (N = P * G, groups consecutive) -> advantages [N] normalised within each group."""
    r = rewards.view(-1, group_size)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)


def teacher_forced_logprobs(policy, trajs, temperature: float, pad_id: int):
    """log pi(y_t | prefix) for every completion token: (logp [N, T], mask [N, T]), right-padded."""
    seqs = [t.prompt_ids + t.completion_ids for t in trajs]
    width = max(map(len, seqs))
    device = next(policy.parameters()).device
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, device=device)
        attn[i, : len(s)] = 1
    logits = policy(input_ids=ids, attention_mask=attn).logits.float() / max(temperature, 1e-6)
    logp_all = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    t_max = max(len(t.completion_ids) for t in trajs)
    logp = torch.zeros(len(trajs), t_max, device=device)
    mask = torch.zeros(len(trajs), t_max, device=device)
    for i, t in enumerate(trajs):
        start, n = len(t.prompt_ids) - 1, len(t.completion_ids)  # logits at p-1 predict completion[0]
        logp[i, :n] = logp_all[i, start : start + n]
        mask[i, :n] = 1.0
    return logp, mask


def grpo_loss(logp, behavior, mask, adv, clip_eps: float):
    """Clipped surrogate with ratio exp(logp - behavior); logp / behavior / mask [N, T], adv [N].
    Returns (loss, metrics)."""
    ratio = torch.exp(logp - behavior)
    a = adv.unsqueeze(1)
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    loss = -(surrogate * mask).sum() / mask.sum()
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > clip_eps).float()
        metrics = {
            "loss": loss.item(),
            "is_ratio_mean": ((ratio * mask).sum() / mask.sum()).item(),
            "is_ratio_max": ratio[mask.bool()].max().item(),
            "clip_frac": ((clipped * mask).sum() / mask.sum()).item(),
        }
    return loss, metrics


def main(argv=None) -> list[dict]:
    cfg = parse_args(argv)
    torch.manual_seed(cfg.seed)
    rows = load_rows(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    policy = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
    policy.to("cuda" if torch.cuda.is_available() else "cpu").train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    engine = EngineConfig(rule=cfg.rule, theta=cfg.theta)
    worker = WorkerConfig(target=cfg.model, drafter=cfg.drafter, engine=engine, dtype="float32")
    pool = RolloutPool(
        PoolConfig(
            worker=worker,
            num_actors=cfg.num_actors,
            num_cpus_per_actor=cfg.num_cpus_per_actor,
            num_gpus_per_actor=cfg.num_gpus_per_actor,
        )
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
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
            trajs = pool.generate([encode(tokenizer, prompt) for prompt, _ in batch], sampling)
            texts = tokenizer.batch_decode([t.completion_ids for t in trajs], skip_special_tokens=True)
            answers = [answer for _, answer in batch for _ in range(cfg.group_size)]
            rewards = torch.tensor([reward(c, a) for c, a in zip(texts, answers, strict=True)])
            adv = group_advantages(rewards, cfg.group_size)

            logp, mask = teacher_forced_logprobs(policy, trajs, cfg.temperature, pad_id)
            behavior = torch.zeros_like(logp)  # b(y): what the rollout really sampled with, [N, T]
            for i, t in enumerate(trajs):
                behavior[i, : len(t.behavior_logprobs)] = torch.tensor(t.behavior_logprobs)
            loss, metrics = grpo_loss(logp, behavior, mask, adv.to(logp.device), cfg.clip_eps)
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            sync = pool.update_weights(policy, version=step + 1)

            rollout = pool.last_batch
            metrics.update(
                step=step,
                reward=rewards.mean().item(),
                grad_norm=float(grad_norm),
                policy_version=trajs[0].policy_version,
                rollout_tokens_per_s=rollout["tokens_per_s"],
                rollout_tau=rollout["tau"],
                relaxed_frac=rollout["relaxed_frac"],
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
