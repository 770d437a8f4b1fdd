"""One recorded op call as a tiny nn.Module: tensors are its inputs, everything else is fixed.

Exporters (torch.export, the ONNX exporter, coremltools) take a module plus example tensors, so
each recorded call becomes ``OpModule(op, template)`` whose ``forward(*tensors)`` puts the tensors
back in their argument slots and calls the OpOverload. Mutated arguments (in-place and ``out=``
ops) are cloned first, so the module is functional and the caller's inputs stay untouched.
"""
from __future__ import annotations

from typing import Any

import torch

from ..backends.base import flatten_tensors


class _Slot:
    """Placeholder for the i-th tensor input inside the argument template."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<tensor {self.index}>"


def _templatize(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, (list, tuple)):
        return [_templatize(v, tensors) for v in value]
    return value


def _fill(value: Any, tensors: tuple, clone: bool) -> Any:
    if isinstance(value, _Slot):
        t = tensors[value.index]
        return t.clone() if clone else t
    if isinstance(value, list):
        return [_fill(v, tensors, clone) for v in value]
    return value


class OpModule(torch.nn.Module):
    """Calls one OpOverload with fixed non-tensor arguments; returns its tensor results as a tuple."""

    def __init__(self, op: torch._ops.OpOverload, args: tuple, kwargs: dict, mutates: set[str]) -> None:
        super().__init__()
        self.op = op
        self.args_template = args
        self.kwargs_template = kwargs
        self.mutates = mutates
        # Decided here, not in forward: torch.compile cannot trace through the op's schema objects.
        names = [a.name for a in op._schema.arguments]
        self.clone_args = [i < len(names) and names[i] in mutates for i in range(len(args))]

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = [_fill(v, tensors, c) for v, c in zip(self.args_template, self.clone_args)]
        kwargs = {k: _fill(v, tensors, k in self.mutates) for k, v in self.kwargs_template.items()}
        return tuple(flatten_tensors(self.op(*args, **kwargs)))

    def extra_repr(self) -> str:
        return str(self.op)


def op_module(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[OpModule, tuple[torch.Tensor, ...]]:
    """(module, tensor inputs) for a live call as returned by ``xray.inputs.build_call``."""
    tensors: list[torch.Tensor] = []
    a = tuple(_templatize(v, tensors) for v in args)
    k = {name: _templatize(v, tensors) for name, v in kwargs.items()}
    mutates = {arg.name for arg in op._schema.arguments if arg.alias_info is not None and arg.alias_info.is_write}
    return OpModule(op, a, k, mutates), tuple(tensors)
