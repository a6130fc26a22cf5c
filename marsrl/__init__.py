"""marsrl: speculative rollouts for RL post-training, with MARS margin-aware verification and an exact
per-token record of how every token was produced."""

__version__ = "0.1.0"
