"""Package exports resolved on first use (PEP 562), so that ``marsrl --help`` and the CLI's parsers do
not import torch, transformers and TRL before a command runs."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list]]:
    """``(__getattr__, __dir__)`` for ``package`` whose public name ``n`` lives in submodule
    ``exports[n]`` (relative, e.g. ".build"); a value once loaded is kept in the package."""

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
