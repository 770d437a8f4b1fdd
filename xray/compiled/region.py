"""The values a fused kernel received, for compare's local error: each input of a record whose
output a kernel materialised, recomputed in float64 from the compiled run's own materialised
values when inductor fused it away.

Compare judges a call on its own inputs (its local error: the target's output against a float64
re-run of the call on the target's recorded inputs). A kernel that fuses ``gelu`` into
``layer_norm`` materialises LayerNorm's output but never GELU's, so the LayerNorm record's input
does not exist in the compiled run. It is rebuilt here: the eager records between the kernel's
output and the nearest values the compiled run did materialise (earlier kernels' buffers, weights,
model inputs) are re-run in float64 on those values, eager's semantics and not the compiled
graph's (a wrong decomposition or graph pass is in the compiled graph). The LayerNorm record's
local error is then the kernel's: what it wrote against the model's own ops on what it was given,
with the ops it fused in between. An error the kernel received is in its inputs and stays
inherited; one it made is born there. Rounding to the recorded dtype is the only rounding the
rebuilt input carries (inductor keeps fused intermediates unrounded, so a bf16 kernel is judged
against at most one rounding more than it made).
"""
from __future__ import annotations

from typing import Any

import torch

from ..dump.model import Record, Scalar, Source, TensorMeta
from ..ops.nondeterminism import nondeterministic
from ..ops.rebuild import place, resolve_op, scalar_value, split_args

MAX_NUMEL = 1 << 22  # as compare's local error: float64 re-runs of larger tensors are skipped
_FLOATS = ("float32", "bfloat16", "float16", "torch.float32", "torch.bfloat16", "torch.float16")


class _Unavailable(Exception):
    """A value the region cannot rebuild (random, unsaved, too large, an op that refuses float64)."""


class Region:
    """Rebuilds fused-away record outputs in float64 from materialised values; one per dump."""

    def __init__(self, eager: Any, by_seq: dict[int, Record], materialised: dict[tuple[int, int], torch.Tensor]) -> None:
        self.eager, self.by_seq, self.materialised = eager, by_seq, materialised
        self.cache: dict[int, list[torch.Tensor | None] | None] = {}  # seq -> float64 outputs (None: unavailable)
        self.ops: dict[int, set[int]] = {}  # seq -> the fused-away records its rebuilt value re-ran

    def input_value(self, meta: TensorMeta) -> tuple[torch.Tensor, set[int]] | None:
        """The float64 value of a record input whose producer was fused away, and the records
        re-run to get it; None when it cannot be rebuilt."""
        try:
            src = Source.parse(meta.source)
        except ValueError:
            return None
        if src is None or src.kind != "op":
            return None
        try:
            value = self._output(src.seq, src.index)
        except _Unavailable:
            return None
        if value is None or tuple(value.shape) != tuple(meta.shape):
            return None
        return value, self.ops.get(src.seq, set())

    def _leaf(self, meta: TensorMeta) -> torch.Tensor:
        try:
            src = Source.parse(meta.source)
        except ValueError:
            src = None
        if src is not None and src.kind == "op":
            return self._output(src.seq, src.index)
        if meta.numel > MAX_NUMEL or meta.data is None or not self.eager.has_data(meta):
            raise _Unavailable  # a weight or model input the eager dump did not save
        t = self.eager.load_tensor(meta).reshape(meta.shape)
        return t.double() if t.is_floating_point() else t

    def _output(self, seq: int, index: int) -> torch.Tensor:
        hit = self.materialised.get((seq, index))
        if hit is not None:
            return hit.double() if hit.is_floating_point() else hit
        if seq not in self.cache:
            self.cache[seq] = None  # a cycle or a failure leaves it unavailable
            self.cache[seq] = self._run(seq)
        outs = self.cache[seq]
        if outs is None or index >= len(outs) or outs[index] is None:
            raise _Unavailable
        return outs[index]

    def _run(self, seq: int) -> list[torch.Tensor | None] | None:
        rec = self.by_seq.get(seq)
        if rec is None or rec.kind != "op" or nondeterministic(rec) or any(m.numel > MAX_NUMEL for _, m in rec.output_tensors()):
            return None
        ran: set[int] = {seq}
        try:
            func = resolve_op(rec.op)
            values = {}
            for a in func._schema.arguments:
                if a.name in rec.inputs:
                    values[a.name] = self._live(rec.inputs[a.name], ran)
            args, kwargs = split_args(func, values, f"record seq={seq}")
            with torch.no_grad():
                out = func(*args, **kwargs)
        except _Unavailable:
            return None
        except Exception:  # noqa: BLE001 - an op that refuses float64 or these inputs: not rebuilt
            return None
        self.ops[seq] = ran
        flat = out if isinstance(out, (list, tuple)) else [out]
        return [t.detach() if isinstance(t, torch.Tensor) else None for t in _flatten(flat)]

    def _live(self, value: Any, ran: set[int]) -> Any:
        if isinstance(value, TensorMeta):
            t = self._leaf(value)
            try:
                src = Source.parse(value.source)
            except ValueError:
                src = None
            if src is not None and src.kind == "op":
                ran |= self.ops.get(src.seq, set())
            return place(t, value.stride, torch.device("cpu")) if t.numel() == value.numel else t
        if isinstance(value, Scalar):
            if value.tag == "dtype" and value.value in _FLOATS:
                return torch.float64  # a cast to the run's float dtype stays in float64 here
            return scalar_value(value)
        if isinstance(value, (list, tuple)):
            return [self._live(v, ran) for v in value]
        return value


def _flatten(v: Any) -> list[Any]:
    out: list[Any] = []
    for x in v:
        if isinstance(x, (list, tuple)):
            out.extend(_flatten(x))
        else:
            out.append(x)
    return out
