"""Adapters from RL trainers to the rollout pool. Each lives in its own module and imports its trainer
library only there: ``marsrl.integrations.trl`` (TRL's GRPOTrainer ``rollout_func``)."""
