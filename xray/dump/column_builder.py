"""Records to column rows: how the writer (and a reader of old JSON dumps) builds an index.

One pass per record: its tensors become rows of the tensor table, its non-tensor rest a skeleton
string shared with every record of the same op and arguments (keyed without building JSON: about
7 us a record), its texts indices into one ``StringTable``.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Iterable

from .columns import (ABSENT_MAX, ABSENT_MEAN, ABSENT_MIN, ABSENT_STD, DIRECTIONS, INPUT, KINDS, NONE, OUTPUT, PARAM,
                      RECORD_DTYPE, SRC_BUFFER, SRC_INPUT, SRC_NONE, SRC_OP, SRC_PARAM, TENSOR_DTYPE, Columns, Table)
from .model import Record, Scalar, Source, TensorMeta, value_to_json
from .strings import StringTable

_TENSOR_MARK = {"t": "@"}


class ColumnBuilder:
    """Appends records as rows. Strings go to ``strings`` (shared across a writer's chunks, so
    chunks concatenate without renumbering); ``first_row``/``first_tensor`` number this builder's
    rows after the chunks before it."""

    def __init__(self, strings: StringTable | None = None, first_row: int = 0, first_tensor: int = 0) -> None:
        self.strings = StringTable() if strings is None else strings
        self.first_row, self.first_tensor = first_row, first_tensor
        self._records: list[tuple] = []
        self._tensors: list[tuple] = []
        self._skeletons: dict[tuple, int] = {}  # skeleton key -> string id
        self._stacks: dict[tuple, int] = {}  # module stack -> string id

    def __len__(self) -> int:
        return len(self._records)

    def add(self, rec: Record) -> None:
        s = self.strings
        row = self.first_row + len(self._records)
        t_begin = self.first_tensor + len(self._tensors)
        key = (tuple([(k, self._value(v, INPUT, k, row)) for k, v in rec.inputs.items()]),
               tuple([self._value(v, OUTPUT, f"out{i}", row) for i, v in enumerate(rec.outputs)]),
               tuple(rec.mutates), tuple(rec.keywords.items()), tuple(rec.params))
        for name, meta in rec.params.items():
            self._tensor(meta, PARAM, name, row)
        skeleton = self._skeletons.get(key)
        if skeleton is None:
            skeleton = self._skeletons[key] = s.intern(_skeleton_text(rec))
        first = rec.seq if rec.first_seq is None else rec.first_seq
        last = rec.seq if rec.last_seq is None else rec.last_seq
        self._records.append((
            rec.seq, _KIND_CODE[rec.kind], _DIRECTION_CODE[rec.direction], s.intern(rec.op),
            NONE if rec.module is None else s.intern(rec.module),
            rec.count, first, last, rec.call_index, NONE if rec.step is None else rec.step,
            self._stack_id(rec.module_stack) if rec.module_stack else NONE,
            s.intern(json.dumps(rec.stack, separators=(",", ":"))) if rec.stack else NONE,
            skeleton, t_begin, self.first_tensor + len(self._tensors)))

    def _value(self, v: Any, role: int, name: str, row: int) -> Any:
        """A hashable key of a value's skeleton; appends its tensors' rows on the way. Floats keep
        their repr (1 == 1.0 == True, and NaN != NaN, in a dict)."""
        if type(v) is TensorMeta:
            self._tensor(v, role, name, row)
            return _TENSOR_KEY
        if type(v) is int:
            return ("int", v)
        if isinstance(v, (list, tuple)):
            if all(type(x) is int for x in v):  # sizes, dims: the common list, no names to build
                return ("I", tuple(v))
            return ("L", tuple([self._value(x, role, f"{name}.{i}", row) for i, x in enumerate(v)]))
        if isinstance(v, Scalar):
            return ("S", v.tag, json.dumps(v.value, default=str))
        if isinstance(v, float):
            return ("f", repr(v))
        return (type(v).__name__, v)

    def _stack_id(self, frames: list[tuple[str, str]]) -> int:
        key = tuple(frames)
        i = self._stacks.get(key)
        if i is None:
            i = self._stacks[key] = self.strings.intern(_stack_text(frames))
        return i

    def _tensor(self, meta: TensorMeta, role: int, name: str, row: int) -> None:
        intern = self.strings.intern
        st = meta.stats
        if st is None:
            stats = _NO_STATS
        else:
            mn, mx, mean, std = st.min, st.max, st.mean, st.std
            absent = ((mn is None) * ABSENT_MIN | (mx is None) * ABSENT_MAX
                      | (mean is None) * ABSENT_MEAN | (std is None) * ABSENT_STD)
            stats = (1, absent, 0.0 if mn is None else mn, 0.0 if mx is None else mx,
                     0.0 if mean is None else mean, 0.0 if std is None else std,
                     st.nan, st.posinf, st.neginf, st.numel)
        src = meta.source
        if src is None:
            source = _NO_SOURCE
        elif src.startswith("op:"):
            _, seq, index = src.split(":")
            source = (SRC_OP, int(seq), int(index), NONE)
        else:
            source = _source_columns(src, self.strings)
        stride = meta.stride
        self._tensors.append((
            row, role, intern(name), intern(meta.dtype), intern(_shape_text(meta.shape)),
            NONE if stride is None else intern(_shape_text(stride)), meta.storage_offset, intern(meta.device),
            meta.requires_grad, *stats, NONE if meta.data is None else intern(meta.data), *source,
            NONE if meta.note is None else intern(meta.note)))

    def build(self) -> "Columns":
        return Columns(Table.from_rows(RECORD_DTYPE, self._records), Table.from_rows(TENSOR_DTYPE, self._tensors),
                       self.strings)


_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
_DIRECTION_CODE = {d: i for i, d in enumerate(DIRECTIONS)}
_TENSOR_KEY = ("T",)
_NO_STATS = (0, 0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0)
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
    return json.dumps(skeleton, separators=(",", ":"), default=str)


@lru_cache(maxsize=65536)
def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _stack_text(frames: list[tuple[str, str]]) -> str:
    return json.dumps([list(f) for f in frames], separators=(",", ":"))


def _source_columns(text: str | None, strings: StringTable) -> tuple[int, int, int, int]:
    if text is None:
        return SRC_NONE, 0, 0, NONE
    if text.startswith("op:"):
        src = Source.parse(text)
        return SRC_OP, src.seq, src.index, NONE
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
