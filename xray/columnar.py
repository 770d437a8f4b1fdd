"""What xray-summary, xray-gen, xray-replay and ``xray info`` share to read a trace dump's columns.

A format-v3 trace dump holds its index as columns (``xray.dump.columns``) and builds a Record
only when one is read (~10 us each): a tool that walks ``dump.records`` pays minutes of Python
for a million records. These tools scan the columns instead and materialise only the Records
they render. Two rules keep that fast path from ever diverging from the record path:

- ``native_columns`` takes the columns only where they are the dump's own index; a dump whose
  Records are already in memory (format v1/v2 JSON, module dumps) keeps the record path, which
  is cheaper there than building columns first.
- ``check_records`` refuses a hostile index exactly as iterating ``dump.records`` would: with
  the error of the first record that cannot be built, even one the tool would never render.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import numpy as np

from .dump.columns import Columns, RecordSequence

# The record columns holding a string a Record decodes (and checks), and the tensor columns.
_RECORD_TEXTS = ("op", "module", "module_stack", "stack", "skeleton")
_TENSOR_TEXTS = ("dtype", "device")  # shapes and strides are checked when the index is read
_TENSOR_DATA = ("data", "note", "src_name")  # decoded as they are: only UTF-8 and length can fail


def native_columns(dump: Any) -> Columns | None:
    """The dump's columns when they are its native index (a v3 trace dump, whose ``records``
    builds each Record on access), else None: use ``dump.records``."""
    records = getattr(dump, "records", None)
    if isinstance(records, RecordSequence) and records.rows is None:
        return records.columns
    return None


def check_records(columns: Columns) -> None:
    """Raise the error ``list(dump.records)`` would raise (the first record that cannot be
    built), without building them all.

    Every string a Record decodes is checked once per distinct string: by building the first
    record that uses it (a record that fails first must be one of those: the string that fails
    it was used first there), or, for the per-tensor texts that are mostly distinct (saved-data
    references), by decoding it. A skeleton's tensor count is checked against every row."""
    bad = _first_failing_user(columns)
    mismatch = _count_mismatches(columns)
    if len(mismatch):
        bad = int(mismatch[0]) if bad is None else min(bad, int(mismatch[0]))
    if bad is not None:
        columns.record(bad)  # raises that record's error, located, as the record path would


def _first_failing_user(columns: Columns) -> int | None:
    """The first record row that cannot be built among the first users of each string."""
    r, t = columns.records, columns.tensors
    firsts: set[int] = set()
    for name in _RECORD_TEXTS:
        firsts.update(_first_users(r[name]))
    for name in _TENSOR_TEXTS:
        firsts.update(t["record"][_first_users(t[name])].tolist())
    for name in _TENSOR_DATA:
        firsts.update(_undecodable_users(columns, t[name], t["record"]))
    for row in sorted(firsts):
        try:
            columns.record(row)
        except ValueError:  # ColumnsError is a DumpFormatError, a ValueError
            return row
    return None


def _first_users(col: np.ndarray) -> list[int]:
    """The row of the first occurrence of each distinct non-absent value of ``col``."""
    values, first = np.unique(col, return_index=True)
    return first[values >= 0].tolist()


def _undecodable_users(columns: Columns, col: np.ndarray, owner: np.ndarray) -> list[int]:
    """Record rows whose tensors hold a string (of ``col``) that does not decode."""
    bad = []
    for i in np.unique(col[col >= 0]).tolist():
        try:
            columns.strings[i]
        except ValueError:
            bad.append(i)
    if not bad:
        return []
    return [int(owner[np.flatnonzero(np.isin(col, bad))[0]])]


def _count_mismatches(columns: Columns) -> np.ndarray:
    """Rows whose tensor rows are not as many as their skeleton's tensors (sorted)."""
    r = columns.records
    skeletons, inverse = np.unique(r["skeleton"], return_inverse=True)
    counts = np.empty(len(skeletons), dtype=np.int64)
    for k, s in enumerate(skeletons.tolist()):
        try:
            counts[k] = columns._skeleton(s)[1]
        except ValueError:
            counts[k] = -1  # an unreadable skeleton: its first user fails in _first_failing_user
    expected = counts[inverse.reshape(-1)]
    return np.flatnonzero((expected >= 0) & (expected != r["t_end"] - r["t_begin"]))


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Suspend Python's cyclic collector while a column chunk becomes Python values: the fresh
    lists and tuples are acyclic, but creating a hundred thousand of them triggers collections
    that walk every object alive (measured: 0.2 s of a 0.25 s chunk). Never held across a yield."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def texts(columns: Columns, ids: Iterable[int]) -> dict[int, str | None]:
    """Decoded strings by id (-1: None), each decoded once."""
    return {i: columns.strings.get(i) for i in set(ids)}


__all__ = ["check_records", "native_columns", "no_cyclic_gc", "texts"]
