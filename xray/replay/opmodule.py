"""One recorded op call as a tiny nn.Module: tensors are its inputs, everything else is fixed.

Exporters (torch.export, the ONNX exporter, coremltools) take a module plus example tensors, so
each recorded call becomes ``OpModule(op, template)`` whose ``forward(*tensors)`` puts the tensors
back in their argument slots and calls the OpOverload. Mutated arguments (in-place and ``out=``
ops) are cloned first, so the module is functional and the caller's inputs stay untouched.

Tensors that were parameters in the recorded model (``requires_grad`` leaves, such as a Linear's
weight) can be baked in as buffers instead of inputs: exporters then see constants, as they do
when the whole model is exported (CoreML wants constant conv bias and norm weights; XNNPACK only
delegates linear layers whose weights are constant).
"""
from __future__ import annotations

from typing import Any

import torch

from ..backends.base import flatten_tensors
from ..dump.model import Record, iter_tensors
from ..record.encode import op_info


class _Slot:
    """Placeholder for the i-th tensor input inside the argument template."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<tensor {self.index}>"


class _Const:
    """Placeholder for a tensor baked into the module as the buffer ``name``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _templatize(value: Any, tensors: list[torch.Tensor], every: list[torch.Tensor], constant: list[bool],
                consts: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        i = len(every)
        every.append(value)
        if i < len(constant) and constant[i]:
            name = f"const{len(consts)}"
            consts[name] = value
            return _Const(name)
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, (list, tuple)):
        return [_templatize(v, tensors, every, constant, consts) for v in value]
    return value


def _fill(module: torch.nn.Module, value: Any, tensors: tuple, clone: bool) -> Any:
    if isinstance(value, _Slot):
        t = tensors[value.index]
        return t.clone() if clone else t
    if isinstance(value, _Const):
        t = getattr(module, value.name)
        return t.clone() if clone else t
    if isinstance(value, list):
        return [_fill(module, v, tensors, clone) for v in value]
    return value


class OpModule(torch.nn.Module):
    """Calls one OpOverload with fixed non-tensor arguments; returns its tensor results as a tuple."""

    def __init__(self, op: torch._ops.OpOverload, args: tuple, kwargs: dict, mutates: set[str],
                 consts: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        for name, t in (consts or {}).items():
            self.register_buffer(name, t)
        self.op = op
        self.args_template = args
        self.kwargs_template = kwargs
        self.mutates = mutates
        # Decided here, not in forward: torch.compile cannot trace through the op's schema objects.
        names = [a.name for a in op._schema.arguments]
        self.clone_args = [i < len(names) and names[i] in mutates for i in range(len(args))]

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = [_fill(self, v, tensors, c) for v, c in zip(self.args_template, self.clone_args)]
        kwargs = {k: _fill(self, v, tensors, k in self.mutates) for k, v in self.kwargs_template.items()}
        return tuple(flatten_tensors(self.op(*args, **kwargs)))

    def extra_repr(self) -> str:
        return str(self.op)


def op_module(op: torch._ops.OpOverload, args: tuple, kwargs: dict, constant: list[bool] | None = None
              ) -> tuple[OpModule, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """(module, tensor inputs, every tensor in argument order) for a live call as returned by
    ``xray.ops.rebuild.build_call``; ``constant[i]`` bakes the i-th tensor (argument order) in."""
    tensors: list[torch.Tensor] = []
    every: list[torch.Tensor] = []
    consts: dict[str, torch.Tensor] = {}
    flags = list(constant or [])
    a = tuple(_templatize(v, tensors, every, flags, consts) for v in args)
    k = {name: _templatize(v, tensors, every, flags, consts) for name, v in kwargs.items()}
    return OpModule(op, a, k, set(op_info(op).mutates), consts), tuple(tensors), tuple(every)


def parameter_flags(record: Record, op: torch._ops.OpOverload) -> list[bool]:
    """For each tensor of the record in argument order: was it a parameter (a requires_grad input)?"""
    flags: list[bool] = []
    for a in op._schema.arguments:
        if a.name in record.inputs:
            flags += [meta.requires_grad for _, meta in iter_tensors(record.inputs[a.name], a.name)]
    return flags
