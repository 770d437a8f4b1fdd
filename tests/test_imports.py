"""The import graph of xray/, module by module: no cycle inside a package, none between
packages, and the dump format and the numerics (the ground floor) import no other part of xray.

Parsed with ast, nothing is imported. Every import counts: one at module level, one inside a
function (commands import heavy modules that way; it cannot break at import time, but two modules
that call each other are one design knot all the same) and one under ``if TYPE_CHECKING:``
(two modules that need each other's types are a knot too, whichever trick hides it at run time).
A "package" is a room of xray: a subpackage (``xray.compare``), or a module at the root
(``xray.quiet``).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "xray"
GROUND_FLOOR = ("xray.dump", "xray.numerics")

def _module_name(path: Path) -> str:
    parts = ("xray",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
EXTENSIONS = {_module_name(p) for p in ROOT.rglob("*.c")}  # C extensions: they import nothing of ours


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom | ast.Import) -> set[str]:
    """The xray modules an import statement loads (the most specific module each name is)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = importer.split(".")
            base = base[:len(base) - node.level + (1 if _is_package(importer) else 0)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        names = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES.keys() | EXTENSIONS else module
                 for a in node.names]
    found = set()
    for name in names:
        if name in EXTENSIONS:
            continue
        while name and name not in MODULES:  # "xray.dump.model.Record" -> "xray.dump.model"
            name = name.rpartition(".")[0]
        if name.startswith("xray"):
            found.add(name)
    return found


def _imports(name: str, *, lazy: bool) -> set[str]:
    """What module ``name`` imports: at module level, or (``lazy``) anywhere in it."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.update(_resolve(name, child))
            elif not lazy and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            else:
                visit(child)

    visit(ast.parse(MODULES[name].read_text(encoding="utf-8")))
    return found - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return out


GRAPH = {name: _imports(name, lazy=True) for name in MODULES}


def _room(name: str) -> str:
    """The package a module belongs to: its top-level subpackage, or itself at the root."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_the_parser_sees_the_imports():
    """The checks below would pass vacuously on a parser that finds nothing."""
    assert {"xray.dump.model", "xray.dump.tensorio"} <= _imports("xray.dump.reader", lazy=False)
    assert "xray.replay.matrix" in _imports("xray.replay.runner", lazy=False)
    assert "xray.replay.runner" in GRAPH["xray.replay.sweep"]  # lazy, inside replay_sweep
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert len(MODULES) > 100 and _room("xray.compare.engine") == "xray.compare" and _room("xray.quiet") == "xray.quiet"


def test_no_module_cycle():
    assert _cycles(GRAPH) == []


def test_no_cycle_between_packages():
    rooms: dict[str, set[str]] = {}
    for name, deps in GRAPH.items():
        if name != "xray":
            rooms.setdefault(_room(name), set()).update(_room(d) for d in deps if _room(d) != _room(name))
    assert _cycles(rooms) == []


def test_dump_and_numerics_are_the_ground_floor():
    """The dump format and the numerics import nothing of xray but themselves (not each other)."""
    outside = {(name, dep) for name, deps in GRAPH.items() if _room(name) in GROUND_FLOOR
               for dep in deps if _room(dep) != _room(name)}
    assert sorted(outside) == []
