"""recipes/grpo_plain.py end to end on CPU: 2 GRPO steps with a tiny policy and tokenizer, the pool
(1 Ray actor) generating and receiving the weights after each step."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from tests.rollout.helpers import save_tiny_world, sentences

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "grpo_plain.py"


def load_recipe():
    spec = importlib.util.spec_from_file_location("grpo_plain", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_help_lists_every_config_field(capsys):
    recipe = load_recipe()
    with pytest.raises(SystemExit) as exit_info:
        recipe.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--prompts-per-step" in text and "--clip-eps" in text and "--num-actors" in text


def test_reward_and_advantages():
    import torch

    recipe = load_recipe()
    assert recipe.reward("so the answer is 1,234.", "steps... #### 1234") == 1.0
    assert recipe.reward("red cat", "dog") == 0.0
    adv = recipe.group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), group_size=2)
    assert adv[:2].sum().abs() < 1e-6 and adv[0] > 0 and torch.all(adv[2:] == 0)


@pytest.mark.usefixtures("ray_cluster")
def test_two_steps_end_to_end(tmp_path):
    folder = save_tiny_world(tmp_path / "policy")
    data = tmp_path / "data.jsonl"
    rows = [{"question": s, "answer": s.split()[0]} for s in sentences(8, seed=2)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = ["--model", folder, "--data", str(data), "--steps", "2", "--prompts-per-step", "2"]
    args += ["--group-size", "4", "--max-new-tokens", "6", "--lr", "1e-2", "--num-cpus-per-actor", "0.5"]
    history = load_recipe().main(args)
    assert [h["step"] for h in history] == [0, 1]
    assert [h["policy_version"] for h in history] == [0, 1]  # step 1 sampled with the updated weights
    for h in history:
        assert math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"])
        # strict rule and freshly synced weights: teacher forcing reproduces the behaviour log-probs
        assert abs(h["is_ratio_max"] - 1.0) < 1e-3 and abs(h["is_ratio_mean"] - 1.0) < 1e-4
