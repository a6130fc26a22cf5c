"""recipes/grpo_trl.py, the readable TRL recipe, trains 20 steps of one mars arm on the micro world (CPU,
in-process rollout worker), with held-out accuracy measured before and after."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_recipe_trains_twenty_steps(tmp_path):
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
            "trainer.max_steps=20",
            "--set",
            "trainer.per_device_train_batch_size=8",
            "--set",
            "trainer.save_strategy=no",
            "--set",
            "data.n_eval=16",
            "--set",
            "arms=[{name: mars_l0.9, rule: mars, relax_prob: 0.9}]",
        ]
    )
    arm = results["mars_l0.9"]
    assert len(arm["rewards"]) == 20
    assert all(0.0 <= r <= 1.0 for r in arm["rewards"])
    assert arm["before"]["n"] == arm["after"]["n"] == 16
