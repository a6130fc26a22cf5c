"""What the ``marsrl`` subcommands run: ``demo`` (strict vs MARS verification on synthetic logits) and
``rollouts`` (strict vs MARS rollouts on the tiny world through the Ray pool), with the text table both
print.  Each module owns its config dataclass and returns a report dict; ``marsrl.cli`` parses and prints.
The figures themselves come from ``marsrl.algo`` (through ``marsrl.metrics`` for trajectories)."""
