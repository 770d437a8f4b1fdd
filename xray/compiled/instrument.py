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

A kernel may write into an alias of another buffer (``buf3 = reinterpret_tensor(buf5, ...)  #
alias``): inductor writes a ``cat`` as its inputs computed straight into slices of one buffer.
The slice holds no FX node of its own, the base does (the ``cat``), so the base is probed too,
after the last launch that writes one of its aliases. A reused buffer
(``buf17 = reinterpret_tensor(buf2, ...); del buf2``) is a new buffer, not an alias.

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
    outputs: list[str]  # buffer names it writes, in argument order (then the bases of written aliases)
    line: int  # line in the output-code file
    owner: int | None = None  # one output of a multi-output fallback: the launch that ran the fallback
    # a fallback's tensor arguments: schema position (int) or keyword -> the buffer passed
    arguments: dict[int | str, str] = field(default_factory=dict)


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


def _launch(stmt: ast.stmt, cpp: dict[str, list[int]], index: int, owners: dict[str, tuple[str, int]]) -> Launch | None:
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
                owners[target] = (name, index)
                arguments = {i: b for i, a in enumerate(value.args) if (b := _buffer(a))}
                arguments.update({kw.arg: b for kw in value.keywords if kw.arg and (b := _buffer(kw.value))})
                return Launch(index, name, [target], stmt.lineno, arguments=arguments)
        if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id in owners:
            # one output of a multi-output fallback (MultiOutput): its own buffer, the fallback's launch
            kernel, owner = owners[value.value.id]
            return Launch(index, kernel, [target], stmt.lineno, owner)
    return None


def _aliases(body: list[ast.stmt]) -> dict[str, str]:
    """Alias buffer -> its base, for ``a = reinterpret_tensor(b, ...)`` where ``b`` stays alive
    (not ``del b`` right after: that is a reuse, ``a`` is then a buffer of its own)."""
    out = {}
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Call) and _dotted(stmt.value.func) == "reinterpret_tensor"):
            continue
        base = _buffer(stmt.value.args[0]) if stmt.value.args else None
        nxt = body[i + 1] if i + 1 < len(body) else None
        reused = isinstance(nxt, ast.Delete) and any(isinstance(t, ast.Name) and t.id == base for t in nxt.targets)
        if base and not reused:
            out[stmt.targets[0].id] = base
    return out


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
    owners: dict[str, tuple[str, int]] = {}
    at: dict[int, Launch] = {}  # statement position -> its launch
    for i, stmt in enumerate(fn.body):
        launch = _launch(stmt, cpp, len(launches), owners)
        if launch is not None and launch.outputs:
            launches.append(launch)
            at[i] = launch
    # the base of written aliases: probed after the last launch writing one of them
    aliases, last = _aliases(fn.body), {}
    bases = set(aliases.values())
    for launch in launches:  # a base written whole by a later launch is probed there
        for b in launch.outputs:
            if b in aliases or b in bases:
                last[aliases.get(b, b)] = launch
    for base, launch in last.items():
        if base not in launch.outputs:
            launch.outputs.append(base)
    body: list[ast.stmt] = []
    for i, stmt in enumerate(fn.body):
        body.append(stmt)
        if (launch := at.get(i)) is None:
            continue
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

