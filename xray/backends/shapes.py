"""Dynamic shapes (``dynamic=batch`` / ``dynamic=seq``): export with one dimension of every input
left symbolic, then run the same program at a second size.

Each input tensor's dim 0 (batch) or dim 1 (seq) is marked ``torch.export.Dim.AUTO``: torch.export
keeps it symbolic unless the program forces a constant (``mm``'s inner dimension, a size of 1
that torch.export specialises), so one rule serves every op and model; the facts say which
dimensions stayed dynamic. Every mark is bounded (``MAX_FACTOR`` x its example size): ExecuTorch
plans memory for the upper bound. The second size is ``GROWTH`` x the example's (within the
bound), built by tiling the example along the dimension, so token ids, masks and class indices
stay valid.
"""
from __future__ import annotations

from typing import Any

import torch

DIMS = {"batch": 0, "seq": 1}
DYNAMIC_OPTION = ("batch or seq: export with dim 0 (batch) or dim 1 (seq) of every input symbolic "
                  "(torch.export.Dim.AUTO), run at the example size and at twice it")
GROWTH = 2
MAX_FACTOR = 4


def dynamic_shapes(module: torch.nn.Module, args: tuple, which: str | None) -> tuple | None:
    """``dynamic_shapes`` for ``torch.export`` / ``torch.onnx.export``: one dict per positional
    input (as one tuple when ``forward`` takes them as ``*tensors``, as replay's op modules do)."""
    import inspect

    if which is None:
        return None
    dim = DIMS[which]
    spec: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() > dim:
            spec.append({dim: torch.export.Dim.AUTO(max=MAX_FACTOR * max(int(a.shape[dim]), 1))})
        else:
            spec.append(None)
    params = list(inspect.signature(module.forward).parameters.values())
    if params and all(p.kind == p.VAR_POSITIONAL for p in params):
        return (tuple(spec),)
    return tuple(spec)


def describe(program: "torch.export.ExportedProgram") -> dict[str, Any]:
    """The facts of a dynamic export: each user input's shape (a symbolic dimension as its
    expression, ``s0``), the symbols' ranges, and how many input dimensions stayed dynamic."""
    from torch.export.graph_signature import InputKind

    users = {s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    shapes = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in users:
            val = node.meta.get("val")
            shapes.append([_size(d) for d in getattr(val, "shape", ())])
    ranges = {}
    for sym, vr in program.range_constraints.items():
        hi = vr.upper
        ranges[str(sym)] = [int(vr.lower), int(hi) if hi.is_finite else None]
    return {"dynamic_inputs": shapes, "dynamic_ranges": ranges,
            "dynamic_dims": sum(1 for s in shapes for d in s if isinstance(d, str))}


def _size(d: Any) -> int | str:
    """A static size as an int, a symbolic one as its expression's text."""
    if isinstance(d, int):
        return d
    expr = d.node.expr
    return int(expr) if expr.is_number else str(expr)


def second_inputs(inputs: tuple, facts: dict[str, Any]) -> tuple[tuple | None, str]:
    """The inputs at the second size, and its description ("s0: 16 -> 32"), or (None, why not)."""
    import sympy

    shapes = facts.get("dynamic_inputs") or []
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    if not facts.get("dynamic_dims"):
        return None, "no input dimension stayed dynamic (torch.export specialised every marked one)"
    if len(shapes) != len(tensors):
        return None, f"the program has {len(shapes)} inputs, the call {len(tensors)}"
    value: dict[str, int] = {}
    for t, shape in zip(tensors, shapes):
        for size, d in zip(t.shape, shape):
            if isinstance(d, str) and d.isidentifier():
                value[d] = int(size)
    if not value:
        return None, "every dynamic dimension is an expression of others; no free size to change"
    grown = {}
    for sym, v in value.items():
        lo, hi = (facts.get("dynamic_ranges") or {}).get(sym, [2, None])
        grown[sym] = v * GROWTH if hi is None else min(v * GROWTH, hi)
    if grown == value:
        return None, f"the bounds leave no second size ({facts.get('dynamic_ranges')})"
    subs = {sympy.Symbol(k, integer=True, positive=True): v for k, v in grown.items()}
    out = []
    for t, shape in zip(tensors, shapes):
        new = [int(sympy.sympify(d, locals={s.name: s for s in subs}).subs(subs)) if isinstance(d, str) else d
               for d in shape]
        out.append(tile(t, new))
    return tuple(out), ", ".join(f"{k}: {value[k]} -> {grown[k]}" for k in sorted(value))


def tile(t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """``t`` at ``shape``, its entries repeated cyclically along every dimension that changed."""
    for d, (old, new) in enumerate(zip(t.shape, shape)):
        if old != new:
            t = t.index_select(d, torch.arange(new) % max(old, 1))
    return t.contiguous()


class Positional(torch.nn.Module):
    """A model called with positional tensors only (keyword tensors by their names, other keywords
    fixed), returning its flat tensor outputs: what the exporters' dynamic shapes describe."""

    def __init__(self, model: torch.nn.Module, keywords: tuple[str, ...], fixed: dict[str, Any],
                 positional: int) -> None:
        super().__init__()
        self.model, self.keywords, self.fixed, self.positional = model, keywords, fixed, positional

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from .base import flatten_tensors

        args = tensors[: self.positional]
        kwargs = dict(zip(self.keywords, tensors[self.positional:]), **self.fixed)
        return tuple(flatten_tensors(self.model(*args, **kwargs)))


def positional(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[Positional, tuple]:
    """``model(*args, **kwargs)`` as a ``Positional`` module and its tensor inputs."""
    keywords = tuple(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    fixed = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    return Positional(model, keywords, fixed, len(args)), (*args, *(kwargs[k] for k in keywords))


def two_sizes(backend: Any, model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A whole model exported with the backend's ``dynamic`` dimension symbolic, lowered once and
    run at the example size and the second size, each against the model's eager outputs at that
    size: ``{"second_size", "dynamic_dims", "output_err": [at the example size, at the second]}``
    (max |backend - eager| / max |eager|). Raises ``BackendError`` with the stage that failed."""
    from .base import BackendError, ReplayStatus

    module, inputs = positional(model, args, kwargs)
    artifact = backend.export(module, inputs)
    second, what = second_inputs(inputs, artifact.facts)
    if second is None:
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"dynamic={backend.options.get('dynamic')}: {what}")
    runner = backend.load(artifact, module, inputs)
    errors = []
    with torch.no_grad():
        for size in (inputs, second):
            try:
                got = runner(size)
            except Exception as e:  # noqa: BLE001 - the program was meant to take this size
                raise BackendError(ReplayStatus.RUN_FAIL, f"at {_shapes(size)}: {type(e).__name__}: {e}") from e
            errors.append(_peak_error(got, list(module(*size))))
    return {"second_size": what, "dynamic_dims": artifact.facts.get("dynamic_dims"),
            "sizes": [_shapes(inputs), _shapes(second)], "output_err": errors}


def _shapes(inputs: tuple) -> str:
    return " ".join("x".join(map(str, t.shape)) for t in inputs)


def _peak_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float | None:
    """max |got - want| / max |want| over the floating outputs; None when they do not line up."""
    pairs = [(g, w) for g, w in zip(got, want) if w.is_floating_point() and w.numel()]
    if len(got) != len(want) or not pairs or any(g.shape != w.shape for g, w in pairs):
        return None
    return max(float((g.double() - w.double()).abs().max()) / max(float(w.double().abs().max()), 1e-30)
               for g, w in pairs)
