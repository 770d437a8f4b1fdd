"""A sum's local error from its own record's statistics: the mean of ``a + alpha * b`` is
``mean(a) + alpha * mean(b)``, whatever the values, broadcasting included (each element of a
broadcast input is repeated equally often).

A statistics-only sum (a residual add, the most common record) is recomputed on its sample only,
and a bug in a few elements its sample did not draw left no trace: its statistics moved from the
other run's by no more than bf16 moves them. Within one run they must still add up. Their miss
bounds the sum's own error from below: where the means are off by d, some element is off by at
least d, so ``d / max |out|`` is a lower bound of its normwise local error. Its floor is the
output's rounding (unit roundoff / 2 of that peak) and the statistics' own float32 partial sums
(``xray/dump/_moments.c``: at most 2 x 64 vector steps of 16 lanes a partial sum, taken as a
random walk, on each of the three tensors).
"""
from __future__ import annotations

import math
from typing import Any

from ..dump.model import Record, Stats, TensorMeta
from ..dump.tensorio import dtype_from_name
from ..numerics.rules import eps
from .local import LocalError

_SUMS = {"aten.add.Tensor": 1.0, "aten.sub.Tensor": -1.0}
_PARTIAL_TERMS = 2 * 64 * 16  # terms of one float32 partial sum of the statistics, at most
_STATS_ROUNDING = 2.0 * math.sqrt(_PARTIAL_TERMS) * 2.0 ** -24  # of a mean, relative to its tensor's peak


def summed_mean_error(record: Record, output: TensorMeta, k: int) -> LocalError | None:
    """Output 0 of an add or a sub of two tensors (``record``), its means against its inputs',
    or None (another op, a scalar operand, statistics missing or not finite)."""
    sign = _SUMS.get(record.op) if k == 0 and record.kind == "op" else None
    a, b, alpha = record.inputs.get("self"), record.inputs.get("other"), record.inputs.get("alpha", 1)
    if sign is None or type(a) is not TensorMeta or type(b) is not TensorMeta or type(alpha) not in (int, float):
        return None
    stats = [getattr(m, "stats", None) for m in (a, b, output)]
    if any(type(s) is not Stats or s.mean is None or s.min is None or s.max is None or s.nan or s.posinf
           or s.neginf for s in stats):
        return None
    n_out = output.numel if output.numel is not None else math.prod(output.shape)
    if any(not m.numel or n_out % m.numel for m in (a, b)):
        return None  # not an even broadcast
    sa, sb, so = stats
    peak = max(abs(so.min), abs(so.max))
    try:
        dtype = dtype_from_name(output.dtype)
    except (ValueError, TypeError):
        return None
    if not (peak > 0 and math.isfinite(peak)):
        return None
    miss = abs(so.mean - (sa.mean + sign * alpha * sb.mean))
    peaks = max(abs(sa.min), abs(sa.max)) + abs(alpha) * max(abs(sb.min), abs(sb.max)) + peak
    floor = eps(dtype) / 2 + _STATS_ROUNDING * peaks / peak
    return LocalError(miss / peak, floor, dtype)
