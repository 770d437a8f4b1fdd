"""Local error of an op that only moves values, from its own record's statistics.

A view, a reshape or a copy (the recorder's ``stats_preserving`` ops) holds exactly its input's
elements, so its output's statistics are its input's: the same minimum, maximum, mean and spread
(float64 sums of one multiset, in another order). The recorder hands the input's statistics on
only where that is proven (``record.cache_rules.same_values``: the result is a view of the input);
a copy and a reshaping result in new memory get statistics of their own. Where those differ from
its input's, the op changed what it moved, whatever the other run did: a within-run measure,
blind to the noise two runs carry, so a 5 % bug in a bf16 reshape, or three wrong elements in a
clone of 16k its sample missed, is seen where the two runs' statistics differ by more than that.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..dump.model import Record, Stats, TensorMeta
from ..dump.tensorio import dtype_from_name
from ..numerics.metrics import stats_rms
from ..ops.rebuild import resolve_op
from ..record.encode import op_info
from . import statistics_only
from .local import LocalError

_COUNTS = ("nan", "posinf", "neginf", "numel")
# Ops whose output holds every element of their input the same number of times: one multiset,
# each value r times over, so the same extremes, mean and (population) spread, and r times the
# counts. (A repeat_interleave with a tensor of repeats weighs its elements unevenly: not here.)
UNIFORM_REPEATS = ("aten.repeat.default", "aten.repeat_interleave.self_int")
# One multiset's mean and spread, summed in another order (a strided input and its contiguous
# copy: float64 sums of float32 partial sums): about 1e-7 of their scale at worst. A move's
# statistics against its input's, within one run, differ by no more whatever the tensor's dtype:
# a bf16 copy is judged at this level, not at bf16's rounding.
STATS_RTOL = 1e-5


def same_multiset(a: Stats, b: Stats) -> bool:
    """Whether two statistics can describe one multiset of values: the same extremes and counts,
    mean and spread within ``STATS_RTOL`` of their scale. (``multisets_differ`` is the same rule
    over the index's tensors table.)"""
    if any(getattr(a, f) != getattr(b, f) for f in ("min", "max") + _COUNTS):
        return False
    scale = max(abs(a.mean), a.std or 0.0, abs(a.min or 0.0), abs(a.max or 0.0))
    return abs(a.mean - b.mean) <= STATS_RTOL * scale and abs((a.std or 0.0) - (b.std or 0.0)) <= STATS_RTOL * scale


def multisets_differ(tensors: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``not same_multiset`` for rows ``a`` and ``b`` of the index's tensors table, where both
    hold statistics with none absent (withheld, or no finite element): False elsewhere, where
    they say nothing."""
    both = (tensors["has_stats"][a] != 0) & (tensors["has_stats"][b] != 0) \
        & (tensors["absent"][a] == 0) & (tensors["absent"][b] == 0)
    differ = np.zeros(len(a), dtype=bool)
    for name in ("min", "max") + _COUNTS:
        differ |= tensors[name][a] != tensors[name][b]
    with np.errstate(invalid="ignore"):
        scale = np.fmax.reduce([np.abs(tensors[n][a]) for n in ("mean", "std", "min", "max")])
        for name in ("mean", "std"):
            differ |= np.abs(tensors[name][a] - tensors[name][b]) > STATS_RTOL * scale
    return differ & both


def _first_input(record: Record) -> TensorMeta | None:
    meta = next(iter(record.inputs.values()), None)
    return meta if type(meta) is TensorMeta else None


def _moves_values(op: str) -> bool:
    try:
        return op_info(resolve_op(op)).stats_preserving
    except Exception:  # noqa: BLE001 -- a module name, an unknown or refused op
        return False


def moved_local_error(record: Record, output: TensorMeta, k: int) -> LocalError | None:
    """Output 0 of a value-moving ``record`` (meta ``output``) against its first input, by their
    statistics: the largest difference of min/max/mean/std over the output's RMS (1 where their
    non-finite or element counts differ, a repeat's counts taken ``UNIFORM_REPEATS`` times); None
    for any other op, output or dtype pair, or where either has no statistics. Moving values
    makes no error of its own: its floor is what two reductions of one multiset may differ by
    (``STATS_RTOL``), measured in float64."""
    src = _first_input(record) if k == 0 and record.kind == "op" else None
    repeats = record.op in UNIFORM_REPEATS
    if src is None or src.dtype != output.dtype or not (repeats or _moves_values(record.op)):
        return None
    a, b = src.stats, output.stats
    if type(a) is not Stats or type(b) is not Stats or a.mean is None or b.mean is None:
        return None
    try:
        dtype_from_name(output.dtype)  # (a dtype this torch cannot name: not judged)
    except (ValueError, TypeError):
        return None
    times = 1
    if repeats:  # each element r times: r from the element counts, a whole number or no repeat
        if not a.numel or not b.numel or b.numel % a.numel:
            return None
        times = b.numel // a.numel
    if any(getattr(a, c) * times != getattr(b, c) for c in _COUNTS):
        return LocalError(1.0, STATS_RTOL, torch.float64)
    scale, diff = stats_rms(b) or 0.0, statistics_only.stats_difference(a, b)
    if not math.isfinite(diff):
        return None
    return LocalError(diff / scale if scale > 0 else float(diff > 0), STATS_RTOL, torch.float64)
