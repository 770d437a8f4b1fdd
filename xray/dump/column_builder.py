"""Records to column rows: how the writer (and a reader of old JSON dumps) builds an index.

One pass per record: its tensors become rows of the tensor table, its non-tensor rest a skeleton
string shared with every record of the same op and arguments (keyed without building JSON: about
7 us a record), its texts indices into one ``StringTable``. The recorder's row path hands rows
over already made (``add_rows``), and shares the skeleton and name logic (``skeleton_of``).
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any, Iterable

import numpy as np

from .columns import (DIRECTIONS, INPUT, KINDS, NONE, OUTPUT, PARAM, RECORD_DTYPE, SRC_BUFFER, SRC_INPUT, SRC_NONE,
                      SRC_OP, SRC_PARAM, TENSOR_DTYPE, Columns, Table)
from .model import CHECK_SIZE, SAMPLE_SIZE, Record, Scalar, Source, TensorMeta, value_to_json
from .stats import NO_STATS, row_of_stats
from .strings import StringTable

try:  # rows into columns in C (xray/dump/_pack.c); numpy's conversion without it
    from . import _pack
except ImportError:
    _pack = None

_TENSOR_MARK = {"t": "@"}


class ColumnBuilder:
    """Appends records as rows. Strings go to ``strings`` (shared across a writer's chunks, so
    chunks concatenate without renumbering); ``first_row``/``first_tensor`` number this builder's
    rows after the chunks before it.

    Rows arrive two ways, in recording order: ``add(record)`` converts a ``Record``, and
    ``add_rows`` takes what the recorder's row path (xray/record/rows.py) already made. Either
    way the tensor cells are kept in a few lists of flat tuples, and ``build()`` turns each list
    into columns with one numpy call. Statistics may be a ``Stats`` still being filled (deferred
    on a device): they are read at ``build()``, after the writer's ``before_flush``."""

    def __init__(self, strings: StringTable | None = None, first_row: int = 0, first_tensor: int = 0) -> None:
        self.strings = StringTable() if strings is None else strings
        self.first_row, self.first_tensor = first_row, first_tensor
        self._records: list[tuple] = []  # RECORD_DTYPE's fields up to t_begin
        self._counts: list[int] = []  # tensor rows per record
        self._layouts: list[tuple] = []  # LAYOUT_FIELDS per tensor
        self._stats: list[Any] = []  # STATS_FIELDS per tensor, or a Stats to convert at build()
        self._sources: list[tuple] = []  # SOURCE_FIELDS per tensor
        self._roles: list[int] = []
        self._names: list[int] = []
        self._extras: dict[int, tuple[int, int]] = {}  # tensor index -> (data, note), where either is set
        self._checks: dict[int, Any] = {}  # tensor index -> a checked op's self-check (a tuple, or deferred)
        self._skeletons: dict[tuple, int] = {}  # skeleton key -> string id
        self._stacks: dict[tuple, int] = {}  # module stack -> string id

    def __len__(self) -> int:
        return len(self._records)

    def add_rows(self, record: tuple, layouts: list[tuple], stats: list, sources: list[tuple],
                 roles: tuple[int, ...], names: tuple[int, ...], notes: dict[int, int] | None = None,
                 data: dict[int, int] | None = None, checks: dict[int, tuple[float, ...]] | None = None) -> None:
        """One record already as cells: ``record`` holds RECORD_DTYPE's fields up to ``t_begin``;
        the tensor lists are parallel; ``notes`` and ``data`` map a tensor's position to its
        note's and its saved data reference's string, ``checks`` to its self-check."""
        try:
            if notes or data:
                base = len(self._layouts)
                for i in {*(notes or ()), *(data or ())}:
                    self._extras[base + i] = ((data or {}).get(i, NONE), (notes or {}).get(i, NONE))
            if checks:
                base = len(self._layouts)
                for i, check in checks.items():
                    self._checks[base + i] = check
            self._layouts += layouts
            self._stats += stats
            self._sources += sources
            self._roles += roles
            self._names += names
            self._records.append(record)
            self._counts.append(len(layouts))  # last: the record is in once its count is
        except BaseException:  # an interrupt (Ctrl-C) mid-record: the rows before stay whole
            self._trim()
            raise

    def row_lists(self) -> tuple[list, list, list, list, list, list, list]:
        """The lists ``add_rows`` appends to (records, counts, layouts, stats, sources, roles,
        names): the recorder's native row path appends a record without notes to them itself."""
        return self._records, self._counts, self._layouts, self._stats, self._sources, self._roles, self._names

    def add(self, rec: Record) -> None:
        try:
            self._add(rec)
        except BaseException:  # an interrupt (Ctrl-C) mid-record: the rows before stay whole
            self._trim()
            raise

    def _trim(self) -> None:
        """Drop the cells of a record whose adding was interrupted. A record is in once its count
        is appended (always last), so the complete records are the first ``len(_counts)`` and
        their tensors the first ``sum(_counts)`` cells of every tensor list."""
        rows, cells = len(self._counts), sum(self._counts)
        del self._records[rows:]
        for cells_list in (self._layouts, self._stats, self._sources, self._roles, self._names):
            del cells_list[cells:]
        for i in [i for i in self._extras if i >= cells]:
            del self._extras[i]
        for i in [i for i in self._checks if i >= cells]:
            del self._checks[i]

    def _add(self, rec: Record) -> None:
        s = self.strings
        before = len(self._layouts)
        key = (tuple([(k, self._value(v, INPUT, k)) for k, v in rec.inputs.items()]),
               tuple([self._value(v, OUTPUT, f"out{i}") for i, v in enumerate(rec.outputs)]),
               tuple(rec.mutates), tuple(rec.keywords.items()), tuple(rec.params), _sharding_key(rec), rec.kernels)
        for name, meta in rec.params.items():
            self._tensor(meta, PARAM, name)
        skeleton = self._skeletons.get(key)
        if skeleton is None:
            skeleton = self._skeletons[key] = s.intern(_skeleton_text(rec))
        first = rec.seq if rec.first_seq is None else rec.first_seq
        last = rec.seq if rec.last_seq is None else rec.last_seq
        self._records.append((
            rec.seq, _KIND_CODE[rec.kind], _DIRECTION_CODE[rec.direction], s.intern(rec.op),
            NONE if rec.module is None else s.intern(rec.module),
            rec.count, first, last, rec.call_index, NONE if rec.step is None else rec.step,
            self.stack_id(rec.module_stack) if rec.module_stack else NONE,
            s.intern(json.dumps(rec.stack, separators=(",", ":"))) if rec.stack else NONE,
            skeleton))
        self._counts.append(len(self._layouts) - before)

    def _value(self, v: Any, role: int, name: str) -> Any:
        """A hashable key of a value's skeleton; appends its tensors' rows on the way. Floats keep
        their repr (1 == 1.0 == True, and NaN != NaN, in a dict)."""
        if type(v) is TensorMeta:
            self._tensor(v, role, name)
            return _TENSOR_KEY
        if type(v) is int:
            return ("int", v)
        if isinstance(v, (list, tuple)):
            if all(type(x) is int for x in v):  # sizes, dims: the common list, no names to build
                return ("I", tuple(v))
            return ("L", tuple([self._value(x, role, f"{name}.{i}") for i, x in enumerate(v)]))
        if isinstance(v, Scalar):
            return ("S", v.tag, json.dumps(v.value, default=str))
        if isinstance(v, float):
            return ("f", repr(v))
        return (type(v).__name__, v)

    def stack_id(self, frames: list[tuple[str, str]] | tuple) -> int:
        key = tuple(frames)
        i = self._stacks.get(key)
        if i is None:
            i = self._stacks[key] = self.strings.intern(stack_text(frames))
        return i

    def _tensor(self, meta: TensorMeta, role: int, name: str) -> None:
        intern = self.strings.intern
        source = source_cells(meta.source, self.strings)
        stride = meta.stride
        if meta.data is not None or meta.note is not None:
            self._extras[len(self._layouts)] = (NONE if meta.data is None else intern(meta.data),
                                                NONE if meta.note is None else intern(meta.note))
        if meta.stats is not None and meta.stats.check:
            self._checks[len(self._layouts)] = meta.stats.check
        self._layouts.append((intern(meta.dtype), intern(shape_text(meta.shape)),
                              NONE if stride is None else intern(shape_text(stride)), meta.storage_offset,
                              intern(meta.device), meta.requires_grad))
        self._stats.append(NO_STATS if meta.stats is None else meta.stats)
        self._sources.append(source)
        self._roles.append(role)
        self._names.append(intern(name))

    def drop_data(self, prefix: str) -> None:
        """Forget the data references into a segment that could not be written."""
        for i, (data, note) in list(self._extras.items()):
            if data != NONE and self.strings[data].startswith(prefix):
                self._extras[i] = (NONE, note)

    def build(self) -> "Columns":
        self._trim()  # an interrupt that struck where add's own handler could not trim
        if not self._records:
            return Columns(Table.empty(RECORD_DTYPE), Table.empty(TENSOR_DTYPE), self.strings)
        counts = np.array(self._counts, dtype=np.int64)
        ends = self.first_tensor + np.cumsum(counts)
        records = _columns(self._records, _RECORD_HEAD)
        records["t_begin"], records["t_end"] = ends - counts, ends
        tensors = {"record": np.repeat(np.arange(self.first_row, self.first_row + len(counts), dtype=np.int64), counts),
                   "role": np.array(self._roles, dtype=TENSOR_DTYPE["role"]),
                   "name": np.array(self._names, dtype=TENSOR_DTYPE["name"])}
        stats = [s if type(s) is tuple else row_of_stats(s) for s in self._stats]
        stats, sample_n, sample = sample_columns(stats)
        for dtype, rows in ((_LAYOUT, self._layouts), (_STATS, stats), (_SOURCE, self._sources)):
            tensors.update(_columns(rows, dtype))
        data = np.full(len(self._layouts), NONE, dtype=TENSOR_DTYPE["data"])
        note = np.full(len(self._layouts), NONE, dtype=TENSOR_DTYPE["note"])
        for i, (d, n) in self._extras.items():
            data[i], note[i] = d, n
        tensors["data"], tensors["note"] = data, note
        check = None
        checks = resolved_all(self._checks)  # deferred ones read now, one read per device
        if any(values is not None for values in checks.values()):
            check = np.full((len(self._layouts), CHECK_SIZE), np.nan)
            for i, values in checks.items():
                if values is not None:
                    check[i] = values
        return Columns(Table(RECORD_DTYPE, records), Table(TENSOR_DTYPE, {n: tensors[n] for n in TENSOR_DTYPE.names}),
                       self.strings, sample_n=sample_n, sample=sample, check=check)


def resolved_all(checks: dict[int, Any]) -> dict[int, tuple[float, ...] | None]:
    """``resolved`` of every check, the deferred ones (device tensors) stacked and read back once
    per device: a flush reads the host once for them all, as for the queued statistics."""
    out, by_device = {}, {}
    for i, v in checks.items():
        if hasattr(v, "tolist"):
            by_device.setdefault(v.device, []).append(i)
        else:
            out[i] = resolved(v)
    if by_device:
        import torch  # (deferred checks exist only where the recorder, and so torch, runs)

        for rows in by_device.values():
            for i, values in zip(rows, torch.stack([checks[i] for i in rows]).tolist()):
                out[i] = resolved(tuple(values))
    return out


def resolved(check: Any) -> tuple[float, ...] | None:
    """A self-check as the index keeps it (docs/format.md, "Self-checks"): a deferred one (the
    recorder's device tensor, read at the flush with the queued statistics) read now; None where
    its residual is NaN (the call could not be checked)."""
    if hasattr(check, "tolist"):
        check = tuple(check.tolist())
    return None if not check or math.isnan(check[0]) else tuple(check)


def sample_columns(stats: list[tuple]) -> tuple[list[tuple], np.ndarray | None, np.ndarray | None]:
    """Statistics cells without their sample cell (the eleventh: float64 bytes, or None), and the
    samples as the index's ``sample_n`` and ``sample`` columns; both None when no row has one."""
    raws = [s[10] if len(s) > 10 else None for s in stats]
    if not any(raws):
        return [s[:10] for s in stats] if any(len(s) > 10 for s in stats) else stats, None, None
    width = SAMPLE_SIZE * 8
    blob = bytearray(b"".join([(r or b"").ljust(width, b"\0") for r in raws]))
    sample = np.frombuffer(blob, dtype=np.float64).reshape(len(stats), SAMPLE_SIZE)
    sample_n = np.fromiter([len(r) >> 3 if r else 0 for r in raws], dtype=np.uint8, count=len(raws))
    return [s[:10] if len(s) > 10 else s for s in stats], sample_n, sample


def _columns(rows: list[tuple], dtype: np.dtype) -> dict[str, np.ndarray]:
    """Rows of cells (tuples in ``dtype``'s field order) as one contiguous array a field."""
    if _pack is not None:
        columns = {name: np.empty(len(rows), dtype[name]) for name in dtype.names}
        try:
            _pack.rows_to_columns(rows, tuple(columns.values()), _PACK_KINDS[dtype])
            return columns
        except (TypeError, ValueError, OverflowError):
            pass  # a cell _pack does not convert: numpy converts it, or says what is wrong
    packed = np.array(rows, dtype=dtype) if rows else np.zeros(0, dtype)
    return {name: np.ascontiguousarray(packed[name]) for name in dtype.names}


def skeleton_of(rec: Record) -> tuple[str, tuple[int, ...], tuple[str, ...]]:
    """A record's skeleton text and its tensors' roles and names in row order: what the row path
    shares among the calls of one shape (xray/record/rows.py)."""
    builder = ColumnBuilder()
    builder.add(rec)
    names = builder.strings
    return _skeleton_text(rec), tuple(builder._roles), tuple(names[i] for i in builder._names)


def _fields(dtype: np.dtype, names: tuple[str, ...]) -> np.dtype:
    return np.dtype([(n, dtype[n]) for n in names])


# The tensor table's cells in the groups the recorder produces them in (and RECORD_DTYPE's up to
# the tensor range, which build() computes).
LAYOUT_FIELDS = ("dtype", "shape", "stride", "offset", "device", "requires_grad")
STATS_FIELDS = ("has_stats", "absent", "min", "max", "mean", "std", "nan", "posinf", "neginf", "numel")
SOURCE_FIELDS = ("src_kind", "src_seq", "src_index", "src_name")
_LAYOUT, _STATS, _SOURCE = (_fields(TENSOR_DTYPE, f) for f in (LAYOUT_FIELDS, STATS_FIELDS, SOURCE_FIELDS))
_RECORD_HEAD = _fields(RECORD_DTYPE, RECORD_DTYPE.names[:RECORD_DTYPE.names.index("t_begin")])
# _pack's kind of each field: int64, int32, uint8, float64
_PACK_KINDS = {dtype: "".join({"<i8": "q", "<i4": "i", "|u1": "B", "<f8": "d"}[dtype[n].str] for n in dtype.names)
               for dtype in (_LAYOUT, _STATS, _SOURCE, _RECORD_HEAD)}
assert set(LAYOUT_FIELDS + STATS_FIELDS + SOURCE_FIELDS + ("record", "role", "name", "data", "note")) == set(TENSOR_DTYPE.names)


_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
_DIRECTION_CODE = {d: i for i, d in enumerate(DIRECTIONS)}
_TENSOR_KEY = ("T",)
_NO_SOURCE = (SRC_NONE, 0, 0, NONE)


def _skeleton_text(rec: Record) -> str:
    """The record's skeleton as JSON: its values with each tensor written as {"t": "@"}."""
    skeleton: dict[str, Any] = {"inputs": {k: _skeleton(v) for k, v in rec.inputs.items()},
                                "outputs": [_skeleton(v) for v in rec.outputs]}
    if rec.mutates:
        skeleton["mutates"] = list(rec.mutates)
    if rec.keywords:
        skeleton["keywords"] = dict(rec.keywords)
    if rec.params:
        skeleton["params"] = list(rec.params)
    sharding = _sharding_key(rec)
    if sharding:  # DTensors: where each local shard sits (docs/format.md, "Sharded tensors")
        skeleton["sharding"] = {name: sh.to_json() for name, sh in sharding}
    if rec.kernels:  # a DTensor call: the records its kernels made, just before it
        skeleton["kernels"] = rec.kernels
    return json.dumps(skeleton, separators=(",", ":"), default=str)


def _sharding_key(rec: Record) -> tuple:
    """((tensor name, Sharding), ...) of the record's DTensors, in row order; () for most records."""
    if rec.kind != "op":
        return ()
    return tuple((name, m.sharding) for name, m in (*rec.input_tensors(), *rec.output_tensors())
                 if m.sharding is not None)


@lru_cache(maxsize=65536)
def shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def stack_text(frames: list[tuple[str, str]]) -> str:
    return json.dumps([list(f) for f in frames], separators=(",", ":"))


def source_cells(text: str | None, strings: StringTable) -> tuple[int, int, int, int]:
    """A tensor's ``src`` text as (src_kind, src_seq, src_index, src_name) cells."""
    if text is None:
        return _NO_SOURCE
    if text.startswith("op:"):  # the common source, without Source.parse
        _, seq, index = text.split(":")
        return SRC_OP, int(seq), int(index), NONE
    if text == "input":
        return SRC_INPUT, 0, 0, NONE
    src = Source.parse(text)
    return (SRC_PARAM if src.kind == "param" else SRC_BUFFER), 0, 0, strings.intern(src.name)


def _skeleton(v: Any) -> Any:
    if isinstance(v, TensorMeta):
        return _TENSOR_MARK
    if isinstance(v, (list, tuple)):
        return [_skeleton(x) for x in v]
    return value_to_json(v)


def columns_of(records: Iterable[Record]) -> Columns:
    """Columns of records held in memory (old JSON dumps, module dumps)."""
    builder = ColumnBuilder()
    for rec in records:
        builder.add(rec)
    return builder.build()
