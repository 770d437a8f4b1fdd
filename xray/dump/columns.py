"""The record index as typed columns (trace format v3): one row per record, one per tensor.

Why columns: a million JSON records take a minute to parse and gigabytes to hold as objects, while
the same index as two numpy tables opens at once and scans at memory speed. Tools that look at
every record (compare's matching, summary tables, gen's de-duplication) read the columns; a
``Record`` is built only when one is asked for (``Columns.record(i)``), from its row, its tensor
rows and its *skeleton*.

- ``records`` and ``tensors``: ``Table``s (one contiguous array per column) with the fields of
  ``RECORD_DTYPE`` and ``TENSOR_DTYPE``. A record's tensors are the rows ``t_begin:t_end``:
  inputs, then outputs, then params, in the order ``Record.input_tensors()`` /
  ``output_tensors()`` / ``params`` give them.
- Every text (op and module names, dtypes, shapes, argument names, data references...) is an
  index into one ``StringTable`` (strings.py); -1 means "absent" (None).
- The skeleton is the rest of a record as JSON (non-tensor arguments, list structure, mutated
  arguments, keywords), each tensor written as ``{"t": "@"}``. Records of one op with the same
  non-tensor arguments share one skeleton string, so a million records hold a few thousand.

Nothing here trusts its input: ``Columns.validate`` checks every column's range once, with numpy,
and every distinct text a record uses (skeleton.py decodes them). Building columns from records
is column_builder.py; the file on disk, index_file.py (docs/format.md, version 3).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from .errors import ColumnsError
from .model import CHECK_SIZE, DTYPE_NAMES, SAMPLE_SIZE, Record, Stats, TensorMeta, echo
from .skeleton import (MARK, check_shape, checked_name, fill, marks, parse_dims, parse_frames, parse_skeleton,
                       parse_text_list)
from .strings import NONE, StringTable

KINDS = ("op", "module")
DIRECTIONS = ("forward", "backward")
ROLES = ("input", "output", "param")
INPUT, OUTPUT, PARAM = range(3)
# Source kinds; an "op" source keeps its seq and index in columns, the others their name.
SRC_KINDS = (None, "op", "param", "buffer", "input")
SRC_NONE, SRC_OP, SRC_PARAM, SRC_BUFFER, SRC_INPUT = range(5)

# Bits of ``TensorRow.absent``: statistics fields that were None (no finite element).
ABSENT_MIN, ABSENT_MAX, ABSENT_MEAN, ABSENT_STD = 1, 2, 4, 8

RECORD_DTYPE = np.dtype([
    ("seq", "<i8"), ("kind", "u1"), ("direction", "u1"), ("op", "<i4"), ("module", "<i4"),
    ("count", "<i8"), ("first_seq", "<i8"), ("last_seq", "<i8"), ("call_index", "<i8"), ("step", "<i8"),
    ("module_stack", "<i4"), ("stack", "<i4"), ("skeleton", "<i4"), ("t_begin", "<i8"), ("t_end", "<i8"),
])
TENSOR_DTYPE = np.dtype([
    ("record", "<i8"), ("role", "u1"), ("name", "<i4"), ("dtype", "<i4"), ("shape", "<i4"), ("stride", "<i4"),
    ("offset", "<i8"), ("device", "<i4"), ("requires_grad", "u1"), ("has_stats", "u1"), ("absent", "u1"),
    ("min", "<f8"), ("max", "<f8"), ("mean", "<f8"), ("std", "<f8"),
    ("nan", "<i8"), ("posinf", "<i8"), ("neginf", "<i8"), ("numel", "<i8"),
    ("data", "<i4"), ("src_kind", "u1"), ("src_seq", "<i8"), ("src_index", "<i8"), ("src_name", "<i4"),
    ("note", "<i4"),
])
UPDATE_DTYPE = np.dtype([("seq", "<i8"), ("count", "<i8"), ("last_seq", "<i8")])
# A call de-dup folded into an earlier record: its seq, that record's seq, and the producer of its
# first argument (``op:<src_seq>:<src_k>``; -1, -1 when that is not a tensor an op produced).
FOLD_DTYPE = np.dtype([("seq", "<i8"), ("record", "<i8"), ("src_seq", "<i8"), ("src_k", "<i8")])

@dataclass(frozen=True)
class Refusal:
    """A record the validator left out of an index: its row in the file, seq, op (None when
    the op name itself is unreadable) and why, in one bounded line."""

    row: int
    seq: int
    op: str | None
    reason: str

    def __str__(self) -> str:
        return f"record #{self.row} (seq {self.seq}, {self.op or 'op unreadable'}): {self.reason}"


class Table:
    """Named columns of equal length, each a contiguous numpy array (struct of arrays): a scan
    of one column reads only that column. ``table["seq"]`` is a column, ``table.row(i)`` a
    tuple in ``dtype``'s field order, ``table.take(rows)`` a sub-table."""

    def __init__(self, dtype: np.dtype, columns: dict[str, np.ndarray]) -> None:
        self.dtype = dtype
        self.columns = columns
        self._n = len(next(iter(columns.values()))) if columns else 0

    @classmethod
    def empty(cls, dtype: np.dtype) -> "Table":
        return cls(dtype, {name: np.zeros(0, dtype[name]) for name in dtype.names})

    @classmethod
    def from_rows(cls, dtype: np.dtype, rows: list[tuple]) -> "Table":
        if not rows:
            return cls.empty(dtype)
        packed = np.array(rows, dtype=dtype)
        return cls(dtype, {name: np.ascontiguousarray(packed[name]) for name in dtype.names})

    @classmethod
    def concat(cls, dtype: np.dtype, tables: Sequence["Table"]) -> "Table":
        if not tables:
            return cls.empty(dtype)
        if len(tables) == 1:
            return tables[0]
        return cls(dtype, {name: np.concatenate([t.columns[name] for t in tables]) for name in dtype.names})

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, key):
        """``table["seq"]``: a column; ``table[a:b]``, ``table[mask]``, ``table[rows]``: a sub-table."""
        if isinstance(key, str):
            return self.columns[key]
        if isinstance(key, (int, np.integer)):
            raise TypeError("a Table row is table.row(i) (a tuple in field order)")
        return self.take(key)

    def tolist(self) -> list[tuple]:
        return self.rows(0, len(self))

    def copy(self) -> "Table":
        return Table(self.dtype, {name: col.copy() for name, col in self.columns.items()})

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def row(self, i: int) -> tuple:
        return tuple(self.columns[name][i].item() for name in self.dtype.names)

    def rows(self, start: int, stop: int) -> list[tuple]:
        """Rows ``start:stop`` as tuples of Python values (one ``tolist`` per column)."""
        return list(zip(*(self.columns[name][start:stop].tolist() for name in self.dtype.names)))

    def take(self, rows: np.ndarray | slice) -> "Table":
        return Table(self.dtype, {name: col[rows] for name, col in self.columns.items()})


def concat(parts: Sequence["Columns"], strings: StringTable) -> "Columns":
    """Chunks built against one shared string table, in order, as one index."""
    folds = [p.folds for p in parts if len(p.folds)]
    check = None
    if any(p.check is not None for p in parts):  # chunks without self-checks: rows of none
        check = np.concatenate([np.full((len(p.tensors), CHECK_SIZE), np.nan) if p.check is None else p.check
                                for p in parts])
    sample_n = sample = None
    if any(p.sample_n is not None for p in parts):  # chunks without samples: rows of none
        sample_n = np.concatenate([np.zeros(len(p.tensors), np.uint8) if p.sample_n is None else p.sample_n
                                   for p in parts])
        sample = np.concatenate([np.zeros((len(p.tensors), SAMPLE_SIZE)) if p.sample is None else p.sample
                                 for p in parts])
    return Columns(Table.concat(RECORD_DTYPE, [p.records for p in parts]),
                   Table.concat(TENSOR_DTYPE, [p.tensors for p in parts]), strings,
                   np.concatenate(folds) if folds else None, sample_n=sample_n, sample=sample, check=check)


# ---------------------------------------------------------------------------------------------
# Reading


class Columns:
    """A dump's index as columns; ``record(i)`` materialises one ``Record``."""

    def __init__(self, records: Table, tensors: Table, strings: StringTable, folds: np.ndarray | None = None, *,
                 sample_n: np.ndarray | None = None, sample: np.ndarray | None = None,
                 check: np.ndarray | None = None) -> None:
        self.records, self.tensors, self.strings = records, tensors, strings
        self.folds = np.zeros(0, FOLD_DTYPE) if folds is None else folds  # FOLD_DTYPE rows, by seq
        # Each tensor row's sample (docs/format.md, "Samples"), both None when the dump has none:
        # ``sample_n`` (uint8) how many values, ``sample`` (float64, rows x SAMPLE_SIZE) the values,
        # row j's at sample[j, :sample_n[j]] (the rest 0), at samples.positions(shape)'s elements.
        self.sample_n, self.sample = sample_n, sample
        # Each tensor row's self-check (docs/format.md, "Self-checks"), None when the dump has
        # none: float64, rows x CHECK_SIZE, NaN where a row has none (every row but matmul outputs).
        self.check = check
        self.where = ""  # the index file, for error messages
        self.refused: list[Refusal] = []  # records validate() left out, and why
        self.folds_refused = 0  # fold rows validate() left out
        self.folds_problem = ""  # why the file's folds table was left out whole (IndexFile.columns)
        self._skeletons: dict[int, tuple[dict, int]] = {}
        self._shapes: dict[int, tuple[int, ...]] = {}
        self._stacks: dict[int, list[tuple[str, str]]] = {}
        self._call_stacks: dict[int, list[str]] = {}
        self._names: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.records)

    def samples(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(sample_n, sample) where the index has samples, for writing it."""
        return None if self.sample_n is None else (self.sample_n, self.sample)

    # -- validation ------------------------------------------------------------------------
    def validate(self) -> "Columns":
        """Check the index once, vectorised, before any tool reads it. What breaks the tables
        themselves (a missing or mistyped column, tensor rows that are not each record's in
        order) refuses the whole index: raises ColumnsError. What breaks one record (a text it
        uses, a value out of range, its tensors' rows) refuses that record alone: it is dropped
        from the columns and listed in ``refused``, and the rest of the dump opens."""
        try:
            self._check_tables()
            refusals = self._record_problems()
        except (ColumnsError, ValueError) as e:
            raise self._located(e if isinstance(e, ColumnsError) else ColumnsError(str(e))) from None
        if refusals:
            self._drop(refusals)
        self._check_folds()
        return self

    def _check_folds(self) -> None:
        """Keep the fold rows that can be true: a fold of a kept op record, after it, whose
        argument's producer ran before it. The rest are counted and left out; a table of another
        type is left out whole (``folds_problem``): it is optional, the records open without it."""
        f = self.folds
        if f.dtype != FOLD_DTYPE or f.ndim != 1:
            self.folds, self.folds_problem = np.zeros(0, FOLD_DTYPE), f"folds table is {f.dtype}, not {FOLD_DTYPE}"
            return
        if not len(f):
            return
        r = self.records
        known = np.isin(f["record"], r["seq"][r["kind"] == KINDS.index("op")])
        op_src = f["src_seq"] >= 0
        ok = known & (f["seq"] > f["record"]) & ((op_src & (f["src_seq"] < f["seq"]) & (f["src_k"] >= 0)
                                                 & (f["src_k"] < 2 ** 31))
                                                | (~op_src & (f["src_seq"] == -1) & (f["src_k"] == -1)))
        self.folds_refused = int(len(f) - np.count_nonzero(ok))
        kept = f[ok]
        self.folds = kept[np.argsort(kept["seq"], kind="stable")]

    def fold_of(self, seq: int) -> tuple[int, int, int] | None:
        """(record seq, src_seq, src_k) of the call ``seq`` de-dup folded (src_seq -1: its first
        argument was not an op's output), or None when ``seq`` is no folded call."""
        f = self.folds
        i = int(np.searchsorted(f["seq"], seq))
        if i < len(f) and int(f["seq"][i]) == seq:
            return int(f["record"][i]), int(f["src_seq"][i]), int(f["src_k"][i])
        return None

    def _located(self, e: ColumnsError) -> ColumnsError:
        return ColumnsError(f"{self.where}: corrupt dump index ({e})") if self.where else e

    def _check_tables(self) -> None:
        r, t = self.records, self.tensors
        for table, dtype in ((r, RECORD_DTYPE), (t, TENSOR_DTYPE)):
            for name in dtype.names:
                col = table.columns.get(name)
                if col is None or col.dtype != dtype[name] or col.ndim != 1 or len(col) != len(table):
                    raise ColumnsError(f"column {name!r} is missing or is not {dtype[name]} of {len(table)} rows")
        if (self.sample_n is None) != (self.sample is None):
            raise ColumnsError("sample columns: 'sample_n' and 'sample' come together")
        if self.check is not None and (self.check.dtype != np.float64 or self.check.shape != (len(t), CHECK_SIZE)):
            raise ColumnsError(f"column 'check' is not float64 of {len(t)} rows x {CHECK_SIZE}")
        if self.sample_n is not None:
            n, s = self.sample_n, self.sample
            if n.dtype != np.uint8 or n.ndim != 1 or len(n) != len(t):
                raise ColumnsError(f"column 'sample_n' is not uint8 of {len(t)} rows")
            if s.dtype != np.float64 or s.shape != (len(t), SAMPLE_SIZE):
                raise ColumnsError(f"column 'sample' is not float64 of {len(t)} rows x {SAMPLE_SIZE}")
        begin, end = r["t_begin"], r["t_end"]
        if len(r):
            if begin[0] != 0 or end[-1] != len(t) or np.any(end < begin) or np.any(begin[1:] != end[:-1]):
                raise ColumnsError("records' tensor rows are not contiguous and in order")
        elif len(t):
            raise ColumnsError("tensor rows without records")
        if len(t) and np.any(t["record"] != np.repeat(np.arange(len(r), dtype=np.int64), end - begin)):
            raise ColumnsError("a tensor row names another record than the one it belongs to")

    def _record_problems(self) -> dict[int, str]:
        """{record row: why it is refused} (the first reason found), for every check that one
        record's values can fail. Each distinct text is decoded once."""
        r, t, n_str = self.records, self.tensors, len(self.strings)
        found: dict[int, str] = {}

        def refuse(rows: np.ndarray, why: str | Callable[[int], str]) -> None:
            for row in np.flatnonzero(rows).tolist() if rows.dtype == bool else rows.tolist():
                if row not in found:
                    found[row] = why if isinstance(why, str) else why(row)

        owner = t["record"]

        def refuse_tensors(rows: np.ndarray, why: str) -> None:
            refuse(distinct(owner[rows]), why)

        def texts(col: np.ndarray, what: str, check: Callable[[int], object], optional: bool,
                  on_tensors: bool) -> None:
            """String ids inside the table, and each distinct text passing ``check``."""
            out = (col < (NONE if optional else 0)) | (col >= n_str)
            (refuse_tensors if on_tensors else refuse)(out, f"{what}: a string index outside the table of {n_str} strings")
            for i in _used(col[~out]):
                try:
                    check(i)
                except ValueError as e:  # ColumnsError included
                    (refuse_tensors if on_tensors else refuse)(col == i, f"{what}: {e}")

        def at_least(col: np.ndarray, lo: int, what: str, on_tensors: bool = False) -> None:
            (refuse_tensors if on_tensors else refuse)(col < lo, f"{what} below {lo}")

        for name in ("kind", "direction"):
            refuse(r[name] > 1, f"record {name}: unknown value")
        for name in ("seq", "first_seq", "last_seq", "call_index"):
            at_least(r[name], 0, f"record {name}")
        at_least(r["count"], 1, "record count")
        at_least(r["step"], NONE, "record step")
        strings = self.strings
        texts(r["op"], "record op", lambda i: checked_name(strings[i], "op"), False, False)
        texts(r["module"], "record module", lambda i: checked_name(strings[i], "module"), True, False)
        texts(r["module_stack"], "record module_stack", self._frames, True, False)
        texts(r["stack"], "record stack", self._call_stack, True, False)
        texts(r["skeleton"], "record skeleton", self.skeleton, False, False)
        mismatch = self.skeleton_mismatches()
        refuse(mismatch, lambda row: f"its skeleton holds {self.skeleton(int(r['skeleton'][row]))[1]} tensors, "
                                     f"its rows {int(r['t_end'][row] - r['t_begin'][row])}")
        if len(t):
            refuse_tensors(t["role"] > PARAM, "a tensor row has an unknown role")
            refuse_tensors(t["src_kind"] > SRC_INPUT, "a tensor row has an unknown source kind")
            refuse_tensors(t["absent"] > 15, "a tensor row has an unknown absent mask")
            for name in ("offset", "nan", "posinf", "neginf", "numel", "src_seq", "src_index"):
                at_least(t[name], 0, f"tensor {name}", on_tensors=True)
            refuse_tensors(np.isin(t["src_kind"], (SRC_PARAM, SRC_BUFFER)) & (t["src_name"] < 0),
                           "a param/buffer source without a name")
            if self.check is not None:
                refuse_tensors(~np.isnan(self.check[:, 0]) & (t["has_stats"] == 0), "a self-check without statistics")
            if self.sample_n is not None:
                n = self.sample_n.astype(np.int64)
                refuse_tensors(n > np.minimum(np.maximum(t["numel"], 0), SAMPLE_SIZE),
                               f"a tensor's sample holds more values than min(numel, {SAMPLE_SIZE})")
                refuse_tensors((n > 0) & (t["has_stats"] == 0), "a sample without statistics")
                past = np.arange(SAMPLE_SIZE)[None, :] >= n[:, None]
                refuse_tensors(np.any(past & (self.sample != 0), axis=1), "a sample's unused cells are not 0")

            def dtype(i: int) -> None:
                if strings[i].removeprefix("torch.") not in DTYPE_NAMES:
                    raise ColumnsError(f"unknown tensor dtype {echo(strings[i])}")

            texts(t["dtype"], "tensor dtype", dtype, False, True)
            for name in ("name", "device"):
                texts(t[name], f"tensor {name}", lambda i, name=name: checked_name(strings[i], f"tensor {name}"),
                      False, True)
            # a parameter's qualified name is its module's path (up to MAX_NAME) and more: the
            # string table's own MAX_TEXT bounds it, as it does ``data``
            texts(t["src_name"], "tensor src_name", lambda i: None, True, True)
            texts(t["shape"], "tensor shape", lambda i: check_shape(self.shape(i)), False, True)
            texts(t["stride"], "tensor stride", self.shape, True, True)
            for name in ("data", "note"):
                texts(t[name], f"tensor {name}", lambda i: None, True, True)
            # Records read their tensors' places from the skeleton, summary and info from the
            # role column: the two must agree, or the tools would disagree about one dump.
            fine = np.ones(len(r), dtype=bool)
            fine[list(found)] = False
            rows = np.flatnonzero(fine[owner])
            wrong = rows[t["role"][rows] != self._skeleton_roles(rows)]
            refuse_tensors(wrong, "its tensor rows' roles are not its skeleton's (inputs, then outputs, then parameters)")
        return found

    def _drop(self, refusals: dict[int, str]) -> None:
        """Leave the refused records out of the tables (and their tensor rows), keep why."""
        r, t = self.records, self.tensors
        keep = np.ones(len(r), dtype=bool)
        keep[list(refusals)] = False
        ops = r["op"]
        for row in sorted(refusals):
            op = ops[row]
            try:
                name = checked_name(self.strings[int(op)], "op") if 0 <= op < len(self.strings) else None
            except ValueError:
                name = None
            self.refused.append(Refusal(row=row, seq=int(r["seq"][row]), op=name, reason=refusals[row]))
        kept_t = keep[t["record"]]
        records, tensors = r.take(keep), t.take(kept_t)
        if self.sample_n is not None:
            self.sample_n, self.sample = self.sample_n[kept_t], self.sample[kept_t]
        if self.check is not None:
            self.check = self.check[kept_t]
        sizes = (records["t_end"] - records["t_begin"]).astype(np.int64)
        records.columns["t_end"] = np.cumsum(sizes)
        records.columns["t_begin"] = records["t_end"] - sizes
        tensors.columns["record"] = np.repeat(np.arange(len(records), dtype=np.int64), sizes)
        self.records, self.tensors = records, tensors

    def _skeleton_roles(self, rows: np.ndarray) -> np.ndarray:
        """The role tensor rows ``rows`` have by their record's skeleton: the builder writes
        inputs, then outputs, then parameters. Every owner's skeleton must decode."""
        r = self.records
        owner = self.tensors["record"][rows]
        skeletons, which = distinct(r["skeleton"][owner], inverse=True)
        n_in, n_out = np.empty(len(skeletons), np.int64), np.empty(len(skeletons), np.int64)
        for k, i in enumerate(skeletons.tolist()):
            n_in[k], n_out[k] = self.skeleton_io(i)
        which = which.reshape(-1)
        position = rows - r["t_begin"][owner]
        return np.where(position < n_in[which], INPUT, np.where(position < n_in[which] + n_out[which], OUTPUT, PARAM))

    def skeleton_mismatches(self) -> np.ndarray:
        """Record rows (ascending) whose skeleton holds another number of tensors than the rows
        ``t_begin:t_end`` give it. An unreadable skeleton is left out: decoding it fails on its own."""
        r = self.records
        skeletons, which = distinct(r["skeleton"], inverse=True)
        holds = np.empty(len(skeletons), dtype=np.int64)
        for k, i in enumerate(skeletons.tolist()):
            try:
                holds[k] = self.skeleton(i)[1]
            except ValueError:  # ColumnsError included
                holds[k] = -1
        expected = holds[which.reshape(-1)]
        return np.flatnonzero((expected >= 0) & (expected != r["t_end"] - r["t_begin"]))

    # -- decoded pieces, cached per string -------------------------------------------------
    def shape(self, i: int) -> tuple[int, ...]:
        """The shape (or stride) tuple behind string ``i``, checked once."""
        got = self._shapes.get(i)
        if got is None:
            got = self._shapes[i] = parse_dims(self.strings[i])
        return got

    def name(self, i: int, what: str) -> str:
        """String ``i`` as a name (an op, a module path, a dtype, a device), checked once."""
        got = self._names.get(i)
        if got is None:
            got = self._names[i] = checked_name(self.strings[i], what)
        return got

    def skeleton(self, i: int) -> tuple[dict, int]:
        """(template, number of tensors) of skeleton string ``i``: the template holds the decoded
        non-tensor values, and ``MARK`` where each tensor goes, in the order of the tensor rows."""
        got = self._skeletons.get(i)
        if got is None:
            got = self._skeletons[i] = parse_skeleton(self.strings[i])
        return got

    def skeleton_io(self, i: int) -> tuple[int, int]:
        """How many input and output tensors skeleton string ``i`` holds (its tensor rows come
        in that order, then its parameters)."""
        template = self.skeleton(i)[0]
        return sum(map(marks, template["inputs"].values())), sum(map(marks, template["outputs"]))

    # -- materialising ---------------------------------------------------------------------
    def tensor_meta(self, j: int) -> TensorMeta:
        """The TensorMeta of tensor row ``j`` (fresh each call: callers may mutate it)."""
        return self._meta(self.tensors.row(j), j)

    def _meta(self, t: tuple, j: int) -> TensorMeta:
        (_, _, _, dtype, shape, stride, offset, device, requires_grad, has_stats, absent, mn, mx, mean, std,
         nan, posinf, neginf, numel, data, src_kind, src_seq, src_index, src_name, note) = t
        stats = None
        if has_stats:
            stats = Stats(None if absent & ABSENT_MIN else mn, None if absent & ABSENT_MAX else mx,
                          None if absent & ABSENT_MEAN else mean, None if absent & ABSENT_STD else std,
                          nan, posinf, neginf, numel)
            if self.sample_n is not None and self.sample_n[j]:
                stats.sample = tuple(self.sample[j, :self.sample_n[j]].tolist())
            if self.check is not None and not np.isnan(self.check[j, 0]):
                stats.check = tuple(self.check[j].tolist())
        strings = self.strings
        if src_kind == SRC_NONE:
            source = None
        elif src_kind == SRC_OP:
            source = f"op:{src_seq}:{src_index}"
        elif src_kind == SRC_INPUT:
            source = "input"
        else:
            source = f"{SRC_KINDS[src_kind]}:{strings[src_name]}"
        return TensorMeta(shape=self.shape(shape), dtype=self.name(dtype, "tensor dtype"),
                          stride=None if stride < 0 else self.shape(stride), storage_offset=offset,
                          device=self.name(device, "tensor device"), requires_grad=bool(requires_grad),
                          stats=stats, data=None if data < 0 else strings[data], source=source,
                          note=None if note < 0 else strings[note])

    def record(self, i: int) -> Record:
        """Record ``i``, built from its row, its tensor rows and its skeleton."""
        try:
            return self._record(i)
        except (ColumnsError, ValueError) as e:
            raise self._located(ColumnsError(f"record #{i}: {e}")) from None

    def _record(self, i: int) -> Record:
        row = self.records.row(i)
        begin, end = row[-2], row[-1]
        return self._build(row, self.tensors.rows(begin, end))

    def iter_records(self, rows: Iterable[int] | None = None, block: int = 1024) -> Iterator[Record]:
        """Records in order (all, or the given rows), read from the columns a block at a time:
        one ``tolist`` per column per block instead of per record."""
        if rows is not None:
            rows = np.asarray(rows, dtype=np.int64).reshape(-1)
            for start in range(0, len(rows), block):
                yield from self._records_at(rows[start:start + block])
            return
        n = len(self.records)
        for start in range(0, n, block):
            stop = min(n, start + block)
            rows_ = self.records.rows(start, stop)
            t0 = rows_[0][-2]
            tensors = self.tensors.rows(t0, rows_[-1][-1])
            for k, row in enumerate(rows_):
                try:
                    yield self._build(row, tensors[row[-2] - t0:row[-1] - t0])
                except (ColumnsError, ValueError) as e:
                    raise self._located(ColumnsError(f"record #{start + k}: {e}")) from None

    def _records_at(self, rows: np.ndarray) -> Iterator[Record]:
        """Records ``rows`` (any order), their record and tensor rows gathered with one ``take``."""
        if not len(rows):
            return
        records = self.records.take(rows).tolist()
        begin, end = self.records["t_begin"][rows], self.records["t_end"][rows]
        sizes = end - begin
        first = np.cumsum(sizes) - sizes  # where each record's tensors start in the gathered rows
        tensors = self.tensors.take(np.repeat(begin - first, sizes) + np.arange(int(sizes.sum()))).tolist()
        for i, row, at in zip(rows.tolist(), records, first.tolist()):
            try:
                yield self._build(row, tensors[at:at + row[-1] - row[-2]])
            except (ColumnsError, ValueError) as e:
                raise self._located(ColumnsError(f"record #{i}: {e}")) from None

    def _build(self, row: tuple, tensor_rows: list[tuple]) -> Record:
        (seq, kind, direction, op, module, count, first_seq, last_seq, call_index, step, module_stack, stack,
         skeleton, begin, end) = row
        template, n_tensors = self.skeleton(skeleton)
        if n_tensors != end - begin:
            raise ColumnsError(f"its skeleton holds {n_tensors} tensors, its rows {end - begin}")
        metas = iter([self._meta(t, begin + k) for k, t in enumerate(tensor_rows)])
        rec = Record(
            seq=seq, kind=KINDS[kind], op=self.name(op, "op"), direction=DIRECTIONS[direction],
            module=None if module < 0 else self.name(module, "module"),
            module_stack=[] if module_stack < 0 else self._frames(module_stack),
            inputs={k: fill(v, metas) for k, v in template["inputs"].items()},
            outputs=[fill(v, metas) for v in template["outputs"]],
            mutates=list(template["mutates"]), count=count, first_seq=first_seq, last_seq=last_seq,
            stack=None if stack < 0 else self._call_stack(stack),
            call_index=call_index, step=None if step < 0 else step,
            keywords=dict(template["keywords"]),
            params={k: next(metas) for k in template["params"]})
        if template["sharding"]:
            sharding = template["sharding"]
            for name, meta in (*rec.input_tensors(), *rec.output_tensors()):
                meta.sharding = sharding.get(name)
        rec.kernels = template["kernels"]
        return rec

    def _frames(self, i: int) -> list[tuple[str, str]]:
        got = self._stacks.get(i)
        if got is None:
            got = self._stacks[i] = parse_frames(self.strings[i])
        return list(got)

    def _call_stack(self, i: int) -> list[str]:
        got = self._call_stacks.get(i)
        if got is None:
            got = self._call_stacks[i] = parse_text_list(self.strings[i])
        return list(got)

    # -- filters ---------------------------------------------------------------------------
    def select(self, *, op: str | Iterable[str] | None = None, module: str | None = None,
               kind: str | None = None, direction: str | None = None,
               seq: tuple[int, int] | None = None) -> np.ndarray:
        """Row numbers of the records that match, in order. ``module`` matches that path and
        everything under it; ``seq`` is a half-open range [lo, hi)."""
        r = self.records
        keep = np.ones(len(r), dtype=bool)
        if op is not None:
            wanted = {op} if isinstance(op, str) else set(op)
            keep &= np.isin(r["op"], self.ids_where(r["op"], lambda text: text in wanted))
        if module is not None:
            keep &= np.isin(r["module"], self.ids_where(r["module"], lambda text: _under(text, module)))
        if kind is not None:
            keep &= r["kind"] == KINDS.index(kind)
        if direction is not None:
            keep &= r["direction"] == DIRECTIONS.index(direction)
        if seq is not None:
            keep &= (r["seq"] >= seq[0]) & (r["seq"] < seq[1])
        return np.flatnonzero(keep)

    def ids_where(self, column: np.ndarray, test: Callable[[str | None], bool], *, none: bool = False) -> list[int]:
        """The distinct string ids in ``column`` (a text column, or some of its rows) whose text
        passes ``test``; with ``none``, NONE (-1) too, tested as None. A text may be stored
        under several ids in a hand-made index: every one counts."""
        ids = [i for i in _used(column) if test(self.strings[i])]
        if none and (column == NONE).any() and test(None):
            ids.append(NONE)
        return ids


def _used(column: np.ndarray) -> list[int]:
    """The distinct string ids a text column holds, ascending, without NONE (-1)."""
    return [i for i in distinct(column).tolist() if i >= 0]


def distinct(column: np.ndarray, inverse: bool = False):
    """``np.unique(column[, return_inverse=True])`` for an integer column of ids in a narrow range
    (string ids: at most the string table's size), by marking a table instead of sorting: a
    million-record open sorted its columns a dozen times (0.8 s of 1.8). Wide ranges sort."""
    if column.size == 0 or column.dtype.kind not in "iu":
        return np.unique(column, return_inverse=inverse)
    lo, hi = int(column.min()), int(column.max())
    if hi - lo >= 2 * column.size + (1 << 16):
        return np.unique(column, return_inverse=inverse)
    seen = np.zeros(hi - lo + 1, dtype=bool)
    offset = column.astype(np.int64) - lo
    seen[offset] = True
    values = (np.flatnonzero(seen) + lo).astype(column.dtype)
    if not inverse:
        return values
    return values, (np.cumsum(seen) - 1)[offset]


def _under(path: str, module: str) -> bool:
    return path == module or path.startswith(module + ".") or module == ""


class RecordSequence(Sequence):
    """``dump.records`` of a columnar dump: a read-only sequence that builds each Record when it
    is read (and keeps none, so a million-record scan holds one at a time)."""

    def __init__(self, columns: Columns, rows: np.ndarray | None = None) -> None:
        self.columns = columns
        self.rows = rows

    def __len__(self) -> int:
        return len(self.columns) if self.rows is None else len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            rows = np.arange(len(self))[i] if self.rows is None else self.rows[i]
            return RecordSequence(self.columns, rows)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i %= n
        return self.columns.record(i if self.rows is None else int(self.rows[i]))

    def __iter__(self) -> Iterator[Record]:
        return self.columns.iter_records(self.rows)

    def __repr__(self) -> str:
        return f"<{len(self)} records>"




__all__ = ["Columns", "ColumnsError", "Refusal", "RecordSequence", "StringTable", "Table", "concat", "MARK", "NONE",
           "RECORD_DTYPE", "TENSOR_DTYPE", "UPDATE_DTYPE", "FOLD_DTYPE", "KINDS", "DIRECTIONS", "ROLES", "SRC_KINDS",
           "INPUT", "OUTPUT", "PARAM"]
