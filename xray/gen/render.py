"""Safe literal rendering: the only way a value from ``dump.json`` reaches generated source.

Every function here type-checks its input and emits a Python literal built from the checked
value (``repr`` of a real ``int``/``float``/``str``, a dtype from a whitelist, an op name that
resolved on ``torch.ops``). Nothing is interpolated raw. ``audit`` then parses each generated
file and rejects any construct the templates do not produce, as a second line of defence.
"""
from __future__ import annotations

import ast
import keyword
import math
import re
from typing import Any

import torch

from ..dump.model import Scalar, TensorMeta
from ..ops.rebuild import UnsupportedValueError, dtype_of, resolve_op, scalar_value

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DATA_REF_RE = re.compile(r"^data/[A-Za-z0-9_.-]+\.h5:[A-Za-z0-9_/.]+$")


class RenderError(ValueError):
    """A value cannot be rendered as a safe literal (a hostile or malformed dump)."""


class NotRebuildable(RenderError):
    """A well-formed value that a test cannot recreate (an opaque ``repr``, e.g. a Generator)."""


def py_int(v: Any) -> str:
    if not isinstance(v, int) or isinstance(v, bool):
        raise RenderError(f"expected an int, got {type(v).__name__} {str(v)[:60]!r}")
    return repr(int(v))


def py_float(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RenderError(f"expected a float, got {type(v).__name__} {str(v)[:60]!r}")
    v = float(v)
    if math.isnan(v):
        return "float('nan')"
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    return repr(v)


def py_str(v: Any) -> str:
    """A string literal; repr() escapes quotes, newlines and every non-printable character."""
    if not isinstance(v, str):
        raise RenderError(f"expected a string, got {type(v).__name__}")
    return repr(str(v))


def py_text(v: Any, limit: int = 120) -> str:
    """Any dump value as a harmless string literal (for docstrings: module paths and the like)."""
    return repr(str(v)[:limit])


def py_ints(v: Any) -> str:
    """A tuple of ints (shapes, strides)."""
    if not isinstance(v, (list, tuple)):
        raise RenderError(f"expected a list of ints, got {type(v).__name__}")
    items = [py_int(x) for x in v]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def py_dtype(name: Any) -> str:
    try:
        dt = dtype_of(name)
    except ValueError as e:
        raise RenderError(str(e)) from None
    return "torch." + str(dt).removeprefix("torch.")


def py_op(name: Any) -> str:
    """``torch.ops.ns.op.overload`` for a name that resolved to a real OpOverload."""
    resolve_op(name)  # raises UnknownOpError (a ValueError) on anything else
    return "torch.ops." + name


def identifier(name: Any) -> str:
    """A local variable name for a schema argument (``from`` -> ``from_``)."""
    if not isinstance(name, str) or not _IDENT_RE.match(name):
        raise RenderError(f"invalid argument name {str(name)[:60]!r}")
    return name + "_" if keyword.iskeyword(name) or name in ("torch", "pytest", "T", "xray_op") else name


def py_tensor(meta: TensorMeta, data_ref: str | None, ignore: int | None = None) -> str:
    """``T(shape, dtype, stride=..., data=..., lo=..., hi=..., mean=..., ignore=...)`` for one tensor."""
    parts = [py_ints(list(meta.shape)), py_dtype(meta.dtype)]
    if meta.stride is not None:
        parts.append("stride=" + py_ints(list(meta.stride)))
    if data_ref is not None:
        if not _DATA_REF_RE.match(data_ref):
            raise RenderError(f"invalid data reference {data_ref!r}")
        parts.append("data=" + py_str(data_ref))
    st = meta.stats
    if st is not None and st.min is not None and st.max is not None:
        parts.append("lo=" + py_float(st.min))
        parts.append("hi=" + py_float(st.max))
        if st.mean is not None:
            parts.append("mean=" + py_float(st.mean))
    if ignore is not None and data_ref is None:
        parts.append("ignore=" + py_int(ignore))
    return "T(" + ", ".join(parts) + ")"


def py_value(v: Any, tensor_source) -> str:
    """Render an argument value; ``tensor_source(meta, path)`` renders tensors (with data refs)."""
    return _value(v, tensor_source, ())


def _value(v: Any, tensor_source, path: tuple) -> str:
    if isinstance(v, TensorMeta):
        return tensor_source(v, path)
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return py_int(v)
    if isinstance(v, float):
        return py_float(v)
    if isinstance(v, str):
        return py_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, tensor_source, path + (i,)) for i, x in enumerate(v)) + "]"
    if isinstance(v, Scalar):
        return _scalar(v)
    raise RenderError(f"cannot render a value of type {type(v).__name__}")


def _scalar(s: Scalar) -> str:
    """Validate through xray.ops.rebuild (the one place that decides what a tag may hold), then
    render the validated Python value; nothing from the JSON is rendered unchecked."""
    try:
        v = scalar_value(s)
    except UnsupportedValueError as e:
        raise NotRebuildable(str(e)) from None
    except ValueError as e:
        raise RenderError(str(e)) from None
    if s.tag == "device":
        return "xray_op.device"  # a recorded device means "the device under test" here
    if isinstance(v, torch.dtype):
        return "torch." + str(v).removeprefix("torch.")
    if isinstance(v, (torch.layout, torch.memory_format)):
        return "torch." + str(v).removeprefix("torch.")
    if isinstance(v, complex):
        return f"complex({py_float(v.real)}, {py_float(v.imag)})"
    if isinstance(v, float):
        return py_float(v)
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise RenderError(f"cannot render a {s.tag!r} value")
    return py_int(v) if isinstance(v, int) else py_str(v)


# -- the second line of defence ---------------------------------------------------------------------

_ALLOWED_IMPORTS = {"torch", "pytest", "numpy", "xray.gen.runtime"}
_ALLOWED_CALLS = {"T", "float", "complex"}
_ALLOWED_CALL_ROOTS = {"xray_op", "torch"}


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def audit(source: str, filename: str) -> None:
    """Parse generated source; raise RenderError on any import or call the templates never emit."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        raise RenderError(f"{filename}: generated code does not parse ({e})") from e
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name not in _ALLOWED_IMPORTS]
        elif isinstance(node, ast.ImportFrom):
            bad = [] if node.module in _ALLOWED_IMPORTS else [str(node.module)]
        elif isinstance(node, ast.Call):
            f = node.func
            ok = (isinstance(f, ast.Name) and f.id in _ALLOWED_CALLS) or (
                isinstance(f, ast.Attribute) and _root(f) in _ALLOWED_CALL_ROOTS)
            if ok and isinstance(f, ast.Attribute) and _root(f) == "torch":
                ok = ast.unparse(f).startswith("torch.ops.")
            bad = [] if ok else [ast.unparse(f)]
        elif isinstance(node, (ast.Lambda, ast.Global, ast.Nonlocal, ast.With, ast.Try, ast.While)):
            bad = [type(node).__name__]
        else:
            continue
        if bad:
            raise RenderError(f"{filename}:{getattr(node, 'lineno', '?')}: unexpected {bad} in generated code")
