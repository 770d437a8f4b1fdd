"""Local error on the sample: an elementwise op recomputed on its inputs' sampled elements.

A statistics-only record cannot be recomputed (local.py needs saved tensors), so it was blind to
whether the op computed right on what it received. Where each sampled output element depends only
on sampled input elements, it need not be: positions are drawn axis by axis, aligned as
broadcasting aligns them (xray.dump.samples), so a pointwise op (torch's ``Tag.pointwise``: add,
mul, gelu, where...) or a cast gives its output's sample from its inputs' samples, whether they
have the output's shape or broadcast to it (a norm's ``x * rsqrt(var)``, a weight, a bias, a
mask); 0-d inputs and inputs sampled whole (at most 32 elements) are broadcast as they are.
A multi-tensor op (``_foreach_*``: an optimizer's step) whose single-tensor op is pointwise is
its list items' calls side by side: item i of its result is that op on item i of each list, so
it is re-run on that item alone (``_item_call``).
The sampled values are re-run as 1-D tensors with the record's other arguments, in float64 and at
the recorded dtypes, and measured as local.py measures saved tensors (``local.measure``, the
same device floors); an error beyond its floor makes the row born, one within it leaves the row to
the statistics-only rules (causality.attribute).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

import numpy as np
import torch

from ..dump.model import Record, TensorMeta
from ..dump.samples import SAMPLE_SIZE, positions
from ..dump.tensorio import dtype_from_name
from ..ops.nondeterminism import nondeterministic
from ..ops.rebuild import is_pointwise, rebuild_with, resolve_op
from .local import LocalError, measure, runner

# ops that move or cast each element on its own but carry no pointwise tag
_ELEMENTWISE = frozenset(("aten._to_copy.default", "aten.copy_.default", "aten.detach.default",
                          "aten.alias.default", "aten.lift_fresh_copy.default"))


class _NotSampled(Exception):
    """An input whose sampled elements are not the ones the output's sample needs."""


_FOREACH = re.compile(r"aten\._foreach_(\w+?)_?\.\w+$")


def _elementwise(func: torch._ops.OpOverload, op: str) -> bool:
    return is_pointwise(func) or (op in _ELEMENTWISE and "out" not in func._overloadname)


@functools.lru_cache(maxsize=256)
def _foreach_pointwise(op: str) -> bool:
    """A multi-tensor op whose single-tensor op (``_foreach_lerp_.Scalar``: ``lerp``; an in-place
    one's by its out-of-place name) is elementwise in some overload (``_elementwise``), or whose
    in-place single-tensor op is (``_foreach_copy_``: ``copy_``)."""
    m = _FOREACH.match(op)
    packet = getattr(torch.ops.aten, m[1], None) if m else None
    if packet is None:
        return False
    return f"aten.{m[1]}_.default" in _ELEMENTWISE or any(
        _elementwise(getattr(packet, name), f"aten.{m[1]}.{name}") for name in packet.overloads())


def _item_call(record: Record, k: int) -> tuple[Record, int] | None:
    """(the call on one list item, its output's index) for output ``k`` of a multi-tensor op
    whose items are each made element by element from the items at their own index (outputs
    flattened: ``out0.88`` is list 0's item 88): each argument list as long as that output's list
    keeps item 88 alone, and the op runs on it as on one tensor. None for another op, or where
    the item is not its first list argument's shape (``_foreach_max``: one value an item)."""
    if not _foreach_pointwise(record.op):
        return None
    flat = 0
    for j, out in enumerate(record.outputs):
        items = out if isinstance(out, (list, tuple)) else [out]
        if k < flat + len(items):
            i, length = k - flat, len(items)
            break
        flat += len(items)
    else:
        return None
    first = next((v for v in record.inputs.values() if isinstance(v, (list, tuple)) and len(v) == length), None)
    if first is None or not isinstance(first[i], TensorMeta) or tuple(first[i].shape) != tuple(items[i].shape):
        return None
    inputs = {name: [v[i]] if isinstance(v, (list, tuple)) and len(v) == length else v
              for name, v in record.inputs.items()}
    outputs = [[out[i]] if isinstance(out, (list, tuple)) and len(out) == length else out for out in record.outputs]
    return dataclasses.replace(record, inputs=inputs, outputs=outputs), j


def elementwise(op: str) -> bool:
    """Whether each output element of ``op`` (a recorded op name) is made from the input elements
    at its own position: torch's pointwise ops and casts."""
    try:
        return _elementwise(resolve_op(op), op)
    except Exception:  # noqa: BLE001 -- a module name, an unknown or refused op
        return False


def _input_values(meta: TensorMeta, shape: tuple[int, ...], where: np.ndarray) -> torch.Tensor:
    """``meta``'s values at the output's sampled positions ``where`` (row-major indices into
    ``shape``): a 0-d tensor as is; a tensor sampled whole (at most SAMPLE_SIZE elements)
    broadcast; else its own sample, when its shape broadcasts to the output's (positions are drawn
    axis by axis, aligned as broadcasting aligns them: its j-th value is the one the output's j-th
    reads, xray.dump.samples.positions); else _NotSampled."""
    sample = getattr(meta, "sample", None)
    dtype = dtype_from_name(meta.dtype)
    if sample is None or dtype.is_complex:
        raise _NotSampled
    mine = tuple(meta.shape)
    values = np.asarray(sample, dtype=np.float64)
    if mine == ():
        if len(values) != 1:
            raise _NotSampled
        return torch.tensor(values[0], dtype=torch.float64).to(dtype)
    if len(mine) > len(shape) or any(a not in (1, b) for a, b in zip(mine[::-1], shape[::-1])):
        raise _NotSampled
    n = int(np.prod(mine))
    if n > SAMPLE_SIZE:  # drawn, as the output was: value j is the one output draw j reads
        if len(values) != len(where):
            raise _NotSampled
        return torch.from_numpy(values.copy()).to(dtype)
    if len(values) != n:
        raise _NotSampled
    coords = np.unravel_index(where, shape) if shape else ()
    lead = len(shape) - len(mine)
    index = tuple(coords[lead + i] if s > 1 else np.zeros_like(where) for i, s in enumerate(mine))
    return torch.from_numpy(values.reshape(mine)[index].copy()).to(dtype)


def _flat(out: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if out is None or out.numel() != n else out.reshape(-1)


def _sampled_run(record: Record, shape: tuple[int, ...], k: int):
    """(``runner``'s run of output ``k`` of an elementwise ``record`` on its inputs' sampled
    values, at the positions an output of ``shape`` is sampled at; how many there are), or None
    for another op. Raises _NotSampled where an input's sample does not hold them."""
    func = resolve_op(record.op)
    item = _item_call(record, k)
    if item is not None:
        record, k = item
    elif not _elementwise(func, record.op):
        return None
    where = np.asarray(positions(shape), dtype=np.int64)
    func, args, kwargs = rebuild_with(record, lambda m: _input_values(m, shape, where))
    return runner(record.op, func, args, kwargs, k), len(where)


def sample_local_error(record: Record, output: TensorMeta, k: int) -> LocalError | None:
    """Local error of output ``k`` (meta ``output``) of an elementwise ``record``, recomputed on
    its inputs' samples; None where the sample cannot give it (another kind of op, an input whose
    needed elements were not sampled, no samples, a random op)."""
    target = getattr(output, "sample", None)
    if record.kind != "op" or not target or nondeterministic(record):
        return None
    try:
        sampled = _sampled_run(record, tuple(output.shape), k)
        if sampled is None or sampled[1] != len(target):
            return None
        run = sampled[0]
        # the target's sampled values in its dtype (a sample holds them exactly); no precision
        # steps: an error on 32 elements only makes a row born (causality.attribute)
        got = torch.tensor(target, dtype=torch.float64).to(dtype_from_name(output.dtype))
        return measure(lambda fn: _flat(run(fn), len(target)), got, steps=False)
    except _NotSampled:
        return None
    except Exception:  # noqa: BLE001 -- any op may refuse these inputs or float64: no local error then
        return None


def carried_on_sample(bench: Record, target: Record, output: TensorMeta, k: int) -> float | None:
    """What output ``k`` (the target's meta ``output``) of an elementwise op differs by through its
    inputs alone: the op run in float64 on the bench's input samples and on the target's, at the
    output's sampled positions; their largest difference over the first's largest magnitude (a
    row's ``stats_err`` unit). A nonlinear op moves an error between elements: ``rsqrt`` of a
    norm's variance turns its smallest value, whose relative error is the largest, into its
    output's peak, so what its input carries measured at the input's peak says too little. None
    where the samples cannot give it (another op or kind, inputs not sampled, a random op)."""
    if bench.kind != "op" or target.kind != "op" or bench.op != target.op or nondeterministic(target):
        return None
    try:
        values = []
        for record in (bench, target):
            sampled = _sampled_run(record, tuple(output.shape), k)
            got = None if sampled is None else sampled[0](lambda t: t.to(torch.float64) if t.is_floating_point() else t)
            if got is None or got.numel() != sampled[1]:
                return None
            values.append(got.reshape(-1).to(torch.float64))
        peak = float(values[0].abs().max()) if values[0].numel() else 0.0
        diff = float((values[1] - values[0]).abs().max()) if values[0].numel() else 0.0
        return diff / peak if peak > 0 and math.isfinite(diff) else None
    except _NotSampled:
        return None
    except Exception:  # noqa: BLE001 -- any op may refuse these inputs or float64
        return None


def tensor_arguments(record: Record) -> list[tuple[str, TensorMeta]] | None:
    """``record``'s tensor arguments in call order, or None where one is a list (its items are
    no single value to substitute)."""
    out = []
    for name, v in record.inputs.items():
        if isinstance(v, (list, tuple)) and any(isinstance(x, TensorMeta) for x in v):
            return None
        if isinstance(v, TensorMeta):
            out.append((name, v))
    return out


def swapped_local_error(bench: Record, target: Record, k: int) -> LocalError | None:
    """The target's elementwise op run on the bench op's sampled inputs, measured against the
    bench's output ``k`` on its sample: whether two different ops (a bench ``gelu``, a target
    ``silu``) compute one function of the same values. Its tensor arguments, in call order, are
    the bench's (same count and shapes), its other arguments its own. None where the samples
    cannot tell (another kind of op, a random one, arguments that do not line up)."""
    ours, theirs = tensor_arguments(target), tensor_arguments(bench)
    if ours is None or theirs is None or len(ours) != len(theirs) or not ours \
            or any(tuple(a.shape) != tuple(b.shape) for (_, a), (_, b) in zip(ours, theirs)) \
            or k >= len(bench.outputs) or len(bench.outputs) != len(target.outputs) \
            or not isinstance(bench.outputs[k], TensorMeta):
        return None
    given = {name: meta for (name, _), (_, meta) in zip(ours, theirs)}
    swapped = dataclasses.replace(target, inputs={n: given.get(n, v) for n, v in target.inputs.items()})
    return sample_local_error(swapped, bench.outputs[k], k)
