"""The package imports in one direction: no cycles, counted over every import statement,
including those inside functions and under TYPE_CHECKING (hiding a cycle there still ties the
two modules together)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "exporter"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "proto" in path.parts:  # generated code
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of the package that `name` imports, wherever the import stands."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
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


def test_the_import_graph_is_read_from_every_module():
    graph = import_graph()
    assert "exporter.app" in graph and "exporter.correlate.correlator" in graph
    # a function-level import counts: cli.main imports app inside `run`
    assert "exporter.app" in graph["exporter.cli.main"]


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_exporter_has_no_import_cycles():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("low, high", [
    ("exporter.correlate", "exporter.sinks"), ("exporter.correlate", "exporter.sources"),
    ("exporter.correlate", "exporter.web"), ("exporter.events", "exporter.correlate"),
    ("exporter.sources", "exporter.sinks"), ("exporter.sources", "exporter.correlate"),
    ("exporter.config", "exporter.sources"), ("exporter.kube", "exporter.sources"),
    # The decisions every stage shares sit below them all (the journal's default path too).
    ("exporter.config", "exporter.sinks"), ("exporter.config", "exporter.web"),
    ("exporter.config", "exporter.cli"), ("exporter.config", "exporter.app"),
    # The plan: judged by the correlator's pure code, read by the sinks, the web and the CLI.
    ("exporter.correlate", "exporter.plan"), ("exporter.sources", "exporter.plan"),
    ("exporter.plan", "exporter.sources"), ("exporter.plan", "exporter.sinks"),
    ("exporter.plan", "exporter.web"), ("exporter.plan", "exporter.cli"),
    ("exporter.web", "exporter.plan"),
])
def test_a_stage_never_imports_a_later_one(low, high):
    graph = import_graph()
    wrong = sorted(f"{m} -> {t}" for m, targets in graph.items()
                   if m == low or m.startswith(low + ".")
                   for t in targets if t == high or t.startswith(high + "."))
    assert wrong == []
