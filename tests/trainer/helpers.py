"""Shared pieces of the trainer tests: a saved tiny policy with its tokenizer, an in-process pool
drafting from a random EAGLE-3 head, a prompt dataset, a reward that varies."""

from __future__ import annotations

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

from marsrl.engine import EngineConfig
from marsrl.rollout import LocalPool, WorkerConfig
from marsrl.rollout.local import outside_zero3
from tests.rollout.helpers import save_tiny_world, sentences, tiny_head


def local_pool(
    folder: str, rule: str = "mars", theta: float = 0.0, draft_sampling="sample", **engine
) -> LocalPool:
    """A LocalPool on the policy saved in ``folder`` with a random head (sampled drafts: q has full
    support, so relaxation moves b away from pi and the weights are far from 1)."""
    with outside_zero3():  # a ZeRO-3 trainer config in this process must not partition the rollout models
        target = AutoModelForCausalLM.from_pretrained(folder).eval()
        head = tiny_head(target)
    cfg = EngineConfig(rule=rule, theta=theta, num_draft_tokens=3, draft_sampling=draft_sampling, **engine)
    return LocalPool(WorkerConfig(engine=cfg), target=target, drafter=head)


def prompt_dataset(n: int = 16, seed: int = 0) -> Dataset:
    return Dataset.from_dict({"prompt": sentences(n, seed=seed)})


def length_reward(completions, **kwargs):
    """Completion length in words: varies within a group, so advantages are non-zero."""
    return [float(len(c.split())) for c in completions]


def grads_of_one_step(trainer) -> dict[str, torch.Tensor]:
    """-(delta of every parameter) after one SGD step at lr 1: the step's gradient."""
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    return {k: before[k] - v.detach() for k, v in trainer.model.named_parameters()}


__all__ = ["grads_of_one_step", "length_reward", "local_pool", "prompt_dataset", "save_tiny_world"]
