"""The docs hold together: every relative link in README.md and docs/*.md resolves (files and #anchors),
every ``marsrl ...`` command line and flag they show exists in the CLI's parser, and docs/experiment.md
documents exactly the fields of the experiment config's dataclasses."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")


def _split(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code-block lines) of a Markdown text."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        (code if fenced else prose).append(line)
    return prose, code


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    prose, _ = _split(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: Path) -> list[str]:
    prose, _ = _split(path.read_text(encoding="utf-8"))
    text = "\n".join(_INLINE_CODE.sub("", line) for line in prose)
    return _LINK.findall(text)


def test_docs_exist():
    names = {p.name for p in DOCS}
    for name in (
        "concepts.md",
        "trainer.md",
        "experiment.md",
        "engine.md",
        "rollouts.md",
        "gpu.md",
        "benchmarks.md",
        "development.md",
    ):
        assert name in names, f"docs/{name} is missing"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc: Path):
    bad = []
    for target in _links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
            continue
        if anchor:
            if dest.suffix != ".md":
                bad.append(f"{target}: an anchor into a file that is not Markdown")
            elif anchor not in _anchors(dest):
                bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not bad, f"{doc.relative_to(ROOT)}: " + "; ".join(bad)


# --- marsrl command lines against the CLI's parser --------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _tokens(line: str) -> list[str]:
    line = re.sub(r"(^|\s)#.*$", "", line)  # a shell comment
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def _marsrl_commands(doc: Path) -> list[list[str]]:
    """The argument lists of every ``marsrl`` invocation shown: in code blocks (also after ``-m`` or a
    venv path) and in inline code spans that start with it."""
    prose, code = _split(doc.read_text(encoding="utf-8"))
    found = []
    for line in code:
        tokens = _tokens(line)
        for i, tok in enumerate(tokens):
            is_cli = tok == "marsrl" or tok.endswith("/bin/marsrl")
            if is_cli and (i == 0 or tokens[i - 1] in ("-m", "&&", ";", "|") or "=" in tokens[i - 1]):
                found.append(tokens[i + 1 :])
    for line in prose:
        for _, span in _INLINE_CODE.findall(line):
            tokens = _tokens(span)
            if len(tokens) > 1 and (tokens[0] == "marsrl" or tokens[0].endswith("/bin/marsrl")):
                found.append(tokens[1:])  # a bare `marsrl` is a name (the package, a wandb project)
    return [args for args in found if args[:1] not in (["…"], ["..."])]  # "marsrl …": any command


def _check_command(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    bad, path = [], ["marsrl"]
    i = 0
    while True:
        subs = _subparsers(parser)
        if not subs or i >= len(args) or args[i].startswith("-"):
            break
        word = args[i]
        if word.isupper():  # a placeholder such as COMMAND: its flags cannot be checked
            return bad
        if word not in subs:
            bad.append(f"{' '.join(path)}: no subcommand {word!r}")
            return bad
        parser, i = subs[word], i + 1
        path.append(word)
    if _subparsers(parser) and not any(a in ("-h", "--help") for a in args[i:]):
        bad.append(f"{' '.join(path)}: needs a subcommand")
    options = _options(parser)
    for arg in args[i:]:
        if arg.startswith("-") and arg not in ("-", "--") and not re.fullmatch(r"-\d.*", arg):
            flag = arg.split("=", 1)[0]
            if flag not in options:
                bad.append(f"{' '.join(path)}: no option {flag!r}")
    return bad


def test_marsrl_commands_exist_in_the_parser():
    from marsrl.cli import build_parser

    parser = build_parser()
    bad, seen = [], 0
    for doc in DOCS:
        for args in _marsrl_commands(doc):
            seen += 1
            bad += [
                f"{doc.relative_to(ROOT)}: {msg}  (marsrl {' '.join(args)})"
                for msg in _check_command(parser, args)
            ]
    assert seen >= 10, f"only {seen} marsrl command lines found: is the scan broken?"
    assert not bad, "\n".join(bad)


def test_command_check_catches_unknown_flags_and_commands():
    from marsrl.cli import build_parser

    parser = build_parser()
    assert _check_command(parser, ["train", "--config", "x.yaml", "--resume"]) == []
    assert _check_command(parser, ["draft", "train", "--target", "d", "--no-resume"]) == []
    assert _check_command(parser, ["train", "--no-such-flag"])
    assert _check_command(parser, ["no-such-command"])
    assert _check_command(parser, ["tinyworld"])  # a group without its subcommand


# --- docs/experiment.md against the config dataclasses ---------------------------------------------------


def _config_classes() -> dict[str, type]:
    from marsrl.engine import EngineConfig, TreeConfig
    from marsrl.experiment.config import (
        ArmConfig,
        DataConfig,
        EvalConfig,
        ExperimentConfig,
        ReportConfig,
        WandbConfig,
    )
    from marsrl.rollout import PoolConfig, WorkerConfig

    classes = (
        ExperimentConfig,
        DataConfig,
        EvalConfig,
        WandbConfig,
        ReportConfig,
        ArmConfig,
        PoolConfig,
        WorkerConfig,
        EngineConfig,
        TreeConfig,
    )
    return {c.__name__: c for c in classes}


def _documented_fields(path: Path) -> dict[str, set[str]]:
    """{class name: field names} from each heading naming a class in backticks and the table under it."""
    prose, _ = _split(path.read_text(encoding="utf-8"))
    out: dict[str, set[str]] = {}
    current = None
    for line in prose:
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            names = re.findall(r"`(\w+Config)`", heading.group(1))
            current = names[0] if names else None
            if current:
                out.setdefault(current, set())
            continue
        row = re.match(r"^\|\s*`([A-Za-z_]\w*)`\s*\|", line)
        if current and row:
            out[current].add(row.group(1))
    return out


def test_experiment_md_documents_exactly_the_config_fields():
    documented = _documented_fields(ROOT / "docs" / "experiment.md")
    classes = _config_classes()
    assert set(documented) == set(classes), f"sections: {sorted(documented)} against {sorted(classes)}"
    problems = []
    for name, cls in classes.items():
        fields = {f.name for f in dataclasses.fields(cls)}
        missing, extra = sorted(fields - documented[name]), sorted(documented[name] - fields)
        if missing or extra:
            problems.append(f"{name}: undocumented {missing}, not a field {extra}")
    assert not problems, "\n".join(problems)


def test_trainer_section_points_to_the_trainer_options():
    text = (ROOT / "docs" / "experiment.md").read_text(encoding="utf-8")
    assert "trainer-options.md" in text
