"""A difference that came in through inputs whose records show none.

A failing row whose op computed right on its own inputs is normally precision loss: it carries
what its inputs carry. That needs its inputs to carry something. Where every tensor input agrees
with the bench on all it recorded (statistics and sampled elements, bit for bit) and the output
still differs far beyond what two right kernels can differ on equal inputs (its local floor),
the inputs cannot have been equal: they differ in elements their records do not measure.

Which records measure less than their tensors: a copy whose statistics an earlier recorder handed
on from its input (a clone, a contiguous copy, a cast to its own dtype: the statistics are its
input's, only its sample is its own; today's recorder measures a copy's own, which
sample_verdicts.moved_and_changed holds against its input's), so a bug in a few of its elements
is seen only if the sample draws one. Up the chain of value-moving ops behind the
inputs, the nearest such copy is named; views share their input's memory and cannot be wrong.
Three wrong elements in a clone of 256 (a sparse kernel bug) were called precision loss at the
matmul reading it, in a float32 pair whose every other row was bit-equal.

The same contradiction shows within one run where a consumer measures what the copy handed on:
a same-shape move (an expand of its input's shape, whose data X_DUMP_NUM saved) that moved its
values right, yet whose own statistics are not those its input was recorded with.
"""
from __future__ import annotations

from typing import Any, Callable

from ..dump.model import source_of
from ..dump.tensorio import dtype_from_name
from ..numerics.kernel_families import packet
from ..numerics.selections import selection_of
from .moved_values import same_multiset
from .op_classes import is_value_preserving
from .pending import Pending, row_inputs
from .statistics_only import sample_error

MAX_CHAIN = 64  # value-moving ops looked through behind one input
UNSEEN_FACTOR = 10.0  # how far beyond its local floor (times the precision factor) the row must differ
# ops that write their input's values into new memory (a view shares its input's and cannot be wrong)
_COPIES = frozenset(("aten.clone", "aten.contiguous", "aten._to_copy", "aten.to", "aten.lift_fresh_copy", "aten.copy",
                     "aten._copy_from"))  # (by packet: copy_ is copy)


def unseen_input_difference(p: Pending, k: int, row_err: float | None, floor: float, factor: float,
                            by_seq: Callable[[int], Any]) -> tuple[str, int | None] | None:
    """(why, the seq of the copy named or None) where output ``k`` of ``p`` differs by
    ``row_err`` (its largest measured difference), beyond ``UNSEEN_FACTOR`` x ``factor`` x
    ``floor`` (its local floor, or its local error if larger), while every tensor input agrees on
    its statistics and sample exactly; else None. ``by_seq``: a target seq's Entry, or None."""
    if row_err is None or not row_err > UNSEEN_FACTOR * factor * floor or not _floating(p, k) \
            or selection_of(p.target.op, k) is not None:
        return None  # (a selection's indices may differ on equal inputs: ties broken another way)
    blind = _blind_input(p, k, by_seq)
    if blind is not None:
        entry = by_seq(blind)
        return (f"it moved its input's values right, yet its own statistics are not its input's: the input's "
                f"record does not describe its values; nearest copy whose statistics are its input's: "
                f"{entry.record.op} (seq {blind})"), blind
    bench = dict(p.bench.inputs)
    sources = []
    for name, meta, _, stat in row_inputs(p, k):
        if getattr(meta, "stats", None) is None and getattr(meta, "shape", None) is None:
            continue  # not a tensor
        error = p.input_errors.get(name, stat)
        if error is None or error != 0 or sample_error(bench.get(name), meta) != 0:
            return None  # an input shows a difference (or was not judged): the usual rules weigh it
        sources.append(_seq_of(meta))
    if not sources:
        return None
    copy = next((seq for seq in (_nearest_copy(s, by_seq) for s in sources) if seq is not None), None)
    why = (f"its inputs agree with the bench on every statistic and sampled element and it computed right on "
           f"them, yet its output differs by {row_err:.3g} (beyond {UNSEEN_FACTOR * factor * floor:.3g}): an input "
           "differs where its record does not show it")
    if copy is not None:
        entry = by_seq(copy)
        return why + f"; nearest copy whose statistics are its input's: {entry.record.op} (seq {copy})", copy
    return why + " (elements its sample missed)", None


def _blind_input(p: Pending, k: int, by_seq: Callable[[int], Any]) -> int | None:
    """A value-moving op of one shape (a same-shape view, expand or copy) whose output's
    statistics, measured, differ from those its input was recorded with: it holds its input's
    elements, so the input's record does not describe them. Its statistics were handed on along
    a chain of copies; the nearest copy in it (its seq) changed what it copied. None otherwise."""
    e = p.target
    if k != 0 or not e.inputs or not e.outputs or not is_value_preserving(e.op):
        return None
    src, out = e.inputs[0][1], e.outputs[0][1]
    if getattr(src, "shape", None) != getattr(out, "shape", None) or getattr(src, "dtype", None) != out.dtype:
        return None
    a, b = getattr(src, "stats", None), getattr(out, "stats", None)
    if a is None or b is None or a.mean is None or b.mean is None or same_multiset(a, b):
        return None
    return _nearest_copy(_seq_of(src), by_seq)


def _floating(p: Pending, k: int) -> bool:
    meta = p.target.outputs[k][1] if k < len(p.target.outputs) else None
    try:
        return dtype_from_name(meta.dtype).is_floating_point
    except (AttributeError, ValueError, TypeError):
        return False


def _seq_of(meta: Any) -> int | None:
    src = source_of(meta)
    return src.seq if src is not None and src.kind == "op" else None


def _nearest_copy(seq: int | None, by_seq: Callable[[int], Any]) -> int | None:
    """Up the chain of value-moving ops from the call ``seq`` made: the nearest copy."""
    for _ in range(MAX_CHAIN):
        e = by_seq(seq) if seq is not None else None
        if e is None or e.kind != "op" or not is_value_preserving(e.op) or not e.inputs:
            return None
        if packet(e.op) in _COPIES and _same_statistics(e):
            return seq
        seq = _seq_of(e.inputs[0][1])
    return None


def _same_statistics(e: Any) -> bool:
    """Its output's statistics are its first input's (handed on by the recorder)."""
    out, first = e.outputs[0][1] if e.outputs else None, e.inputs[0][1]
    a, b = getattr(out, "stats", None), getattr(first, "stats", None)
    return a is not None and b is not None and a.mean is not None and \
        all(getattr(a, f) == getattr(b, f) for f in ("min", "max", "mean", "std", "numel"))
