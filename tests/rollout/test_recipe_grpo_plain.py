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


def test_prompts_are_marsrl_datas():
    from marsrl.data import prompt_messages, render_prompt
    from tests.rollout.helpers import tiny_tokenizer

    recipe, tok = load_recipe(), tiny_tokenizer()
    chat = tok.apply_chat_template(prompt_messages("two cats"), add_generation_prompt=True, return_dict=True)
    assert recipe.encode(tok, "two cats") == list(chat["input_ids"])
    tok.chat_template = None
    assert recipe.encode(tok, "two cats") == tok(render_prompt("two cats"))["input_ids"]


def distinct_words(completions, answer, **_):
    """A reward with spread on a random tiny policy (the GSM8K reward is 0 for every completion there)."""
    return [len(set(c.split())) / 10 for c in completions]


@pytest.mark.usefixtures("ray_cluster")
def test_two_steps_end_to_end(tmp_path):
    folder = save_tiny_world(tmp_path / "policy")
    data = tmp_path / "data.jsonl"
    rows = [{"question": s, "answer": f"{s} #### {i}"} for i, s in enumerate(sentences(8, seed=2))]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = ["--model", folder, "--data", str(data), "--steps", "2", "--prompts-per-step", "2"]
    args += ["--group-size", "4", "--max-new-tokens", "6", "--lr", "1e-2", "--num-cpus-per-actor", "0.5"]
    history = load_recipe().main(args, reward_fn=distinct_words)
    assert [h["step"] for h in history] == [0, 1]
    assert [h["policy_version"] for h in history] == [0, 1]  # step 1 sampled with the updated weights
    assert any(h["grad_norm"] > 0 for h in history)  # the rewards had spread: the policy moved
    for h in history:
        assert math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"])
        # strict rule and freshly synced weights: teacher forcing reproduces the behaviour log-probs
        assert abs(h["is_ratio_max"] - 1.0) < 1e-3 and abs(h["is_ratio_mean"] - 1.0) < 1e-4
        assert h["relaxed_frac"] == 0.0 and abs(h["kl_behavior"]) < 1e-4 and h["tokens"] > 0
        assert 0.0 <= h["frac_zero_std_groups"] <= 1.0 and "top2_excess" in h


def test_gsm8k_reward_is_the_default():
    import inspect

    from marsrl.data import gsm8k_reward

    assert inspect.signature(load_recipe().main).parameters["reward_fn"].default is gsm8k_reward


def test_actors_ask_for_a_gpu_when_the_machine_has_one():
    recipe = load_recipe()
    assert recipe.parse_args([]).num_gpus_per_actor is None
    assert recipe.parse_args(["--num-gpus-per-actor", "0.5"]).num_gpus_per_actor == 0.5
    assert recipe.actor_gpus(None, cuda_available=True) == 1.0  # not 0: that meant rollouts on cuda:0
    assert recipe.actor_gpus(None, cuda_available=False) == 0.0
    assert recipe.actor_gpus(0.5, cuda_available=True) == 0.5
