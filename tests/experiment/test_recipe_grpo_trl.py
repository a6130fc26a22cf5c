"""recipes/grpo_trl.py, the readable TRL recipe, trains one mars arm on the micro world (CPU, in-process
rollout worker), with held-out accuracy measured before and after: 2 steps in the default run, 20 in the
slow one (``pytest -m slow``; `marsrl train`, which uses the same building blocks, is tested end to end in
test_train_micro)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _train(tmp_path, steps: int, n_eval: int) -> dict:
    spec = importlib.util.spec_from_file_location("grpo_trl", REPO / "recipes" / "grpo_trl.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    results = recipe.main(
        [
            "--config",
            str(REPO / "configs" / "grpo_micro.yaml"),
            "--set",
            f"output_dir={tmp_path}",
            "--set",
            f"trainer.max_steps={steps}",
            "--set",
            "trainer.per_device_train_batch_size=8",
            "--set",
            "trainer.save_strategy=no",
            "--set",
            f"data.n_eval={n_eval}",
            "--set",
            "arms=[{name: mars_l0.9, rule: mars, relax_prob: 0.9}]",
        ]
    )
    arm = results["mars_l0.9"]
    assert len(arm["rewards"]) == steps
    assert all(0.0 <= r <= 1.0 for r in arm["rewards"])
    assert arm["before"]["n"] == arm["after"]["n"] == n_eval
    return arm


def test_recipe_trains_two_steps(tmp_path):
    _train(tmp_path, 2, 8)


@pytest.mark.slow  # 81 s; the same loop as test_recipe_trains_two_steps, ten times longer
def test_recipe_trains_twenty_steps(tmp_path):
    _train(tmp_path, 20, 16)
