"""Compare two format-v3 dumps on their columns: entries, alignment and statistics verdicts in numpy.

Why: a million Records take minutes to build and gigabytes to hold, while what compare needs of
almost all of them (kind, direction, step, module path, op, output shapes, dtypes and statistics)
is already in the columns. Records are built only where the rules look closer: pairs the
vectorised statistics judge does not cover (saved data, dtype or shape differences, random ops,
missing statistics, which ``PairComparer.compare`` judges as before) and the suspect pairs that
attribution walks from (causality.py, through lazy entries and a lazy ``Matches``).

The rows are the record path's, field for field (``compare_loaded`` on the same dumps as Records;
tests/test_compare_columns.py). This module runs the steps in order and frees memory between
them: entry_table.py (entries as arrays), alignment.py (pairs and row layout), stat_verdicts.py
(the numpy judge), row_building.py (CompareRows), lazy_entries.py and lazy_matches.py (what
attribution reads).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..ops.nondeterminism import _op_kind, nondeterministic
from ..numerics.rules import Rules
from .alignment import RowPlan, align_tables
from .causality import attribute
from .entry_table import MODULE, Codes, EntryTable, Vocab
from .op_classes import skip_kernel_specific
from .lazy_entries import LazyEntries
from .lazy_matches import matches_of
from .result import CompareRow
from .row_building import judge_the_rest, make_rows
from .stat_verdicts import covered_by_stats, tolerances


def compare_columns(bench: Any, target: Any, rules: Rules, *, rank: str = "",
                    progress: bool | None = None) -> tuple[list[CompareRow], dict]:
    """compare_loaded for two columnar dumps (no reference run): the same rows and totals."""
    from .engine import PairComparer, progress_bar

    started = time.perf_counter()
    codes = Codes()
    ta, tb = EntryTable(bench.columns, codes), EntryTable(target.columns, codes)
    pa, pb, anchors = align_tables(ta, tb, codes)
    ea, eb = LazyEntries(ta), LazyEntries(tb)
    plan = RowPlan(ta, tb, pa, pb)
    _name_rows(ta, tb, pa, pb)
    vocab = Vocab(codes)
    floor, tols = tolerances(ta, tb, plan, rules, vocab)
    comparer = PairComparer(bench, target, rules, None, floor)
    random_of = _random_of(ta, ea)
    for t in (ta, tb):
        t.trim("group", "op", "path", "call_index")
    comparer.bar = progress_bar(_total_bytes(ta, vocab), rank, progress)
    fast = covered_by_stats(ta, tb, plan, random_of, vocab)
    _return_freed_memory()
    rows = make_rows(rank, ta, tb, plan, fast, tols, rules, vocab)
    random_rows = judge_the_rest(bench, target, ta, tb, plan, fast, rows, comparer, random_of)
    comparer.bar.close()
    for t in (ta, tb):
        t.trim("out_name", "out_dtype", "out_shape", "seq_value")
    ta.trim("out", "out_start", "n_out")  # the bench's outputs are read through its Records from here on
    plan.trim()
    _return_freed_memory()
    skip_kernel_specific(rows)
    matches, suspect = matches_of(ta, tb, ea, eb, plan, rows, random_rows)
    attribute(ea, eb, suspect, comparer, rules, target, matches)
    totals = {"bench_records": len(ta), "target_records": len(tb), "matched": len(pa), "anchors": anchors,
              "bytes_compared": comparer.bytes, "seconds": round(time.perf_counter() - started, 3)}
    return rows, totals


def _return_freed_memory() -> None:
    """Give the arrays freed so far back to the OS (glibc's malloc_trim; elsewhere nothing).

    Why: glibc raises its mmap threshold each time a large block is freed, so the later arrays
    of a few MB live in the heap, and freeing them (``trim``) leaves RSS where it was. Compare
    then holds a million rows beside both indexes; the arrays it dropped are ~100 MB of that."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def _name_rows(ta: EntryTable, tb: EntryTable, pa: np.ndarray, pb: np.ndarray) -> None:
    """Names and seqs of both sides' entries, the target's shared with its matched bench entry."""
    partner = np.full(len(tb), -1, dtype=np.int64)
    partner[pb] = pa
    ta.name_rows()
    tb.name_rows(ta, partner)


def _random_of(ta: EntryTable, ea: LazyEntries) -> dict[int, str]:
    """engine._random_entries over a table: only ops whose name can be random build a Record."""
    from .engine import random_modules

    out: dict[int, str] = {}
    sources: dict[str, str] = {}
    is_op = ta.kind != MODULE
    codes, first = np.unique(ta.op[is_op], return_index=True)
    texts = ta.op_text[np.flatnonzero(is_op)[first]].tolist()
    maybe = [c for c, op in zip(codes.tolist(), texts) if _op_kind(op) is not None]
    if not maybe:
        return out
    for pos in np.flatnonzero(is_op & np.isin(ta.op, maybe)).tolist():
        why = nondeterministic(ea[pos].record)
        if why:
            out[pos] = why
            sources.setdefault(ea[pos].path, why)
    if sources:
        modules = np.flatnonzero(ta.kind == MODULE)
        out.update(random_modules(sources, zip(modules.tolist(), ta.path_text[modules].tolist())))
    return out


def _total_bytes(t: EntryTable, vocab: Vocab) -> int:
    """Bytes of the bench's saved outputs, twice (the progress bar's total; compare_loaded's)."""
    from .engine import _torch_dtype

    saved = np.flatnonzero(t.stat("data", np.arange(len(t.out))) >= 0)
    if not len(saved):
        return 0
    itemsize = np.array([0 if d is None else d.itemsize for d in map(_torch_dtype, vocab.dtype.tolist())],
                        dtype=np.int64)
    numel = vocab.numel[t.out_shape[saved]].astype(np.int64)
    return int((numel * itemsize[t.out_dtype[saved]]).sum()) * 2
