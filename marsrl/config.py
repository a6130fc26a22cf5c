"""Config loading shared by every entry point: dataclass defaults are the single source of truth,
YAML files and ``--set key=value`` only override them, and unknown keys are errors naming the key
and the file.  Cross-field checks live in each dataclass's ``__post_init__``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

C = TypeVar("C")


class ConfigError(ValueError):
    """A config file or override that cannot be applied (names the file and key)."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, with YAML 1.2's floats: ``5e-4`` and ``1E3`` are numbers (YAML 1.1, which
    PyYAML follows, reads a float without a dot as a string, so ``learning_rate: 5e-4`` would not be one)."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` with YAML 1.2's floats (``5e-4`` is a number): every config marsrl reads."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects


def _coerce(cls, name: str, value: Any, where: str) -> Any:
    """Check a YAML value against the field's annotation (simple types only), converting int -> float."""
    hints = typing.get_type_hints(cls)
    hint = hints[name]
    origin = typing.get_origin(hint)
    allowed = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    if value is None:
        if type(None) in allowed:
            return None
        raise ConfigError(f"{where}: '{name}' may not be null")
    for t in allowed:
        base = typing.get_origin(t) or t
        if base is typing.Literal:
            if value in typing.get_args(t):
                return value
            continue
        if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if base in (tuple, list) and isinstance(value, (list, tuple)):
            return base(value)
        if (
            isinstance(base, type)
            and isinstance(value, base)
            and not (base is int and isinstance(value, bool))
        ):
            return value
    raise ConfigError(f"{where}: '{name}' = {value!r} does not match the expected type {hint}")


def build_config(cls: type[C], values: dict[str, Any], where: str = "config") -> C:
    """Instantiate dataclass ``cls`` from a mapping; unknown keys and wrong types raise ConfigError."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys are {sorted(fields)}")
    kwargs = {k: _coerce(cls, k, v, where) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from err


def add_config_args(
    parser: argparse.ArgumentParser, what: str, config_example: str, set_example: str
) -> None:
    """``--config FILE`` and ``--set KEY=VALUE`` (repeatable) on one command's parser: the YAML file and
    the overrides ``load_config`` applies over ``what``'s defaults (``args.config``, ``args.set``).  Every
    command that reads a config takes them from here, so they read and behave alike."""
    parser.add_argument(
        "--config", metavar="FILE", help=f"YAML file overriding {what}'s defaults (e.g. {config_example})"
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help=f"override one field of {what}, YAML-typed (repeatable), e.g. --set {set_example}",
    )


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["theta=0.8", "rules=[strict, mars]"]`` -> {"theta": 0.8, "rules": ["strict", "mars"]}.

    Values are parsed as YAML."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key=value")
        out[key.strip()] = load_yaml(raw)
    return out


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file; ConfigError naming the file when it is missing or not one."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values at the top level")
    return loaded


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None) -> C:
    """Defaults of ``cls``, then the YAML file at ``path`` (if any), then ``key=value`` overrides."""
    values: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        values.update(read_yaml_mapping(path))
        where = str(path)
    over = parse_overrides(overrides)
    values.update(over)
    if over:
        where += " + overrides"
    return build_config(cls, values, where)
