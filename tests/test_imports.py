"""The import graph of xray/: no cycle, and the dump format (the ground floor) imports no tool.

Parsed with ast, nothing is imported. The cycle check follows module-level imports only:
an import inside a function body runs when the function does, after every module is loaded,
so it cannot take part in an import-time cycle (commands import heavy modules that way).
Imports under ``if TYPE_CHECKING:`` do count: two modules that need each other's types are one
design knot, whichever trick hides it at run time. The layering check counts every import,
lazy ones included.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "xray"
TOOLS = ("debugger", "summary", "compare", "gen", "replay", "record")


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


def test_the_parser_sees_the_imports():
    """The checks below would pass vacuously on a parser that finds nothing."""
    assert {"xray.dump.model", "xray.dump.tensorio"} <= _imports("xray.dump.reader", lazy=False)
    assert "xray.replay.matrix" in _imports("xray.replay.runner", lazy=False)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    graph = {name: _imports(name, lazy=False) for name in MODULES}
    assert _cycles(graph) == []


def test_dump_imports_no_tool():
    tools = tuple(f"xray.{t}" for t in TOOLS)
    offending = {name: sorted(i for i in _imports(name, lazy=True) if i.startswith(tools) and
                              (i in tools or i.startswith(tuple(t + "." for t in tools))))
                 for name in MODULES if name == "xray.dump" or name.startswith("xray.dump.")}
    assert {k: v for k, v in offending.items() if v} == {}
