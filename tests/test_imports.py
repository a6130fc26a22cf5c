"""The house drawn from marsrl's imports: no circle between modules, and no import running up a floor.

Every ``import`` statement of every module under ``marsrl/`` counts, wherever it stands (the module's
top, inside a function, under ``TYPE_CHECKING``): an import deferred for start-up time is still a
dependency.  A room is a sub-package (``marsrl/engine/``) or a top-level module (``marsrl/trajectory.py``);
imports inside a room are free of floors but not of circles.  The floors, lowest first:

0. ``verify``, ``algo``, ``trajectory``, ``prompts``, ``data``, ``batching``, ``config``, ``quiet``,
   ``testing``, ``_lazy`` and the package itself (its version): pure pieces that import no other room.
1. ``drafter`` (the draft model), ``metrics`` (rollout figures from trajectories).
2. ``engine``: speculative decoding over a target and a drafter.
3. ``rollout`` (the pool and its workers), ``tinyworld`` (the tiny models, built with the engine).
4. ``integrations`` (TRL's rollout hook), ``commands`` (demo, compare, table).
5. ``trainer`` (the GRPO trainer) and ``report`` (reads what training wrote, imports no trainer).
6. ``experiment``: trainer, pool, evaluation and report wired from one config.
7. ``cli``.
8. ``__main__``.

A room imports only from rooms on lower floors: verify and algo from nothing, engine from nothing that
rolls out, trains, runs experiments or reports, and so on up.  A new room must be given its floor here.
Package exports resolved by name at first use (``_lazy.lazy_exports``, ``report.__init__``) stay inside
their package, so they add no edge between rooms.
"""

from __future__ import annotations

import ast
from pathlib import Path

import marsrl

FLOORS = {
    "marsrl": 0,
    "_lazy": 0,
    "quiet": 0,
    "testing": 0,
    "config": 0,
    "batching": 0,
    "trajectory": 0,
    "prompts": 0,
    "verify": 0,
    "algo": 0,
    "data": 0,
    "drafter": 1,
    "metrics": 1,
    "engine": 2,
    "rollout": 3,
    "tinyworld": 3,
    "integrations": 4,
    "commands": 4,
    "trainer": 5,
    "report": 5,
    "experiment": 6,
    "cli": 7,
    "__main__": 8,
}

ROOT = Path(marsrl.__file__).parent


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a package is its ``__init__``)."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = ["marsrl", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _targets(name: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules) -> list[str]:
    """The marsrl modules one import statement loads (``from pkg import sub`` loads ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        wanted = [f"{source}.{alias.name}" for alias in node.names]
    found = []
    for target in wanted:
        if target != "marsrl" and not target.startswith("marsrl."):
            continue
        while target not in modules and "." in target:  # a name imported from a module: the module
            target = target.rsplit(".", 1)[0]
        found.append(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the marsrl modules it imports (itself excluded)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(name, path.name == "__init__.py", node, modules))
        edges.discard(name)
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "marsrl"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():
    """The walk sees the package: known edges are there (a broken resolver would pass every test)."""
    graph = import_graph()
    assert "marsrl.trajectory" in graph["marsrl.metrics"]
    assert "marsrl.report.wandb_read" in graph["marsrl.report.load"]
    assert "marsrl.verify.types" in graph["marsrl.report.html"]
    assert any(room(t) == "engine" for t in graph["marsrl.rollout.worker"])


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_every_room_has_a_floor():
    rooms = {room(m) for m in import_graph()}
    assert rooms <= set(FLOORS), f"give these rooms a floor in FLOORS: {sorted(rooms - set(FLOORS))}"


def test_no_import_runs_up():
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in import_graph().items()
        for target in targets
        if room(source) != room(target) and FLOORS.get(room(target), 99) >= FLOORS.get(room(source), -1)
    )
    assert upward == []
