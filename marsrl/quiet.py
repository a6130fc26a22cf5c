"""What the ``marsrl`` command line keeps off the console, and why.  Only notices it understands, each
matched by category (or logger) and message, never a blanket filter; everything else still shows, and
the per-step lines and progress bars are not touched.  Library use (``import marsrl``) is left alone:
``quiet()`` runs from ``marsrl.cli.main``.

- TRL's "experimental feature" notice for ``rollout_func``: marsrl's trainer is the caller that passes
  the hook, so marsrl sets TRL's own switch for it, ``TRL_EXPERIMENTAL_SILENCE=1`` (unless already set).
- transformers' FutureWarnings that ``gradient_checkpointing`` and its methods are renamed
  ``activation_checkpointing``: TRL's GRPOConfig sets the old field (its default is True) and TRL's
  trainer calls the old methods; nothing in marsrl's hands uses the old names.
- Ray's notice that it turned token authentication on for the local cluster a rollout pool starts
  (Ray's own default, announced each time Ray picks it); the notice that authentication is *off* still
  shows.
- marsrl's own warnings are shown, as one line each (``marsrl: UserWarning: ...``) instead of Python's
  file:line header and source line; other packages' warnings keep Python's format.
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
RAY_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster."
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


class _DeepSpeedCpuNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith(DEEPSPEED_CPU_NOTICE) and _no_cuda())


class _RayAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(RAY_AUTH_NOTICE)


def _add_filter(logger: str, kind: type[logging.Filter]) -> None:
    log = logging.getLogger(logger)
    if not any(isinstance(f, kind) for f in log.filters):
        log.addFilter(kind())


_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_python_format = warnings.formatwarning


def _one_line(message, category, filename, lineno, line=None):
    if os.path.abspath(filename).startswith(_PACKAGE + os.sep):
        return f"marsrl: {category.__name__}: {message}\n"
    return _python_format(message, category, filename, lineno, line)


def quiet() -> None:
    """Install the filters of the module docstring (idempotent)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    warnings.formatwarning = _one_line
    _add_filter("DeepSpeed", _DeepSpeedCpuNotice)
    _add_filter(RAY_AUTH_LOGGER, _RayAuthNotice)
