"""GRPO on TRL with MARS rollouts, one arm per run of the loop below: the readable recipe behind
``marsrl train`` (which adds resume, wandb and the report around these same calls).

    python recipes/grpo_trl.py --config configs/grpo_tiny.yaml
    python recipes/grpo_trl.py --config configs/grpo_micro.yaml --set trainer.max_steps=2
    accelerate launch --config_file configs/accelerate/zero3.yaml recipes/grpo_trl.py \
        --config configs/grpo_qwen3_8b_mars.yaml

Each arm: resolve the model and drafter (``tinyworld:<preset>`` builds the embedded world) -> prompts and
held-out problems -> a RolloutPool whose engine verifies with the arm's rule, theta and relax_prob ->
``MarsGRPOTrainer`` (TRL's GRPOTrainer that corrects the loss with the rollout's behaviour log-probs,
measures the top-1/top-2 bias in its own forward and keeps the EAGLE-3 head in step) -> held-out accuracy
before and after.

How it departs from textbook GRPO: no separate pi_old (one optimizer step per batch); the importance
weight's denominator is the behaviour log-prob of the speculative rollout, which also absorbs the
rollout/trainer numerical mismatch; DAPO's token-level loss and beta = 0 are TRL's defaults.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from marsrl.drafter import Eagle3Drafter
from marsrl.experiment.config import load_experiment
from marsrl.experiment.run import (
    build_pool,
    evaluate,
    load_data,
    resolve_sources,
    reward_functions,
    trainer_args,
)
from marsrl.trainer import MarsGRPOTrainer


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/grpo_tiny.yaml")
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override, e.g. trainer.max_steps=5"
    )
    args = parser.parse_args(argv)
    cfg = load_experiment(args.config, args.set)
    sources = resolve_sources(cfg)
    train_ds, heldout = load_data(cfg, sources.world)
    results = {}
    for arm in cfg.arms:
        out = f"{cfg.output_dir}/{cfg.experiment}-recipe/{arm.name}"
        tokenizer = AutoTokenizer.from_pretrained(sources.model)
        model = AutoModelForCausalLM.from_pretrained(sources.model)
        targs = trainer_args(cfg, arm, Path(out), use_wandb=False)
        drafter = None
        if targs.draft_refresh_every and sources.drafter:
            drafter = Eagle3Drafter.from_pretrained(sources.drafter, target=model)
        before = evaluate(model, tokenizer, heldout, cfg, targs, cfg.seed)
        pool = build_pool(cfg, arm, sources)
        try:
            trainer = MarsGRPOTrainer(
                model, reward_functions(cfg.rewards), targs, train_ds, tokenizer, pool=pool, drafter=drafter
            )
            trainer.train()
        finally:
            if pool is not None:
                pool.shutdown()
        after = evaluate(trainer.model, tokenizer, heldout, cfg, targs, cfg.seed)
        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
        results[arm.name] = {"before": before, "after": after, "rewards": rewards}
        print(
            json.dumps(
                {
                    "arm": arm.name,
                    "accuracy_before": before["accuracy"],
                    "accuracy_after": after["accuracy"],
                    "final_reward": rewards[-1] if rewards else None,
                }
            )
        )
    return results


if __name__ == "__main__":
    main()
