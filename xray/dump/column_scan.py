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

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .columns import MARK, Columns, RecordSequence

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
    mismatch = columns.skeleton_mismatches()
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


# ---------------------------------------------------------------------------------------------
# Grouping records by signature (xray-gen's de-duplication, replay's)


def canonical(ids: np.ndarray, decode: Callable[[int], Any]) -> np.ndarray:
    """String ids mapped to the first id of the same decoded value (-1 stays None's): a
    hand-made index may hold one text, or one shape, under two ids, and records holding them
    must still group together."""
    unique, inverse = np.unique(ids, return_inverse=True)
    first: dict[Any, int] = {}
    canon = np.array([first.setdefault(decode(i) if i >= 0 else None, i) for i in unique.tolist()], dtype=np.int64)
    return canon[inverse.reshape(-1)] if len(unique) else ids.astype(np.int64)


@dataclass
class SkeletonKeys:
    """Per row: a number for ``sig(inputs template)`` (equal numbers: equal keys; -1: the key is
    unhashable), how many input and output tensors the record holds; and the skeleton ids whose
    key is unhashable, with the error."""

    numbers: np.ndarray
    n_inputs: np.ndarray
    n_outputs: np.ndarray
    unhashable: dict[int, TypeError]


def skeleton_keys(columns: Columns, rows: np.ndarray, sig: Callable[[dict], Any]) -> SkeletonKeys:
    """``SkeletonKeys`` of ``rows``, each distinct skeleton decoded once. ``sig`` gets the
    skeleton's ``inputs`` with ``MARK`` where a tensor is (``Columns.record`` fills them, in
    order, from the record's first tensor rows)."""
    unique, inverse = np.unique(columns.records["skeleton"][rows], return_inverse=True)
    numbers: dict[Any, int] = {}
    out, n_in, n_out = (np.empty(len(unique), dtype=np.int64) for _ in range(3))
    bad: dict[int, TypeError] = {}
    for k, sid in enumerate(unique.tolist()):
        template = columns.skeleton(sid)[0]
        n_in[k], n_out[k] = columns.skeleton_io(sid)
        try:
            out[k] = numbers.setdefault(sig(template["inputs"]), len(numbers))
        except TypeError as e:  # unhashable junk in a hostile dump
            out[k], bad[sid] = -1, e
    inverse = inverse.reshape(-1)
    return SkeletonKeys(out[inverse], n_in[inverse], n_out[inverse], bad)


def group_rows(columns: Columns, rows: np.ndarray, keys: list[np.ndarray], n_inputs: np.ndarray,
               fields: tuple[str, ...] = ("shape", "dtype", "stride")) -> tuple[np.ndarray, np.ndarray]:
    """Group ``rows`` (ascending) on per-row ``keys`` (integers >= -1) and the ``fields`` of each
    row's ``n_inputs`` input tensors. Returns (first row of each group, in order; each row's group).

    Rows with equal keys have as many input tensors (the keys include the skeleton's), so each
    such set's tensor keys form one matrix, grouped at once."""
    if not len(rows):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    tensor_key = _input_tensor_keys(columns, rows, n_inputs, fields)
    pre = combine(keys)
    order = np.argsort(pre, kind="stable")
    bounds = np.searchsorted(pre[order], np.arange(int(pre.max()) + 2))
    group = np.empty(len(rows), dtype=np.int64)
    next_id = 0
    begin = columns.records["t_begin"]
    for g in range(len(bounds) - 1):
        idx = order[bounds[g]:bounds[g + 1]]  # positions in ``rows``
        n = int(n_inputs[idx[0]])
        at = begin[rows[idx]][:, None] + np.arange(n)[None, :]
        sub = combine([tensor_key[at[:, j]] for j in range(n)]) if n else np.zeros(len(idx), dtype=np.int64)
        group[idx] = next_id + sub
        next_id += int(sub.max()) + 1
    _, first_pos, group = np.unique(group, return_index=True, return_inverse=True)
    order = np.argsort(first_pos, kind="stable")  # number groups by their first row
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rows[first_pos[order]], rank[group.reshape(-1)]


def combine(parts: list[np.ndarray]) -> np.ndarray:
    """One dense number per position for a tuple of integer columns (values >= -1): equal
    numbers, equal tuples. Pairs are folded into one int64 a column at a time (no overflow:
    each step's left side is dense)."""
    key = parts[0].astype(np.int64) + 1
    for p in parts[1:]:
        _, key = np.unique(key, return_inverse=True)
        key = key.reshape(-1).astype(np.int64) * (int(p.max()) + 2) + (p.astype(np.int64) + 1)
    _, key = np.unique(key, return_inverse=True)
    return key.reshape(-1)


def _input_tensor_keys(columns: Columns, rows: np.ndarray, n_inputs: np.ndarray, fields: tuple[str, ...]
                       ) -> np.ndarray:
    """A number for the ``fields`` of each tensor row that is an input of ``rows`` (equal
    numbers: equal decoded values; -1 elsewhere), decoding each distinct string once."""
    t = columns.tensors
    starts = columns.records["t_begin"][rows]
    total = int(n_inputs.sum())
    offsets = np.arange(total) - np.repeat(np.cumsum(n_inputs) - n_inputs, n_inputs)
    at = np.repeat(starts, n_inputs) + offsets
    decode = {"shape": columns.shape, "stride": columns.shape, "dtype": columns.strings.__getitem__}
    keys = np.full(len(t), -1, dtype=np.int64)
    if total:
        keys[at] = combine([canonical(t[f][at], decode[f]) if f in decode else t[f][at] for f in fields])
    return keys


def op_call_counts(columns: Columns) -> Counter:
    """Calls per op name, de-duplicated records counted with every call folded into them, in
    the order ops first appear: the counts ``xray info`` prints and compare's de-dup rules read."""
    r = columns.records
    op_rows = columns.select(kind="op")
    ops = canonical(r["op"], columns.strings.__getitem__)[op_rows]
    unique, first, inverse = np.unique(ops, return_index=True, return_inverse=True)
    sums = np.bincount(inverse.reshape(-1), weights=r["count"][op_rows], minlength=len(unique))
    calls = Counter()
    for k in np.argsort(first, kind="stable").tolist():  # Counter order: first appearance (ties in most_common)
        calls[columns.strings[int(unique[k])]] = int(sums[k])
    return calls


__all__ = ["MARK", "SkeletonKeys", "canonical", "check_records", "combine", "group_rows", "native_columns",
           "op_call_counts", "skeleton_keys"]

