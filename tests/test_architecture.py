"""The layout DESIGN.md asks for, checked on the source: no import cycles between the package's
modules, and the OpenTelemetry SDK imported only by the setup side."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "otel_stages"

#: Modules that build the pipeline ``configure()`` sets up; instrumentation and analysis never
#: import the SDK (tests/test_api.py checks the same at run time for the hot path).
SDK_SIDE = {"otel_stages.sdk", "otel_stages.delivery", "otel_stages.request_log",
            "otel_stages.sample_export", "otel_stages.sampling", "otel_stages.testing",
            "otel_stages.gpu.reader", "otel_stages.gpu.session", "otel_stages.signals.session",
            "otel_stages.json_lines"}


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(encoding="utf-8"))
    return out


def _module_level_imports(tree: ast.Module, known: set[str]) -> set[str]:
    """Package modules imported when ``tree`` is imported (not inside functions, not under
    ``if TYPE_CHECKING``); ``from pkg import mod`` counts as ``pkg.mod``."""
    deps: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for n in node.body if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("otel_stages"):
                deps |= {f"{n.module}.{a.name}" if f"{n.module}.{a.name}" in known else n.module
                         for a in n.names}
            elif isinstance(n, ast.Import):
                deps |= {a.name for a in n.names if a.name.startswith("otel_stages")}
    return deps & known


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_between_modules() -> None:
    trees = _modules()
    graph = {name: _module_level_imports(tree, set(trees)) - {name} for name, tree in trees.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_setup_side_imports_the_sdk() -> None:
    importers = set()
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            module = (node.module if isinstance(node, ast.ImportFrom) else
                      next((a.name for a in node.names), None) if isinstance(node, ast.Import) else None)
            if module and module.startswith("opentelemetry.sdk"):
                importers.add(name)
    assert importers <= SDK_SIDE, sorted(importers - SDK_SIDE)
