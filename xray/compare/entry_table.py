"""One dump's entries (records with at least one output tensor) as numpy arrays, with value
codes shared by both dumps.

Why: of a million records compare needs a few fields each; arrays taken from the dump's columns
hold them in megabytes, and codes shared by both sides make values from two string tables
comparable as integers. The indexing helpers (-1: missing) that the other steps share are here.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..dump.columns import DIRECTIONS, KINDS, OUTPUT
from ..dump.dump_columns import DumpColumns
from ..dump.model import record_name
from ..dump.skeleton import checked_name as _name

MODULE = KINDS.index("module")
# Prefixes added by wrappers (DDP/FSDP ``module.``, torch.compile ``_orig_mod.``, HF ``model.``);
# stripped repeatedly so ``module._orig_mod.model.layers.0`` and ``layers.0`` name the same module.
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")
_WRAPPER_NAMES = tuple(p[:-1] for p in WRAPPER_PREFIXES)
CHUNK = 1 << 16  # rows (or entries) built at a time: the per-row columns of a chunk are a few MB, not a GB


class Codes:
    """Integer codes of values (op names, paths, shapes...) shared by both sides' tables: the
    two dumps have string tables of their own, equal codes mean equal values."""

    def __init__(self) -> None:
        self.tables: dict[str, dict] = {}

    def code(self, kind: str, value: Any) -> int:
        table = self.tables.setdefault(kind, {})
        return table.setdefault(value, len(table))

    def lut(self, kind: str, fn: Callable[[Any], Any] = lambda v: v, dtype: Any = object) -> np.ndarray:
        """``fn(value)`` by code: ``lut(...)[codes]`` maps codes to values (shared objects)."""
        values = list(self.tables.get(kind, {}))
        out = np.empty(len(values), dtype=dtype)
        for i, v in enumerate(values):
            out[i] = fn(v)
        return out


class Vocab:
    """Values by shared code, as rows show them: dtype names, shapes as text, element counts
    (one Python object per distinct value, shared by every row)."""

    def __init__(self, codes: Codes) -> None:
        self.dtype = codes.lut("dtype")
        self.shape_text = codes.lut("shape", lambda v: str(tuple(v)))
        self.numel = codes.lut("shape", math.prod)


def normalize_path(path: str | None) -> str:
    """A module path with its wrapper prefixes stripped (entries are matched by it)."""
    p = path or ""
    changed = True
    while changed:
        changed = False
        for pre in WRAPPER_PREFIXES:
            if p.startswith(pre):
                p, changed = p[len(pre):], True
        if p in _WRAPPER_NAMES:
            p, changed = "", True
    return p


def _per_id(ids: np.ndarray, fn: Callable[[int], Any], dtype: Any = np.int64) -> np.ndarray:
    """``fn(i)`` for every distinct value of ``ids``, spread over ``ids``: each text, shape or
    name is decoded once however many rows use it."""
    if not len(ids):
        return np.zeros(0, dtype)
    lo = int(ids.min())
    present = np.zeros(int(ids.max()) - lo + 1, dtype=bool)
    present[ids - lo] = True
    lut = np.empty(len(present), dtype=dtype)
    for u in np.flatnonzero(present).tolist():
        lut[u] = fn(u + lo)
    return lut[ids - lo]


class EntryTable:
    """One dump's entries (records with at least one output tensor) as arrays, and their
    output tensors (``out_*``, entry after entry, ``out_start[e]:out_start[e] + n_out[e]``)."""

    def __init__(self, source: DumpColumns, codes: Codes, *, ignore_step: bool = False) -> None:
        """``ignore_step``: each step number becomes its place among this dump's steps, so two
        dumps of one model taken at other steps (0 and 3) pair step by step, in order."""
        self.source, self.columns = source, source.columns
        columns = source.columns
        r, t = columns.records, columns.tensors
        out = np.flatnonzero(t["role"] == OUTPUT)
        counts = np.bincount(t["record"][out], minlength=len(r)) if len(out) else np.zeros(len(r), np.int64)
        # Row numbers fit int32 (2**31 records would be a 180 GB index); a million entries hold
        # a dozen arrays, and 1M-record compares must stay under 2 GB with both indexes loaded.
        self.row = np.flatnonzero(counts).astype(np.int32)  # record row of each entry
        self.n_out = counts[self.row].astype(np.int32)
        self.out_start = (np.cumsum(self.n_out, dtype=np.int64) - self.n_out).astype(np.int32)
        self.out = out.astype(np.int32)  # tensor row of each output
        self.seq, self.kind, self.direction, self.call_index = (
            r[k][self.row] for k in ("seq", "kind", "direction", "call_index"))
        step = r["step"][self.row]
        if ignore_step and len(step):
            step = np.unique(step, return_inverse=True)[1].reshape(step.shape) - (step.min() < 0)  # None stays -1
        s = columns.strings
        op_ids, module_ids = r["op"][self.row], r["module"][self.row] + 1  # module id 0: None

        def module(i: int) -> str | None:
            return None if i == 0 else _name(s[i - 1], "module")

        self.op_text = _per_id(op_ids, lambda i: _name(s[i], "op"), object)
        self.op = _per_id(op_ids, lambda i: codes.code("op", s[i]), np.int32)
        self.module_text = _per_id(module_ids, module, object)  # as recorded, for Record.name
        self.path_text = _per_id(module_ids, lambda i: normalize_path(module(i)), object)
        self.path = _per_id(module_ids, lambda i: codes.code("path", normalize_path(module(i))), np.int32)
        # non-tensor arguments (the skeleton's text: tensors are placeholders), equal across sides
        # where the texts are: what tells a slice of start 0 from its twin of start 1 (matching.py)
        self.args = _per_id(r["skeleton"][self.row], lambda i: codes.code("args", s[i]), np.int32)
        # kind, direction and step in one comparable integer (step >= -1)
        self.group = ((step + 1) * 2 + self.direction) * 2 + self.kind
        # Outputs keep codes only (dtype, shape: shared; names: this table's); statistics are read
        # from the columns when judged (``stat``): at a million records every copy is 8 MB a column.
        self.out_name = _per_id(t["name"][out], lambda i: s[i], object)
        self.out_dtype = _per_id(t["dtype"][out], lambda i: codes.code("dtype", _name(s[i], "tensor dtype")), np.int32)
        self.out_shape = _per_id(t["shape"][out], lambda i: codes.code("shape", columns.shape(i)), np.int32)
        self.codes = codes

    def stat(self, name: str, outs: np.ndarray) -> np.ndarray:
        """Tensor column ``name`` (``inf``: posinf + neginf) of outputs ``outs``."""
        rows = self.out[outs]
        t = self.columns.tensors
        return t["posinf"][rows] + t["neginf"][rows] if name == "inf" else t[name][rows]

    def __len__(self) -> int:
        return len(self.row)

    def name_rows(self, other: EntryTable | None = None, partner: np.ndarray | None = None) -> None:
        """Set ``names`` (``Record.name``) and ``seq_value`` (the seq as a Python int) of every
        entry: one object each, which the entry's rows share. With ``other`` and ``partner``
        (this table's entry -> its matched entry of ``other``, or -1), a value equal to the
        partner's is the partner's object: both sides' rows then hold one (a name is ~100 bytes).
        In chunks, so the objects of one chunk that are dropped are reused by the next."""
        names, seqs = np.empty(len(self), dtype=object), np.empty(len(self), dtype=object)
        for lo in range(0, len(self), CHUNK):
            sl = slice(lo, lo + CHUNK)
            ops, kinds, seq = self.op_text[sl].tolist(), self.kind[sl].tolist(), self.seq[sl].tolist()
            calls, dirs = self.call_index[sl].tolist(), self.direction[sl].tolist()
            text = [record_name(KINDS[k], m, o, q, c, DIRECTIONS[d])
                    for m, o, k, q, c, d in zip(self.module_text[sl].tolist(), ops, kinds, seq, calls, dirs)]
            if other is not None:
                p = partner[sl]
                text = [x if x == y else y for x, y in zip(take(other.names, p, None).tolist(), text)]
                seq = [x if x == y else y for x, y in zip(take(other.seq_value, p, None).tolist(), seq)]
            names[sl], seqs[sl] = text, seq
        self.names, self.seq_value = names, seqs
        self.module_text = None  # read only here

    def trim(self, *names: str) -> None:
        """Drop arrays as soon as nothing reads them: alignment reads group, op, path, call index
        and arguments; row building output names, dtypes, shapes and seq values; attribution, which runs
        last while every row is held, only kind, op and path texts, names, seqs and output rows."""
        for name in names:
            setattr(self, name, None)

    def per_entry(self, values: np.ndarray) -> list[tuple]:
        """The tuple of each entry's output values."""
        v, starts, ns = values.tolist(), self.out_start.tolist(), self.n_out.tolist()
        return [tuple(v[a:a + n]) for a, n in zip(starts, ns)]

    def ident(self) -> np.ndarray:
        """What names an entry in its anchor key besides group, path and shapes: the op of an
        op, the call index of a module (a renamed class is still the same module)."""
        return np.where(self.kind == MODULE, self.call_index, self.op)

    def seq_index(self) -> SeqIndex:
        return SeqIndex(self.seq)


class SeqIndex:
    """Position of an entry by its record's seq (the last one, like a dict built in order)."""

    def __init__(self, seqs: np.ndarray) -> None:
        self._sorted = bool(len(seqs) < 2 or np.all(seqs[1:] > seqs[:-1]))
        self._seqs = seqs
        self._dict = None if self._sorted else {s: i for i, s in enumerate(seqs.tolist())}

    def pos(self, seq: int) -> int | None:
        if self._dict is not None:
            return self._dict.get(seq)
        i = int(np.searchsorted(self._seqs, seq))
        return i if i < len(self._seqs) and self._seqs[i] == seq else None

    def around(self, seq: int) -> tuple[int | None, int | None]:
        """Positions of the nearest entries before and after ``seq`` (None at an end, or both
        when the seqs are not in order)."""
        if self._dict is not None:
            return None, None
        lo = int(np.searchsorted(self._seqs, seq))
        hi = int(np.searchsorted(self._seqs, seq, side="right"))
        return (lo - 1 if lo > 0 else None), (hi if hi < len(self._seqs) else None)


def objects(n: int, value: Any) -> np.ndarray:
    """An object array of ``n`` references to ``value`` (np.full would copy a str per element)."""
    out = np.empty(n, dtype=object)
    out.fill(value)
    return out


def gather(values: np.ndarray, idx: np.ndarray, missing: Any) -> np.ndarray:
    """values[idx] where idx >= 0, else ``missing`` (values' dtype)."""
    out = np.full(len(idx), missing, dtype=values.dtype)
    ok = idx >= 0
    out[ok] = values[idx[ok]]
    return out


def take(values: np.ndarray, idx: np.ndarray, missing: Any) -> np.ndarray:
    """values[idx] where idx >= 0, else ``missing`` (an object array)."""
    out = objects(len(idx), missing)
    ok = idx >= 0
    out[ok] = values[idx[ok]]
    return out
