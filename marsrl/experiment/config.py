"""The experiment's config: one YAML names the model, the drafter, the data, the rewards, the pool, the
trainer fields and the ``arms`` (named rule variants run one after the other with the same everything
else). Defaults live in these dataclasses (and, for the trainer, in ``MarsGRPOConfig``); the YAML and
``--set section.key=value`` only override; unknown keys are errors naming the file and the key."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..config import ConfigError, build_config, parse_overrides, read_yaml_mapping
from ..trainer.config import IS_CORRECTIONS, IsCorrection
from ..verify import DEFAULT_THETA, RULES, Rule

TINYWORLD = "tinyworld:"  # model / drafter "tinyworld:<preset>": the embedded CPU world, built and cached
REWARDS = ("gsm8k", "format")


@dataclass(frozen=True)
class ArmConfig:
    """One variant of the experiment: how rollouts are verified and how the trainer corrects them."""

    name: str
    rule: Rule = "strict"
    theta: float = DEFAULT_THETA
    relax_prob: float = 1.0  # lambda: 1 = the paper's rule; < 1 keeps every weight pi/b <= 1/(1 - lambda)
    is_correction: IsCorrection = "token_truncate"

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.name or ""):
            raise ValueError(
                f"arm name {self.name!r} must be letters, digits, '_', '.' or '-' (a folder name)"
            )
        if self.rule not in RULES:
            raise ValueError(f"arm {self.name}: rule must be one of {list(RULES)}, got {self.rule!r}")
        if not self.theta >= 0:
            raise ValueError(f"arm {self.name}: theta must be >= 0, got {self.theta}")
        if not 0.0 <= self.relax_prob <= 1.0:
            raise ValueError(f"arm {self.name}: relax_prob must be in [0, 1], got {self.relax_prob}")
        if self.is_correction not in IS_CORRECTIONS:
            raise ValueError(f"arm {self.name}: is_correction must be one of {list(IS_CORRECTIONS)}")

    @property
    def tags(self) -> list[str]:
        return [
            f"rule:{self.rule}",
            f"theta:{self.theta:g}",
            f"lambda:{self.relax_prob:g}",
            f"correction:{self.is_correction}",
        ]


DEFAULT_ARMS = (
    ArmConfig("strict", rule="strict"),
    ArmConfig(
        "mars", rule="mars", relax_prob=1.0
    ),  # the paper's rule, corrected as far as its support allows
    ArmConfig("mars_l0.9", rule="mars", relax_prob=0.9),  # exactly correctable
)


@dataclass(frozen=True)
class DataConfig:
    """Where prompts and answers come from."""

    source: str = (
        "tinyworld"  # "tinyworld" (generated GSM-style problems), a local .jsonl/.json/.parquet, or a hub id
    )
    hub_config: str | None = "main"  # the hub dataset's config (GSM8K: "main")
    train_split: str = "train"
    eval_split: str = "test"  # a local file serves both: its first n_eval rows are held out
    n_train: int | None = 512  # prompts used for training (None: all)
    n_eval: int = 200  # held-out problems for accuracy before and after training

    def __post_init__(self):
        if self.n_train is not None and self.n_train < 1:
            raise ValueError(f"data.n_train must be None or >= 1, got {self.n_train}")
        if self.n_eval < 1:
            raise ValueError(f"data.n_eval must be >= 1, got {self.n_eval}")


@dataclass(frozen=True)
class EvalConfig:
    """Held-out accuracy (plain decoding with the policy itself, ``data.n_eval`` problems, the same for
    every arm): at each of ``temperatures`` before training, every ``every`` steps and after
    (``marsrl.experiment.evaluate``)."""

    temperature: float = 0.0  # run.evaluate's single temperature (0: greedy)
    temperatures: tuple[float, ...] = (1.0, 0.0)  # 1: the rollout temperature GRPO optimises; 0: greedy
    every: int | None = None  # evaluate every N steps (None: ceil(max_steps / 4); 0: before, after)
    seed: int | None = None  # sampling seed of the evaluations (None: the experiment's seed)
    max_new_tokens: int | None = None  # None: the trainer's max_completion_length
    batch_size: int = 64

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"eval.temperature must be >= 0, got {self.temperature}")
        temps = tuple(float(t) for t in self.temperatures)
        object.__setattr__(self, "temperatures", temps)
        if not temps or any(not t >= 0 for t in temps) or len(set(temps)) != len(temps):
            raise ValueError(f"eval.temperatures must be distinct values >= 0, got {list(temps)}")
        if self.every is not None and self.every < 0:
            raise ValueError(f"eval.every must be None or >= 0, got {self.every}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"eval.max_new_tokens must be None or >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ValueError(f"eval.batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class WandbConfig:
    project: str = "marsrl"
    mode: Literal["auto", "offline", "online", "disabled"] = "auto"  # auto: online when logged in
    entity: str | None = None


@dataclass(frozen=True)
class ReportConfig:
    """What the report compares that must be fixed before the run."""

    target_reward: float | None = None  # the reward level whose time to reach (EMA-smoothed) is compared


@dataclass(frozen=True)
class ExperimentConfig:
    """``marsrl train``: the strict-vs-MARS GRPO experiment."""

    experiment: str = "grpo_tiny"
    output_dir: str = "outputs"
    seed: int = 0
    # several seeds: every arm once per seed, into <output_dir>/<experiment>/seed-<s>/<arm>/, and the
    # report aggregates over them; None: the one ``seed``, into <output_dir>/<experiment>/<arm>/
    seeds: tuple[int, ...] | None = None
    model: str = "tinyworld:default"  # a folder, a hub id, or tinyworld:<preset>
    drafter: str | None = (
        "tinyworld:default"  # EAGLE-3 head folder / hub id / tinyworld:<preset>; None: plain
    )
    data: DataConfig = field(default_factory=DataConfig)
    rewards: tuple[str, ...] = ("gsm8k",)
    pool: dict = field(
        default_factory=dict
    )  # PoolConfig overrides (num_actors, worker.engine.num_draft_tokens, ...)
    pool_backend: Literal["ray", "local"] = "ray"  # local: one in-process worker (no Ray; tests, debugging)
    trainer: dict = field(default_factory=dict)  # MarsGRPOConfig overrides
    arms: tuple[ArmConfig, ...] = DEFAULT_ARMS
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    # repeats of the interleaved per-step rollout timing after training (timing.json; 0: none), rounded up
    # to whole rotations of the timed arms (the arms and an A/A copy of the first)
    timing_repeats: int = 9
    samples_per_step: int = 4  # trajectories with their per-token record written to samples.jsonl per step
    # torch threads of the trainer's process; None: torch's count (OMP_NUM_THREADS): the rollout workers and
    # the trainer take turns (run.trainer_threads)
    torch_threads: int | None = None

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.experiment or ""):
            raise ValueError(f"experiment {self.experiment!r} must be a folder name (letters, digits, _ . -)")
        if not self.arms:
            raise ValueError("arms must name at least one arm")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arms: names must be unique, got {names}")
        bad = sorted(set(self.rewards) - set(REWARDS))
        if not self.rewards or bad:
            raise ValueError(
                f"rewards must be a non-empty subset of {list(REWARDS)}, got {list(self.rewards)}"
            )
        if self.samples_per_step < 0:
            raise ValueError(f"samples_per_step must be >= 0, got {self.samples_per_step}")
        if self.seeds is not None and (not self.seeds or len(set(self.seeds)) != len(self.seeds)):
            raise ValueError(f"seeds must be None or distinct integers, got {list(self.seeds)}")
        if self.timing_repeats < 0:
            raise ValueError(f"timing_repeats must be >= 0, got {self.timing_repeats}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be None or >= 1, got {self.torch_threads}")
        for key in ("rule", "theta", "relax_prob"):
            engine = (self.pool.get("worker") or {}).get("engine") or {}
            if key in engine:
                raise ValueError(f"pool.worker.engine.{key} is set per arm (arms[].{key}), not in pool")
        for key in ("is_correction", "output_dir", "run_name", "report_to", "seed"):
            if key in self.trainer:
                raise ValueError(f"trainer.{key} is set by the experiment (arms / output_dir / wandb / seed)")

    @property
    def seed_list(self) -> tuple[int, ...]:
        return self.seeds if self.seeds is not None else (self.seed,)

    def for_seed(self, seed: int) -> ExperimentConfig:
        """This experiment at one of its seeds (``seeds`` kept: the run folder layout follows it)."""
        return dataclasses.replace(self, seed=seed)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples as lists): for config.yaml and wandb's config."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


_SECTIONS = {"data": DataConfig, "eval": EvalConfig, "wandb": WandbConfig, "report": ReportConfig}


def build_experiment(values: dict[str, Any], where: str) -> ExperimentConfig:
    """An ExperimentConfig from nested mappings; every error names ``where`` and the key."""
    values = dict(values)
    nested: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        section = values.pop(name, None)
        if section is not None and not isinstance(section, dict):
            raise ConfigError(f"{where}: '{name}' must be a mapping")
        nested[name] = build_config(cls, section or {}, f"{where} ({name})")
    arms = values.pop("arms", None)
    if arms is not None:
        if not isinstance(arms, list) or not all(isinstance(a, dict) for a in arms):
            raise ConfigError(
                f"{where}: 'arms' must be a list of mappings (name, rule, theta, relax_prob, ...)"
            )
        nested["arms"] = tuple(build_config(ArmConfig, a, f"{where} (arms[{i}])") for i, a in enumerate(arms))
    for name in ("pool", "trainer"):
        if name in values and not isinstance(values[name] or {}, dict):
            raise ConfigError(f"{where}: '{name}' must be a mapping")
        values[name] = dict(values.get(name) or {})
    _check_pool_and_trainer_keys(values["pool"], values["trainer"], where)
    if "rewards" in values and isinstance(values["rewards"], str):
        values["rewards"] = [values["rewards"]]
    cfg = build_config(ExperimentConfig, {k: v for k, v in values.items()}, where)
    try:
        return dataclasses.replace(cfg, **nested)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from err


def _check_pool_and_trainer_keys(pool: dict, trainer: dict, where: str) -> None:
    """Unknown pool keys (any depth) and unknown trainer fields fail at load, naming the file; the trainer's
    values are checked when MarsGRPOConfig is built (run.trainer_args)."""
    from ..rollout.config import PoolConfig
    from ..trainer.config import MarsGRPOConfig

    try:
        PoolConfig.from_dict(pool, f"{where} (pool)")
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"{where} (pool): {err}") from err
    unknown = sorted(set(trainer) - {f.name for f in dataclasses.fields(MarsGRPOConfig)})
    if unknown:
        raise ConfigError(
            f"{where} (trainer): unknown key(s) {unknown}; see MarsGRPOConfig / TRL's GRPOConfig"
        )
    _check_trainer_values(trainer, where)


def _positive(v) -> bool:
    return v > 0


def _at_least_one(v) -> bool:
    return v >= 1


def _non_negative(v) -> bool:
    return v >= 0


# Trainer fields whose bad values TRL or torch would only reject after the model is loaded (or never):
# field -> (test, what the value must be).
_TRAINER_CHECKS: dict[str, tuple[Any, str]] = {
    "learning_rate": (_positive, "> 0"),
    "max_steps": (_positive, "> 0 (leave it unset to train for num_train_epochs)"),
    "num_train_epochs": (_positive, "> 0"),
    "num_generations": (lambda v: v >= 2, ">= 2 (GRPO's advantage compares completions within a group)"),
    "per_device_train_batch_size": (_at_least_one, ">= 1"),
    "gradient_accumulation_steps": (_at_least_one, ">= 1"),
    "steps_per_generation": (_at_least_one, ">= 1"),
    "num_iterations": (_at_least_one, ">= 1"),
    "max_completion_length": (_at_least_one, ">= 1"),
    "save_steps": (_positive, "> 0"),
    "temperature": (_positive, "> 0 (the correction needs the sampling distribution's log-probs)"),
    "beta": (_non_negative, ">= 0"),
    "epsilon": (_non_negative, ">= 0"),
    "weight_decay": (_non_negative, ">= 0"),
    "max_grad_norm": (_non_negative, ">= 0"),
    "warmup_ratio": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "warmup_steps": (_non_negative, ">= 0"),
}


# Trainer fields with a fixed set of values that TRL only checks inside its loss, mid-run.
_TRAINER_CHOICES: dict[str, tuple[str, ...]] = {
    "loss_type": ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"),
    "importance_sampling_level": ("token", "sequence"),
}


_type_hints = functools.cache(typing.get_type_hints)


def _numeric_kind(cls, name: str) -> type | None:
    """int or float when ``cls.name`` is annotated as one (optionally ``| None``), else None."""
    hint = _type_hints(cls).get(name)
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = {a for a in args if a is not type(None)}
    return kinds.pop() if len(kinds) == 1 and kinds <= {int, float} else None


def _check_trainer_values(trainer: dict, where: str) -> None:
    """One ConfigError naming the file and ``trainer.<field>`` for a value TRL or torch would reject late,
    and for a group size that does not divide the completions of one generation."""
    from ..trainer.config import MarsGRPOConfig

    for name, value in trainer.items():
        kind = _numeric_kind(MarsGRPOConfig, name)
        if kind is None or value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (kind is int and isinstance(value, float))
        ):
            what = "an integer" if kind is int else "a number"
            raise ConfigError(f"{where}: trainer.{name} must be {what}, got {value!r}")
    for name, (test, must) in _TRAINER_CHECKS.items():
        if name not in trainer or trainer[name] is None:
            continue
        value = trainer[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ConfigError(f"{where}: trainer.{name} must be a number, got {value!r}")
        if not test(value):
            raise ConfigError(f"{where}: trainer.{name} must be {must}, got {value!r}")
    for name, choices in _TRAINER_CHOICES.items():
        if name in trainer and trainer[name] not in choices:
            raise ConfigError(
                f"{where}: trainer.{name} must be one of {list(choices)}, got {trainer[name]!r}"
            )
    defaults = {f.name: f.default for f in dataclasses.fields(MarsGRPOConfig)}
    get = lambda k: trainer[k] if trainer.get(k) is not None else defaults[k]  # noqa: E731
    steps = get("steps_per_generation") or get("gradient_accumulation_steps")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    batch = get("per_device_train_batch_size") * steps * world
    if batch % get("num_generations"):
        raise ConfigError(
            f"{where}: trainer.num_generations ({get('num_generations')}) must divide the completions of "
            f"one generation: per_device_train_batch_size {get('per_device_train_batch_size')} x "
            f"steps_per_generation {steps} x {world} process(es) = {batch}"
        )


def load_experiment(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Defaults, then the YAML at ``path``, then ``section.key=value`` overrides (dots reach into
    sections: ``trainer.max_steps=5``, ``data.n_eval=50``, ``pool.worker.engine.num_draft_tokens=5``)."""
    values: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        values = read_yaml_mapping(path)
        where = str(path)
    over = parse_overrides(overrides)
    for dotted, value in over.items():
        target = values
        *parents, leaf = dotted.split(".")
        for p in parents:
            nxt = target.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {dotted!r}: '{p}' is not a section")
            target = nxt
        target[leaf] = value
    if over:
        where += " + overrides"
    return build_experiment(values, where)


def dump_experiment(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML (what a run folder's config.yaml holds)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
