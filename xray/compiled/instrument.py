"""Find the kernel launches of one inductor output-code module and add a probe after each.

Why this way (torch 2.13, CPU): inductor's generated module is plain Python whose ``call``
launches every kernel in order on named buffers (``cpp_fused_add_0(buf0, arg1_1, buf1)``,
``extern_kernels.mm(a, b, out=buf2)``, ``buf3 = torch.ops.aten.x.default(...)``). Reading that
source tells which arguments a kernel writes (a C++ kernel's non-const pointer arguments, an
extern kernel's ``out=``, the assigned name of a fallback), and the buffer names are the keys of
inductor's own buffer table (``origin_node``: the FX node a buffer holds exactly). A probe
statement after each launch reads those buffers by name, so what is recorded is what the kernel
wrote, before a later kernel reuses the memory. The rewritten ``call`` runs in a copy of the
module's globals: inductor's cached module is left untouched, and no kernel is re-generated or
re-ordered. Alternatives weighed: DebugMode sees only extern kernels on CPU; the intermediate
value printer needs ``cpp_wrapper=True`` (another program than the one users run) and writes
every argument to disk; wrapping kernel globals cannot see fallback ops called through
``torch.ops``.

Limits: straight-line ``call`` bodies only (control-flow subgraphs keep their launches
unprobed); a kernel inside a nested block is not probed.
"""
from __future__ import annotations

import ast
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# calls in ``call`` that allocate or view memory, or check it: never a kernel launch
_HELPERS = ("empty_strided", "empty_strided_cpu", "empty_strided_cuda", "empty_strided_xpu", "empty_strided_mps",
            "reinterpret_tensor", "assert_size_stride", "assert_alignment", "alloc_from_pool", "torch.empty",
            "torch.empty_strided", "as_strided", "check_tensor_meta")


@dataclass
class Launch:
    """One kernel launch site in ``call``: the kernel and the buffers it writes."""

    index: int
    kernel: str  # "cpp_fused_add_mul_0", "extern_kernels.addmm", "torch.ops.aten._softmax.default"
    outputs: list[str]  # buffer names it writes, in argument order
    line: int  # line in the output-code file


@dataclass
class Instrumented:
    """An output-code module with a probe after every launch."""

    module: types.ModuleType  # a copy of inductor's module whose ``call`` probes
    launches: list[Launch] = field(default_factory=list)
    kernel_sources: dict[str, str] = field(default_factory=dict)  # cpp kernel name -> C++ source


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    return ""


def _buffer(node: ast.AST) -> str | None:
    """The buffer an argument names: ``buf3`` or ``reinterpret_tensor(buf3, ...)``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call) and _dotted(node.func) == "reinterpret_tensor" and node.args:
        return _buffer(node.args[0])
    return None


def _cpp_kernels(tree: ast.Module) -> tuple[dict[str, list[int]], dict[str, str]]:
    """C++ kernel name -> positions of the arguments it writes (non-const pointers), and its source."""
    written, sources = {}, {}
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        call = stmt.value
        if not (isinstance(call, ast.Call) and _dotted(call.func).endswith("cpp_pybinding") and call.args
                and isinstance(call.args[0], ast.List)):
            continue
        types_ = [e.value for e in call.args[0].elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        written[stmt.targets[0].id] = [i for i, t in enumerate(types_) if t.endswith("*") and "const" not in t]
        if len(call.args) > 1 and isinstance(call.args[1], ast.Constant):
            sources[stmt.targets[0].id] = str(call.args[1].value)
    return written, sources


def _call_def(tree: ast.Module) -> tuple[ast.FunctionDef | None, bool]:
    """The ``call`` function (a method of ``Runner`` since torch 2.8; module-level before)."""
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == "Runner":
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef) and item.name == "call":
                    return item, True
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "call":
            return stmt, False
    return None, False


def _launch(stmt: ast.stmt, cpp: dict[str, list[int]], index: int, owners: dict[str, str]) -> Launch | None:
    """The launch ``stmt`` is, if any."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        name = _dotted(call.func)
        if name in cpp:
            outs = [_buffer(call.args[i]) for i in cpp[name] if i < len(call.args)]
            return Launch(index, name, [o for o in outs if o], stmt.lineno)
        out = next((kw.value for kw in call.keywords if kw.arg == "out"), None)
        if out is not None and name and name not in _HELPERS:
            outs = [_buffer(e) for e in out.elts] if isinstance(out, (ast.Tuple, ast.List)) else [_buffer(out)]
            return Launch(index, name, [o for o in outs if o], stmt.lineno)
        return None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        target, value = stmt.targets[0].id, stmt.value
        if not target.startswith("buf"):
            return None
        if isinstance(value, ast.Call):
            name = _dotted(value.func)
            if name and name not in _HELPERS and not name.endswith(tuple("." + h for h in _HELPERS)):
                owners[target] = name
                return Launch(index, name, [target], stmt.lineno)
        if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id in owners:
            # one output of a multi-output fallback (MultiOutput): its own buffer
            return Launch(index, owners[value.value.id], [target], stmt.lineno)
    return None


def instrument(module: types.ModuleType, probe: Callable[[int, tuple], None]) -> Instrumented | None:
    """A copy of ``module`` whose ``call`` calls ``probe(launch_index, written_buffers)`` after
    each launch; None when the module's source has no ``call`` this reads."""
    path = getattr(module, "__file__", None)
    if not path or not Path(path).is_file():
        return None
    tree = ast.parse(Path(path).read_text())
    cpp, sources = _cpp_kernels(tree)
    fn, is_method = _call_def(tree)
    if fn is None:
        return None
    launches: list[Launch] = []
    owners: dict[str, str] = {}
    body: list[ast.stmt] = []
    for stmt in fn.body:
        body.append(stmt)
        launch = _launch(stmt, cpp, len(launches), owners)
        if launch is None or not launch.outputs:
            continue
        launches.append(launch)
        names = ast.Tuple([ast.Name(b, ast.Load()) for b in launch.outputs], ast.Load())
        body.append(ast.Expr(ast.Call(ast.Name("_xray_probe", ast.Load()), [ast.Constant(launch.index), names], [])))
    fn.body = body
    fn.decorator_list = []
    code = compile(ast.fix_missing_locations(ast.Module([fn], type_ignores=[])), path, "exec")
    copy = types.ModuleType(module.__name__)
    copy.__dict__.update(module.__dict__)
    copy.__dict__["_xray_probe"] = probe
    exec(code, copy.__dict__)  # defines the probing ``call`` in the copy's globals
    call = copy.__dict__["call"]
    if is_method:
        runner = getattr(module, "runner", None)
        if runner is None:
            return None
        call = types.MethodType(call, runner)
    copy.call = call
    return Instrumented(copy, launches, sources)

