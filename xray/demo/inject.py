"""Fault injection: make one operator call wrong on purpose, to rehearse a precision hunt.

The demo and the tests use it to play a "target device" with a real kernel bug. Enter it
*before* the dump: a dispatch mode entered later sits above it and would see the correct
output, whereas below the tracer the faulty output is recorded as the op's own result, exactly
as a buggy backend kernel would produce it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass
class FaultSpec:
    op: str = "aten.mm.default"  #: OpOverload name to corrupt
    call: int = 0  #: which call of that op (0-based, in execution order)
    scale: float = 1.01  #: multiply the first output by this
    offset: float = 0.0  #: then add this


class InjectFault(TorchDispatchMode):
    """Corrupt the ``spec.call``-th call of ``spec.op``; ``hit`` says whether it happened."""

    def __init__(self, spec: FaultSpec | None = None, **kw) -> None:
        super().__init__()
        self.spec = spec or FaultSpec(**kw)
        self.calls = 0
        self.hit = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func) != self.spec.op:
            return out
        index, self.calls = self.calls, self.calls + 1
        if index != self.spec.call or not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        self.hit = True
        return out * self.spec.scale + self.spec.offset
