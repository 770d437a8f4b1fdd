"""Target-only ops that only add, subtract and cast values both runs made: a sum associated
differently, which carries its terms' differences and makes none of its own.

Autograd accumulates a tensor's gradients in the order they arrive, and under autocast the
order depends on each branch's dtype: a bf16 run casts the float32 branches' sum to bfloat16,
then adds the bf16 branch in a call of its own, where the float32 run adds everything in one
chain. The extra add is recorded on the target only. It cannot be judged like an inserted op
(``x * 1.001`` computes right and is the bug), but a sum of matched terms has a proven bound:
by the triangle inequality, the difference it hands on is at most the sum of its terms'
differences plus each add's rounding. A difference within that bound is carried in; an extra or
doubled term (``x + x``, a residual added twice) moves it by a whole term, beyond the bound.
"""

from __future__ import annotations

import math
from typing import Any

from ..dump.model import TensorMeta
from ..dump.tensorio import dtype_from_name
from ..numerics.rules import eps
from .op_classes import is_cast, is_value_preserving
from .pending import Pending, row_inputs
from .sample_verdicts import sample_peak

SUMS = frozenset({"aten.add.Tensor", "aten.sub.Tensor"})


def reordered_sum(graph: Any, e: Any, p: Pending, k: int, name: str) -> str | None:
    """Why the target-only ops behind input ``name`` of ``p``'s output ``k`` (``e`` the one that made it) carry,
    not make, its difference: every one adds, subtracts, casts or moves values, every tensor they
    read was made by a matched record (a term), and the difference at ``name`` is within the sum
    of the terms' differences and the adds' rounding. None when any of that fails."""
    kind, _, ops = graph.region(e)
    if kind != "target-only" or not ops:
        return None
    terms, sums, units = [], 0, []
    for op in ops:
        if op.op in SUMS:
            if _alpha(op.record) != 1:
                return None
            sums += 1
        elif not (is_cast(op.op) or is_value_preserving(op.op)):
            return None
        for _, meta in op.inputs:
            if not isinstance(meta, TensorMeta):
                continue
            units.append(_unit(meta))
            source, row = graph.producer(meta, op.record.seq)
            if source == "target-only":
                continue
            if source != "settled":
                return None
            terms.append((row, meta))
        units += [_unit(m) for _, m in op.outputs if isinstance(m, TensorMeta)]
    if not sums or not terms:
        return None
    arrived = _arrived(p, k, name)
    carried = [_carried(graph, row) for row, _ in terms]
    if arrived is None or None in carried:
        return None
    rounding = sums * max(units) * sum(sample_peak(m.stats) for _, m in terms)
    bound = sum(carried) + rounding
    if not (math.isfinite(arrived) and math.isfinite(bound)) or arrived > bound:  # (NaN: a peak not recorded)
        return None
    return (f"{len(ops)} target-only op(s) from {e.name} back only add and cast {len(terms)} matched "
            f"record(s)' values: their difference at {name} ({arrived:.3g}) is within what those carry "
            f"and the adds' rounding ({bound:.3g})")


def _alpha(record: Any) -> float:
    alpha = record.inputs.get("alpha", 1)
    value = getattr(alpha, "value", alpha)
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _unit(meta: TensorMeta) -> float:
    try:
        return eps(dtype_from_name(meta.dtype))
    except (TypeError, ValueError, KeyError):
        return 0.0


def _arrived(p: Pending, k: int, name: str) -> float | None:
    """Input ``name``'s largest difference between the runs, in its own units: its error
    (relative to the bench's largest magnitude: data where judged so, else its statistics')
    times that magnitude."""
    err = p.input_errors.get(name)
    if err is None:
        err = next((stat for n, _, _, stat in row_inputs(p, k) if n == name), None)
    bench = dict(p.bench.inputs).get(name)
    return None if err is None or bench is None or not math.isfinite(err) else err * sample_peak(bench.stats)


def _carried(graph: Any, row: Any) -> float | None:
    """A matched term's largest difference, in its own units: its row's error (the largest of
    data, statistics and sample) times the bench's largest magnitude."""
    errors = [x for x in (row.accumulated_err, row.stats_err, row.sample_err) if x is not None and math.isfinite(x)]
    bench = graph.bench_output(row)
    return None if not errors or bench is None else max(errors) * sample_peak(bench.stats)
