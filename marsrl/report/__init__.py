"""``marsrl report``: compare the arms of one strict-vs-MARS experiment from what training left on disk
(or in wandb offline runs) — a side-by-side table, plots with their data, highlighted sample
completions and a verdict in plain words.  It reads; it trains nothing and recomputes no model output.

Modules: ``base`` (the input error, what counts as a number), ``wandb_read`` (reading wandb run
folders), ``load`` (input folders and their errors), ``table`` (figures), ``stats`` (smoothing,
bootstrap intervals, paired tests), ``compare`` (each arm against strict, with intervals, and the Amdahl
projection), ``plots``, ``html`` (completions page), ``verdict``, ``wandb_log`` (logging the report
back into the runs), ``build`` (runs them in order), ``cli``.  The names below are imported on
first use, so that building the ``marsrl`` parser (``cli.add_report_parser``) imports neither torch,
matplotlib nor wandb.
"""

from importlib import import_module

_EXPORTS = {
    "Arm": "load",
    "Experiment": "load",
    "ReportError": "base",
    "load_experiment": "load",
    "Report": "build",
    "build_report": "build",
    "log_report_to_wandb": "wandb_log",
    "read_wandb_history": "wandb_read",
    "read_wandb_run": "wandb_read",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
