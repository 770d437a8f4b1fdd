"""Sample verdicts over a compare's columns: each statistics row is also judged on its sampled
elements (xray.dump.samples; the rule: numerics/sample_judge.py); a sample that fails where the
statistics do not decides the row (``worse_of``, ``sample_decides``: docs/compare.md).

Why: statistics are blind to a bug that keeps min, max, mean and std (a permuted or negated half);
the sample is elementwise evidence on every record. Numpy over ``Columns.sample`` (pairs x 32),
as stat_verdicts.py judges statistics: no Python per row. A dump without samples
(``Columns.sample`` None) leaves every row as its statistics judged it.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..numerics import sample_judge
from ..numerics.metrics import stats_rms
from ..numerics.rules import Rules
from ..numerics.stats_judge import VERDICT_TEXT
from .entry_table import EntryTable
from .moved_values import multisets_differ
from .result import PairStatus

VERDICT_CODE = {text: code for code, text in enumerate(VERDICT_TEXT)}  # "pass" -> 0 ... "nan/inf" -> 3
# the status objects by verdict code: the enum's own strings, shared by every row (stat_verdicts.py too)
_STATUS_OBJECTS = np.array([s.value for s in (PairStatus.PASS, PairStatus.WARNING, PairStatus.FAIL,
                                              PairStatus.NAN_INF)], dtype=object)


DECIDED = "the sample decided"


def sample_note(code: int, beyond: int, k: int) -> str:
    """The note of a row whose sample decided its verdict (statistics agreed better)."""
    if code == sample_judge.NAN_INF:
        return f"{DECIDED}: NaN/Inf on one side only among its {k} sampled elements"
    return f"{DECIDED}: {beyond} of {k} sampled elements beyond their floor where the statistics agree"


def sample_decided(row: Any) -> bool:
    """Whether ``row``'s verdict is its sample's (``sample_note``): the statistics agreed."""
    return any(part.startswith(DECIDED) for part in (row.note or "").split("; "))


def sample_scale(bench: Any, target: Any) -> float:
    """The RMS the sample's element floor scales with: the larger side's, from the statistics
    (0 where neither has a mean: integers and bool, whose tolerance is exact anyway)."""
    rms = [r for r in (stats_rms(bench), stats_rms(target)) if r is not None and math.isfinite(r)]
    return max(rms, default=0.0)


def sample_peak(bench: Any) -> float:
    """The bench's largest magnitude (stats_err's unit), NaN when not recorded."""
    if bench is None or bench.min is None or bench.max is None:
        return math.nan
    return max(abs(bench.min), abs(bench.max))


def _rms_columns(side: dict) -> np.ndarray:
    from ..dump.columns import ABSENT_MEAN, ABSENT_STD

    has_mean, has_std = (side["absent"] & ABSENT_MEAN) == 0, (side["absent"] & ABSENT_STD) == 0
    with np.errstate(all="ignore"):
        rms = np.hypot(side["mean"], np.where(has_std, side["std"], 0.0))
    return np.where(has_mean & np.isfinite(rms), rms, -np.inf)


def _peak_columns(side: dict) -> np.ndarray:
    from ..dump.columns import ABSENT_MAX, ABSENT_MIN

    present = ((side["absent"] & ABSENT_MIN) == 0) & ((side["absent"] & ABSENT_MAX) == 0)
    return np.where(present, np.maximum(np.abs(side["min"]), np.abs(side["max"])), np.nan)


def judge_samples(ta: EntryTable, tb: EntryTable, ao: np.ndarray, bo: np.ndarray, b: dict, t: dict,
                  rtol: np.ndarray, atol: np.ndarray, rules: Rules,
                  stand_in: np.ndarray | None = None, tiny: np.ndarray | float = 0.0) -> dict[str, np.ndarray] | None:
    """The sample verdict of output pairs (``ao``, ``bo``) whose statistics columns are ``b`` and
    ``t`` (stat_verdicts.judge_stats's), or None when either dump has no samples."""
    sa, sb = getattr(ta.columns, "sample", None), getattr(tb.columns, "sample", None)
    na, nb = getattr(ta.columns, "sample_n", None), getattr(tb.columns, "sample_n", None)
    if sa is None or sb is None or na is None or nb is None or not len(ao):
        return None
    ra, rb = ta.out[ao], tb.out[bo]
    scale = np.maximum(_rms_columns(b), _rms_columns(t))
    scale = np.where(np.isfinite(scale), scale, 0.0)
    return sample_judge.judge(np.asarray(sa[ra], dtype=np.float64), np.asarray(sb[rb], dtype=np.float64),
                              na[ra], nb[rb], rtol, atol, scale, _peak_columns(b), rules, stand_in, tiny)


def sample_decides(t: EntryTable, entries: np.ndarray) -> np.ndarray:
    """Whether the sample may decide each entry's rows: ops whose every output element is made
    from the elements at its own position (sample_local.elementwise: gelu, add, a cast) or that
    move values (a view). A matmul's or a sum's element reads n input elements, most of them
    outside its inputs' samples: inputs that agree on 32 elements say little about what it
    summed, and a bf16 backward through relu's mask (elements flipped across the boundary, which
    the samples miss) changes a third of a gradient's sampled elements while every statistic
    agrees (T5, bench_accuracy noise/bf16/backward/stats). One Python call per distinct op."""
    if t.op is None or not len(entries):
        return np.zeros(len(entries), dtype=bool)
    lut = t.codes.lut("op", may_decide, dtype=bool)
    return lut[t.op[entries]]


@functools.lru_cache(maxsize=1024)
def may_decide(op: str) -> bool:
    """``sample_decides`` for one op name (the per-pair path, PairComparer._judge_samples)."""
    from .op_classes import is_value_preserving
    from .sample_local import elementwise

    return elementwise(op) or is_value_preserving(op)


def worse_of(judged: dict[str, np.ndarray], sample: dict[str, np.ndarray] | None, may: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(status, stats_err, decided) of rows judged on statistics (stat_verdicts.judge_stats) and
    on samples (``judge_samples``): where the sample fails (or finds NaN/Inf) and the statistics
    do not, its verdict and the larger error (it decided). A sample within the warning band never
    turns a statistics pass into a warning: 32 elements show bf16's rounding more than four
    statistics averaged over the tensor do, and the statistics-only rules (the run's level,
    outliers within a kind) weigh statistics errors. PairComparer._judge_samples does the same."""
    if sample is None:
        return judged["status"], judged["stats_err"], np.zeros(len(judged["code"]), dtype=bool)
    # Only where the statistics see nothing: where they see a difference (a warning) the
    # statistics-only rules weigh it as the run's precision loss, and an fp32 sample under
    # declared TF32 fails elementwise where that loss is legitimate (ViT, SegFormer views).
    decided = (judged["code"] == sample_judge.PASS) & (sample["verdict"] >= sample_judge.FAIL)
    if may is not None:  # sample_decides
        decided &= may
    status = np.where(decided, _STATUS_OBJECTS[np.maximum(sample["verdict"], 0)], judged["status"])
    return status, np.where(decided, np.fmax(judged["stats_err"], sample["sample_err"]), judged["stats_err"]), decided


# Ops whose output element at an index is their first argument's element at that index, where
# the two have one shape (a clone, a view of the same shape, a cast to the same dtype). Left
# out: ops that move elements to other indices (transpose, permute, diagonal, as_strided) and
# ``copy``, whose first argument is the one it overwrites.
_MOVES_IN_PLACE = frozenset(f"aten.{n}" for n in (
    "view", "_unsafe_view", "reshape", "_reshape_alias", "alias", "clone", "contiguous", "detach", "expand",
    "expand_as", "squeeze", "unsqueeze", "flatten", "unflatten", "select", "slice", "narrow", "split",
    "split_with_sizes", "chunk", "unbind", "view_as", "lift_fresh", "lift_fresh_copy", "_unsafe_split",
    "unsafe_split", "_unsafe_split_with_sizes", "unsafe_split_with_sizes", "repeat", "cat", "stack",
    "expand_copy", "view_copy", "unsqueeze_copy", "squeeze_copy", "alias_copy", "detach_copy", "slice_copy",
    "select_copy", "split_copy", "_to_copy", "to"))

MOVED_CHANGED = "it only moves values, yet its sampled elements or its statistics differ from its input's in the target run"


@functools.lru_cache(maxsize=1024)
def moves_in_place(op: str) -> bool:
    """``_MOVES_IN_PLACE`` for one op name."""
    from ..numerics.kernel_families import packet

    return bool(op) and packet(op) in _MOVES_IN_PLACE


def moved_and_changed(t: EntryTable, entries: np.ndarray, outs: np.ndarray) -> np.ndarray:
    """Whether each output ``outs`` (of entries ``entries``) of an op that only moves values
    differs, on its sample or its statistics, from its first input of the same shape and dtype
    within the one run. The sampled positions come from the shape alone, so such a move that
    changed no value leaves the two samples equal, bit for bit (NaN included); a copy's statistics
    are its own (record.cache_rules.same_values), and one multiset has one minimum, maximum and
    count of each kind, and its mean and spread close (``moved_values.same_multiset``). A 5 % bug in a bf16
    clone stays within bf16's band against a float32 bench, yet its own input shows that the clone
    made it, and so do three wrong elements its sample missed: such a row is suspect, and
    attribution measures its local error (on the sample, and its statistics against its input's)."""
    changed = np.zeros(len(outs), dtype=bool)
    cols = t.columns
    if cols.sample is None or cols.sample_n is None or t.op is None or not len(outs):
        return changed
    tensors = cols.tensors
    from ..dump.columns import INPUT

    moves = t.codes.lut("op", moves_in_place, dtype=bool)[t.op[entries]]
    out_rows = t.out[outs[moves]].astype(np.int64)
    record = tensors["record"]
    first = np.searchsorted(record, record[out_rows], side="left")  # each record's rows: inputs first
    n = cols.sample_n
    same = (tensors["role"][first] == INPUT) & (first != out_rows) \
        & (tensors["shape"][first] == tensors["shape"][out_rows]) & (tensors["dtype"][first] == tensors["dtype"][out_rows]) \
        & (n[first] == n[out_rows]) & (n[out_rows] > 0)
    a, b = cols.sample[first[same]], cols.sample[out_rows[same]]
    width = np.arange(a.shape[1])[None, :] < n[out_rows[same]][:, None]
    differs = ((a != b) & ~(np.isnan(a) & np.isnan(b)) & width).any(axis=1)
    differs |= multisets_differ(tensors, first[same], out_rows[same])
    where = np.flatnonzero(moves)[same]
    changed[where[differs]] = True
    return changed
