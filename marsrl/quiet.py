"""What the ``marsrl`` command line keeps off the console, and why.  Only notices it understands, each
matched by category (or logger) and message, never a blanket filter; everything else still shows, and
the per-step lines and progress bars are not touched.  Library use (``import marsrl``) is left alone:
``quiet()`` runs from ``marsrl.cli.main``.

- TRL's "experimental feature" notice for ``rollout_func``: marsrl's trainer is the caller that passes
  the hook, so marsrl sets TRL's own switch for it, ``TRL_EXPERIMENTAL_SILENCE=1`` (unless already set).
- transformers' FutureWarnings that ``gradient_checkpointing`` and its methods are renamed
  ``activation_checkpointing``: TRL's GRPOConfig sets the old field (its default is True) and TRL's
  trainer calls the old methods; nothing in marsrl's hands uses the old names.
- DeepSpeed's "Setting accelerator to CPU" log line, only when torch sees no CUDA device (the CPU is
  then the right accelerator); where a GPU is visible and DeepSpeed misses it, the line still shows.
"""

from __future__ import annotations

import logging
import os
import warnings

KNOWN_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # (category, regular expression matched at the start of the message)
    (
        FutureWarning,
        r"`(is_)?gradient_checkpointing(_kwargs|_enable|_disable)?` is deprecated and will be removed",
    ),
    (
        UserWarning,
        r"You are using 'rollout_func', which is an experimental feature",
    ),  # if the env var is late
)
DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU."


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


class _DeepSpeedCpuNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith(DEEPSPEED_CPU_NOTICE) and _no_cuda())


def quiet() -> None:
    """Install the filters of the module docstring (idempotent)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    ds = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _DeepSpeedCpuNotice) for f in ds.filters):
        ds.addFilter(_DeepSpeedCpuNotice())
