"""Every file under configs/ (recursively) loads and validates as what it is: demo / rollouts YAMLs into
their dataclasses, experiment YAMLs (grpo_*.yaml) through load_experiment with every arm's MarsGRPOConfig
and PoolConfig built as a run builds them, DeepSpeed JSONs, accelerate YAMLs. A file of no known kind
fails; none is skipped. Recipes give their launch command in the header and restate no default."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from marsrl.commands.compare import CompareConfig
from marsrl.commands.demo import DemoConfig
from marsrl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
FILES = sorted(p for p in CONFIG_DIR.rglob("*") if p.is_file())
# filename prefix -> the dataclass its YAML overrides (top-level YAMLs other than experiments)
KINDS = {"demo": DemoConfig, "rollouts": CompareConfig}
# keys that say what a recipe is: stated even when they equal the default
IDENTITY = {"experiment", "model", "drafter", "data.source"}
# restated defaults already in files written before this check, to be removed there (then here)
KNOWN_RESTATED: dict[str, set[str]] = {}  # none: every experiment YAML keeps only what it changes


def _kind(path: Path) -> str:
    rel = path.relative_to(CONFIG_DIR)
    if rel.parts[0] == "deepspeed" and path.suffix == ".json":
        return "deepspeed"
    if rel.parts[0] == "accelerate" and path.suffix == ".yaml":
        return "accelerate"
    if len(rel.parts) == 1 and path.suffix == ".yaml":
        if path.name.startswith("grpo_"):
            return "experiment"
        return next((k for k in KINDS if path.name.startswith(k)), "unknown")
    return "unknown"


EXPERIMENTS = [p for p in FILES if _kind(p) == "experiment"]
RECIPES = [p for p in FILES if _kind(p) in ("experiment", *KINDS)]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    """Config paths inside configs (trainer.deepspeed, deepspeed_config_file) are relative to the repo root,
    where the launch lines run; a ZeRO-3 MarsGRPOConfig must not leave DeepSpeed's global switch on."""
    monkeypatch.chdir(REPO)
    yield
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


def test_every_kind_is_present():
    kinds = {_kind(p) for p in FILES}
    assert {"experiment", "deepspeed", "accelerate", "demo", "rollouts"} <= kinds, kinds


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(CONFIG_DIR)) for p in FILES])
def test_every_file_validates(path):
    kind = _kind(path)
    assert kind != "unknown", (
        f"{path}: no check for this kind of config (register it in tests/test_configs.py)"
    )
    CHECKS[kind](path)


def _check_dataclass_yaml(path):
    cls = KINDS[_kind(path)]
    assert isinstance(load_config(cls, path), cls)


def _check_experiment(path):
    from marsrl.experiment import load_experiment
    from marsrl.experiment.dry_run import plan_sources, pool_config
    from marsrl.experiment.run import arm_dir, trainer_args
    from marsrl.trainer import MarsGRPOConfig

    cfg = load_experiment(path)
    sources, _ = plan_sources(cfg)  # the folders a run would use; builds no tiny world
    for arm in cfg.arms:
        args = trainer_args(cfg, arm, arm_dir(cfg, arm), use_wandb=False)
        assert isinstance(args, MarsGRPOConfig) and args.is_correction == arm.is_correction
        for key, value in cfg.trainer.items():
            assert getattr(args, key) == value, f"{path.name}: trainer.{key} did not reach MarsGRPOConfig"
        pool = pool_config(cfg, arm, sources)
        assert (pool.worker.engine.rule, pool.worker.engine.relax_prob) == (arm.rule, arm.relax_prob)
        assert pool.worker.target == sources.model and pool.worker.drafter == sources.drafter


def _check_deepspeed(path):
    ds = json.loads(path.read_text())
    assert ds["zero_optimization"]["stage"] in (2, 3), path.name
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        # the trainer section decides the batch; a number here would fight it at launch
        assert ds.get(key, "auto") == "auto", f"{path.name}: {key} must be 'auto'"


def _check_accelerate(path):
    from accelerate.commands.config.config_args import ClusterConfig

    acc = ClusterConfig.from_yaml_file(str(path))  # accelerate's own loader: unknown keys are errors
    assert acc.distributed_type == "DEEPSPEED", path.name
    ds_file = Path(acc.deepspeed_config["deepspeed_config_file"])
    assert (REPO / ds_file).is_file(), f"{path.name}: {ds_file} does not exist"
    stage = json.loads((REPO / ds_file).read_text())["zero_optimization"]["stage"]
    assert bool(acc.deepspeed_config.get("zero3_init_flag")) == (stage == 3), path.name


CHECKS = {
    "demo": _check_dataclass_yaml,
    "rollouts": _check_dataclass_yaml,
    "experiment": _check_experiment,
    "deepspeed": _check_deepspeed,
    "accelerate": _check_accelerate,
}


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_header_gives_the_launch_command(path):
    first = path.read_text().splitlines()[:3]
    assert any("Launch:" in line for line in first), f"{path.name}: header must give the launch command"


def _restated(cls, values: dict, prefix: str, nested: dict | None = None) -> set[str]:
    """Keys of ``values`` whose value equals ``cls``'s default (``nested``: section name -> its class)."""
    nested = nested or {}
    out = set()
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        if key in nested and isinstance(value, dict):
            out |= _restated(nested[key][0], value, f"{prefix}{key}.", nested[key][1])
            continue
        f = defaults[key]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if value == default or (isinstance(default, tuple) and tuple(value) == default):
            out.add(prefix + key)
    return out


def restated_defaults(path: Path) -> set[str]:
    """Dotted keys of an experiment YAML whose value is the default (the trainer's: MarsGRPOConfig as
    run.trainer_args fills it in without the trainer section)."""
    from marsrl.engine import EngineConfig
    from marsrl.experiment import ExperimentConfig, load_experiment
    from marsrl.experiment.config import DataConfig, EvalConfig, WandbConfig
    from marsrl.experiment.run import arm_dir, trainer_args
    from marsrl.rollout import PoolConfig, WorkerConfig

    raw = yaml.safe_load(path.read_text())
    sections = {"data": (DataConfig, None), "eval": (EvalConfig, None), "wandb": (WandbConfig, None)}
    top = {k: v for k, v in raw.items() if k not in ("pool", "trainer", "arms")}
    restated = _restated(ExperimentConfig, top, "", sections)
    engine = {"engine": (EngineConfig, None)}
    restated |= _restated(PoolConfig, raw.get("pool") or {}, "pool.", {"worker": (WorkerConfig, engine)})
    cfg = load_experiment(path)
    arm = cfg.arms[0]
    args = trainer_args(cfg, arm, arm_dir(cfg, arm), use_wandb=False)
    base = trainer_args(dataclasses.replace(cfg, trainer={}), arm, arm_dir(cfg, arm), use_wandb=False)
    return restated | {f"trainer.{k}" for k in cfg.trainer if getattr(args, k) == getattr(base, k)}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.name for p in EXPERIMENTS])
def test_experiment_restates_no_default(path):
    new = restated_defaults(path) - IDENTITY - KNOWN_RESTATED.get(path.name, set())
    assert not new, f"{path.name} restates defaults {sorted(new)}: delete them (defaults live in one place)"


def test_restated_defaults_are_found(tmp_path):
    f = tmp_path / "grpo_restating.yaml"
    f.write_text(
        "model: tinyworld:micro\ndata: {n_eval: 200, n_train: 8}\n"
        "pool: {num_actors: 1, num_gpus_per_actor: 1, "
        "worker: {dtype: auto, engine: {num_draft_tokens: 7, max_batch_size: 8}}}\n"
        "trainer: {learning_rate: 1.0e-6, save_steps: 10, max_steps: 3}\n"
    )
    assert restated_defaults(f) == {
        "data.n_eval",
        "pool.num_actors",
        "pool.worker.dtype",
        "pool.worker.engine.num_draft_tokens",
        "trainer.learning_rate",
        "trainer.save_steps",
    }


GPU_RECIPES = [p for p in EXPERIMENTS if not yaml.safe_load(p.read_text())["model"].startswith("tinyworld:")]


def test_there_are_gpu_recipes():
    assert {p.name for p in GPU_RECIPES} >= {"grpo_qwen3_8b_mars.yaml", "grpo_llama31_8b_mars.yaml"}


@pytest.mark.parametrize("path", GPU_RECIPES, ids=[p.name for p in GPU_RECIPES])
def test_gpu_recipe_plan(path):
    """What the headers promise: actors on GPUs of their own in bf16, ZeRO-3, TRL's GRPO defaults (which
    the recipes inherit rather than restate), the three default arms."""
    from marsrl.experiment import DEFAULT_ARMS, load_experiment
    from marsrl.experiment.dry_run import plan_sources, pool_config, zero_stage
    from marsrl.experiment.run import arm_dir, trainer_args

    cfg = load_experiment(path)
    assert cfg.arms == DEFAULT_ARMS and cfg.data.source == "openai/gsm8k" and cfg.data.hub_config == "main"
    pool = pool_config(cfg, cfg.arms[0], plan_sources(cfg)[0])
    assert pool.num_actors == 4 and pool.num_gpus_per_actor == 1
    assert (pool.worker.device, pool.worker.dtype) == ("cuda", "bfloat16")
    args = trainer_args(cfg, cfg.arms[0], arm_dir(cfg, cfg.arms[0]), use_wandb=False)
    assert zero_stage(args.deepspeed) == 3
    assert (args.learning_rate, args.num_generations, args.max_completion_length, args.temperature) == (
        1e-6,
        8,
        512,
        1.0,
    )
    assert args.activation_checkpointing is True and args.beta == 0.0 and args.loss_type == "dapo"
    first = path.read_text().splitlines()[1]
    assert (
        f"-m marsrl train --config configs/{path.name}" in first and "configs/accelerate/zero3.yaml" in first
    )


def test_unknown_key_names_file_and_key(tmp_path):
    bad = tmp_path / "demo_bad.yaml"
    bad.write_text("thetaa: 0.8\n")
    with pytest.raises(ConfigError, match=r"demo_bad\.yaml.*thetaa"):
        load_config(DemoConfig, bad)


def test_wrong_type_and_bad_value(tmp_path):
    with pytest.raises(ConfigError, match="rounds"):
        load_config(DemoConfig, None, ["rounds=many"])
    with pytest.raises(ConfigError, match="theta"):
        load_config(DemoConfig, None, ["theta=-1"])
    with pytest.raises(ConfigError, match="rules"):
        load_config(DemoConfig, None, ["rules=[strict, lenient]"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(DemoConfig, tmp_path / "missing.yaml")


def test_overrides_win_over_file(tmp_path):
    f = tmp_path / "demo.yaml"
    f.write_text("theta: 0.8\nrounds: 10\n")
    cfg = load_config(DemoConfig, f, ["theta=0.95", "temperature=0"])
    assert (cfg.theta, cfg.rounds, cfg.temperature) == (0.95, 10, 0.0)
    assert load_config(DemoConfig).theta == DemoConfig().theta  # defaults live in the dataclass only
