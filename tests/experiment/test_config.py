"""The experiment YAML: unknown keys and bad values in every section are ConfigErrors naming the file and
the key; ``--set section.key=value`` overrides reach into sections; arm names are unique; what the
experiment owns (the correction per arm, folders, logging, seed) is refused in the trainer section."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from marsrl.config import ConfigError
from marsrl.experiment import DEFAULT_ARMS, ExperimentConfig, load_experiment


def _write(tmp_path, text: str, name: str = "grpo_case.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# section -> (YAML, the key the error must name)
UNKNOWN = {
    "top level": ("seedd: 1\n", "seedd"),
    "data": ("data: {n_evall: 3}\n", "n_evall"),
    "eval": ("eval: {greedy: true}\n", "greedy"),
    "wandb": ("wandb: {projekt: x}\n", "projekt"),
    "arms": ("arms: [{name: a, thetaa: 0.5}]\n", "thetaa"),
}
BAD_VALUE = {
    "top level": ("seed: many\n", "seed"),
    "rewards": ("rewards: [gsm8k, bogus]\n", "rewards"),
    "data": ("data: {n_eval: 0}\n", "n_eval"),
    "eval": ("eval: {batch_size: 0}\n", "batch_size"),
    "wandb": ("wandb: {mode: loud}\n", "mode"),
    "arms": ("arms: [{name: a, rule: lenient}]\n", "rule"),
    "arms (lambda)": ("arms: [{name: a, rule: mars, relax_prob: 1.5}]\n", "relax_prob"),
    "pool (not a mapping)": ("pool: 3\n", "pool"),
    "pool (rule set per arm)": ("pool: {worker: {engine: {rule: mars}}}\n", "rule"),
    "trainer (not a mapping)": ("trainer: [1]\n", "trainer"),
}


@pytest.mark.parametrize("section", list(UNKNOWN))
def test_unknown_key_names_file_and_key(tmp_path, section):
    text, key = UNKNOWN[section]
    with pytest.raises(ConfigError, match=rf"grpo_case\.yaml.*{key}"):
        load_experiment(_write(tmp_path, text))


@pytest.mark.parametrize("section", list(BAD_VALUE))
def test_bad_value_names_file_and_key(tmp_path, section):
    text, key = BAD_VALUE[section]
    with pytest.raises(ConfigError, match=rf"grpo_case\.yaml.*{key}"):
        load_experiment(_write(tmp_path, text))


@pytest.mark.parametrize(
    "text, key",
    [
        ("pool: {num_actorz: 2}\n", "num_actorz"),
        ("pool: {worker: {engine: {num_draft_tokenz: 2}}}\n", "num_draft_tokenz"),
        ("trainer: {max_stepz: 2}\n", "max_stepz"),
    ],
)
def test_unknown_pool_and_trainer_keys_at_load(tmp_path, text, key):
    with pytest.raises(ConfigError, match=rf"grpo_case\.yaml.*{key}"):
        load_experiment(_write(tmp_path, text))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_experiment(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"grpo_case\.yaml: not valid YAML"):
        load_experiment(_write(tmp_path, "trainer: {max_steps: [\n"))
    with pytest.raises(ConfigError, match=r"grpo_case\.yaml: expected a mapping"):
        load_experiment(_write(tmp_path, "- 1\n- 2\n"))


def test_overrides_reach_into_sections(tmp_path):
    path = _write(tmp_path, "trainer: {max_steps: 40, learning_rate: 2.0e-4}\ndata: {n_eval: 50}\n")
    cfg = load_experiment(
        path, ["trainer.max_steps=3", "data.n_eval=5", "pool.worker.engine.num_draft_tokens=5", "seed=7"]
    )
    assert cfg.trainer == {"max_steps": 3, "learning_rate": 2.0e-4}  # the override wins, the rest stays
    assert (cfg.data.n_eval, cfg.seed) == (5, 7)
    assert cfg.pool == {"worker": {"engine": {"num_draft_tokens": 5}}}
    assert cfg.data.n_train == ExperimentConfig().data.n_train  # untouched fields keep the defaults
    arms = load_experiment(None, ["arms=[{name: only, rule: mars, relax_prob: 0.5}]"]).arms
    assert [(a.name, a.rule, a.relax_prob) for a in arms] == [("only", "mars", 0.5)]


def test_bad_override_names_the_override(tmp_path):
    with pytest.raises(ConfigError, match=r"\+ overrides.*n_eval"):
        load_experiment(_write(tmp_path, ""), ["data.n_eval=0"])
    with pytest.raises(ConfigError, match="'model' is not a section"):
        load_experiment(_write(tmp_path, "model: tinyworld:micro\n"), ["model.name=x"])
    with pytest.raises(ConfigError, match="key=value"):
        load_experiment(None, ["trainer.max_steps"])


def test_exponent_floats_are_numbers_and_numeric_trainer_fields_are_checked(tmp_path):
    """``5e-4`` (no dot) is a float in the file and in ``--set`` (YAML 1.2; PyYAML alone reads a string),
    and any numeric MarsGRPOConfig field given something else fails at load, naming the field."""
    cfg = load_experiment(
        _write(tmp_path, "trainer: {learning_rate: 5e-4}\n"), ["trainer.draft_refresh_lr=1E-3"]
    )
    assert cfg.trainer == {"learning_rate": 5e-4, "draft_refresh_lr": 1e-3}
    with pytest.raises(ConfigError, match=r"trainer\.draft_refresh_lr must be a number, got 'fast'"):
        load_experiment(None, ["trainer.draft_refresh_lr=fast"])
    with pytest.raises(ConfigError, match=r"trainer\.draft_refresh_every must be an integer, got 2\.5"):
        load_experiment(None, ["trainer.draft_refresh_every=2.5"])
    with pytest.raises(ConfigError, match=r"trainer\.top_k must be an integer, got True"):
        load_experiment(None, ["trainer.top_k=true"])
    assert load_experiment(None, ["trainer.draft_refresh_grad_clip=null"]).trainer == {
        "draft_refresh_grad_clip": None
    }


def test_defaults_are_the_dataclasses():
    cfg = load_experiment(None)
    assert cfg == ExperimentConfig() and cfg.arms == DEFAULT_ARMS
    assert [a.name for a in DEFAULT_ARMS] == ["strict", "mars", "mars_l0.9"]


def test_duplicate_arm_names_refused(tmp_path):
    path = _write(tmp_path, "arms: [{name: a, rule: strict}, {name: a, rule: mars}]\n")
    with pytest.raises(ConfigError, match=r"grpo_case\.yaml.*names must be unique.*'a', 'a'"):
        load_experiment(path)


def test_arm_name_must_be_a_folder_name(tmp_path):
    with pytest.raises(ConfigError, match=r"grpo_case\.yaml.*arm name 'a/b'"):
        load_experiment(_write(tmp_path, "arms: [{name: a/b}]\n"))


@pytest.mark.parametrize("key", ["is_correction", "output_dir", "run_name", "report_to", "seed"])
def test_trainer_fields_owned_by_the_experiment_are_refused(tmp_path, key):
    with pytest.raises(ConfigError, match=rf"grpo_case\.yaml.*trainer\.{key}"):
        load_experiment(_write(tmp_path, f"trainer: {{{key}: none}}\n"))


def test_is_correction_points_at_arms(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer\.is_correction.*arms"):
        load_experiment(_write(tmp_path, "trainer: {is_correction: sequence_mask}\n"))
    cfg = load_experiment(_write(tmp_path, "arms: [{name: m, rule: mars, is_correction: sequence_mask}]\n"))
    assert cfg.arms[0].is_correction == "sequence_mask"  # where it belongs


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_trainer_threads_keep_torchs_count_unless_set(backend):
    """The workers and the trainer take turns, so with either backend the trainer keeps the count torch
    has (OMP_NUM_THREADS) whatever the workers use; ``torch_threads`` overrides it."""
    from marsrl.experiment.run import trainer_threads

    pool = {"num_actors": 2, "worker": {"torch_threads": 1}}
    cfg = ExperimentConfig(pool_backend=backend, pool=pool)
    assert trainer_threads(cfg, 2) == 2
    assert trainer_threads(cfg, 1) == 1
    assert trainer_threads(dataclasses.replace(cfg, torch_threads=3), 2) == 3


def test_the_world_builds_with_the_trainers_threads(monkeypatch):
    """``marsrl train`` builds the tiny world before anything else runs, so it trains with the trainer's
    thread count (torch's, or ``torch_threads``), not the library default of one."""
    import torch

    import marsrl.tinyworld as tinyworld
    from marsrl.experiment.run import resolve_sources

    calls = []
    monkeypatch.setattr(
        tinyworld, "build_tinyworld", lambda preset, **kw: calls.append((preset, kw)) or Path("/w")
    )
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    resolve_sources(ExperimentConfig(), progress=False)
    assert calls and all(kw["threads"] == 2 for _, kw in calls)
    calls.clear()
    resolve_sources(ExperimentConfig(torch_threads=1), progress=False)
    assert all(kw["threads"] == 1 for _, kw in calls)
