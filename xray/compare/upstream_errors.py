"""What a tensor is known to carry: the largest error measured on any record that held its values.

A statistics-only row weighs its own error against what its inputs carry
(``statistics_only.carried_error``). An input's statistics and sample measure it at four
statistics and 32 positions; the same values, held before a transpose, a view or a cast, were
measured at other positions. Under bf16 a key's norm rounds a few of its rows 30 % off, and its
sample shows it; the transposed key that a rotary embedding multiplies next samples other
elements and shows 0.6 %, while its extreme element moved 4 %. Both records measure one set of
values, so what the key carries is the larger.

The walk goes back through ops that keep every element of their input (``keeps_every_element``:
views, transposes, casts, expands, concatenations) to the first op that computed the values,
whose output row is their first measure. It does not pass a slice or a select: a part of a tensor
need not hold the elements that differed.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ..dump.model import source_of
from .op_classes import keeps_every_element

MAX_RECORDS = 16  # records read behind one input, at most: a chain of moves is short


def _range(meta: Any) -> float:
    st = getattr(meta, "stats", None)
    if st is None or st.min is None or st.max is None:
        return math.nan
    return max(abs(st.min), abs(st.max))


def upstream_errors(by_seq: Any, rows_of: Any, row_error: Callable[[Any], float | None]) -> Callable[[Any], float]:
    """``error(meta)``: the largest finite error (``row_error`` of a row: the compare's unit, a
    difference over the bench's largest magnitude) measured on the target records behind a
    target tensor ``meta``, through ops that keep every element, rescaled to its range; 0.0 where
    none was measured. ``by_seq``: target seq -> Entry; ``rows_of``: target position -> its rows.
    Answers are kept by the tensor's source: each chain is walked once."""
    known: dict[str, float] = {}

    def error(meta: Any) -> float:
        key = getattr(meta, "source", None)
        if not key:
            return 0.0
        if key not in known:
            known[key] = _walk(meta)
        return known[key]

    def _walk(meta: Any) -> float:
        scale, best, todo, seen = _range(meta), 0.0, [meta], set()
        while todo and len(seen) < MAX_RECORDS:
            src = source_of(todo.pop())
            if src is None or src.kind != "op" or (src.seq, src.index) in seen:
                continue
            seen.add((src.seq, src.index))
            e = by_seq.get(src.seq)
            if e is None:  # folded by de-dup, or not recorded: nothing measured there
                continue
            rows = rows_of.get(e.pos)
            if rows is not None and src.index < len(rows) and src.index < len(e.outputs):
                err = row_error(rows[src.index])
                ratio = _range(e.outputs[src.index][1]) / scale if scale > 0 else math.nan
                if err is not None and math.isfinite(err) and math.isfinite(ratio):
                    best = max(best, err * min(1.0, ratio))
            if keeps_every_element(e.op):
                todo.extend(m for _, m in e.inputs if getattr(m, "source", None))
        return best

    return error
