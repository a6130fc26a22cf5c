"""The experiment users run: ``marsrl train`` trains every arm (strict, mars, ...) of one config with the
same seed and prompts, each logging to wandb and to its own folder; ``marsrl report`` compares them."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .config import DEFAULT_ARMS, ArmConfig, DataConfig, ExperimentConfig, load_experiment
    from .run import ExperimentError, run_experiment

__all__ = [
    "DEFAULT_ARMS",
    "ArmConfig",
    "DataConfig",
    "ExperimentConfig",
    "ExperimentError",
    "load_experiment",
    "run_experiment",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {**dict.fromkeys(__all__, ".config"), "ExperimentError": ".run", "run_experiment": ".run"},
)
