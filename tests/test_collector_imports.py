"""The collector's modules import alone, and its packages import one another without a cycle.

Walked with ``ast`` over the source (every import, at module level, in a function or under TYPE_CHECKING): a
cycle between two packages is a seam that does not read true, even where lazy imports keep it from failing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import otel_ofu_collector

ROOT = Path(otel_ofu_collector.__file__).parent
PACKAGE = ROOT.name


def module_names() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def part_of(module: str) -> str:
    """The unit a cycle is looked for between: a sub-package, or a module directly in the collector."""
    return ".".join(module.split(".")[:2])


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith(f"{PACKAGE}.")}


def part_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        source = part_of(".".join(parts))
        targets = {part_of(name) for name in imported(path)} - {source, PACKAGE}
        graph.setdefault(source, set()).update(targets)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one part (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_of_three_and_none_in_a_chain() -> None:
    # a -> b -> c -> a is one cycle; d -> a hangs off it; e -> f is a chain.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"e": {"f"}, "f": set()}) == []


def test_the_walk_sees_the_known_edges() -> None:
    graph = part_graph()
    # service.py builds the windows and starts the receivers; the windows build the results.
    assert {f"{PACKAGE}.aggregation", f"{PACKAGE}.receivers"} <= graph[f"{PACKAGE}.service"]
    assert f"{PACKAGE}.results" in graph[f"{PACKAGE}.aggregation"]


def test_no_cycle_among_the_collectors_packages() -> None:
    assert cycles(part_graph()) == []


def test_every_collector_module_imports_alone_in_a_fresh_interpreter() -> None:
    modules = module_names()
    assert len(modules) > 50  # every module of the collector, not an empty walk
    # One interpreter per module (a module imported first, before any other of ours, is what a cycle breaks),
    # run as one script so that the test costs one start-up per module and no more.
    script = (
        "import subprocess, sys\n"
        "failed = [m for m in sys.argv[1:] if subprocess.run([sys.executable, '-c', f'import {m}'],"
        " capture_output=True).returncode != 0]\n"
        "print(' '.join(failed))\n"
    )
    result = subprocess.run([sys.executable, "-c", script, *modules], capture_output=True, text=True, check=True)
    assert result.stdout.split() == []


def test_the_packages_map_names_every_module() -> None:
    """The collector's ``__init__`` draws its folders and modules: each one there is named in it."""
    doc = otel_ofu_collector.__doc__ or ""
    missing = [
        str(path.relative_to(ROOT))
        for path in sorted(ROOT.rglob("*.py"))
        if path.name != "__init__.py" and path.name not in doc
    ]
    folders = [path.name for path in sorted(ROOT.iterdir()) if (path / "__init__.py").exists()]
    missing += [f"{folder}/" for folder in folders if f"{folder}/" not in doc]
    assert not missing
