"""Compare two format-v3 dumps on their columns: entries, alignment and statistics verdicts in numpy.

Why: a million Records take minutes to build and gigabytes to hold, while what compare needs of
almost all of them (kind, direction, step, module path, op, output shapes, dtypes and statistics)
is already in the columns. Records are built only where the rules look closer: pairs the
vectorised statistics judge does not cover (saved data, dtype or shape differences, random ops,
missing statistics, which ``PairComparer.compare`` judges as before) and the suspect pairs that
attribution walks from (causality.py, through lazy entries and a lazy ``Matches``).

The rows are the record path's, field for field (``compare_loaded`` on the same dumps as Records;
tests/test_compare_columns.py): the judge below is ``stats_compare`` + ``Rules.judge_stats`` with
Python's ``max``/``min`` semantics written out, and ``x ** 2`` taken in Python.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np
from tqdm import tqdm

from ..dump.columns import ABSENT_MAX, ABSENT_MEAN, ABSENT_MIN, ABSENT_STD, DIRECTIONS, KINDS, OUTPUT, Columns
from ..dump.model import record_name
from ..dump.reader import no_cyclic_gc
from ..dump.skeleton import checked_name as _name
from ..nondeterminism import _op_kind, nondeterministic
from ..numerics.rules import ATOL_PER_RTOL, Rules, Tolerance
from .align import _Features, align_features, op_base
from .causality import Matches, _random, attribute
from .entries import Entry, normalize_path
from .result import CompareRow, PairStatus

MODULE = KINDS.index("module")
CHUNK = 1 << 16  # rows (or entries) built at a time: the per-row columns of a chunk are a few MB, not a GB
_SUSPECT = frozenset((PairStatus.FAIL.value, PairStatus.NAN_INF.value, PairStatus.WARNING.value))


# ---------------------------------------------------------------------------------------------
# Entries as arrays


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

    def __init__(self, columns: Columns, codes: Codes) -> None:
        self.columns = columns
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
        s = columns.strings
        op_ids, module_ids = r["op"][self.row], r["module"][self.row] + 1  # module id 0: None

        def module(i: int) -> str | None:
            return None if i == 0 else _name(s[i - 1], "module")

        self.op_text = _per_id(op_ids, lambda i: _name(s[i], "op"), object)
        self.op = _per_id(op_ids, lambda i: codes.code("op", s[i]), np.int32)
        self.module_text = _per_id(module_ids, module, object)  # as recorded, for Record.name
        self.path_text = _per_id(module_ids, lambda i: normalize_path(module(i)), object)
        self.path = _per_id(module_ids, lambda i: codes.code("path", normalize_path(module(i))), np.int32)
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
                text = [x if x == y else y for x, y in zip(_take(other.names, p, None).tolist(), text)]
                seq = [x if x == y else y for x, y in zip(_take(other.seq_value, p, None).tolist(), seq)]
            names[sl], seqs[sl] = text, seq
        self.names, self.seq_value = names, seqs
        self.module_text = None  # read only here

    def trim(self, *names: str) -> None:
        """Drop arrays as soon as nothing reads them: alignment reads group, op, path and call
        index; row building output names, dtypes, shapes and seq values; attribution, which runs
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


def _same_structure(ta: EntryTable, tb: EntryTable) -> bool:
    """align()'s shortcut: equal anchor keys and ops, entry for entry."""
    if len(ta) != len(tb) or len(ta.out) != len(tb.out):
        return False
    return bool(np.array_equal(ta.group, tb.group) and np.array_equal(ta.path, tb.path)
                and np.array_equal(ta.op, tb.op) and np.array_equal(ta.n_out, tb.n_out)
                and np.array_equal(ta.ident(), tb.ident()) and np.array_equal(ta.out_shape, tb.out_shape))


def align_tables(ta: EntryTable, tb: EntryTable, codes: Codes) -> tuple[np.ndarray, np.ndarray, int]:
    """``align`` on two tables: the same anchors and gap scores, from the arrays. Returns the
    matched (bench, target) positions as two arrays, and the number of anchors."""
    if _same_structure(ta, tb):
        return np.arange(len(ta), dtype=np.int32), np.arange(len(tb), dtype=np.int32), len(ta)
    keys, feats = [], []
    perm_of = codes.lut("shape", lambda v: codes.code("perm", tuple(sorted(v))), np.int64)
    numel_of = codes.lut("shape", math.prod)
    for t in (ta, tb):
        shapes = [codes.code("shapes", s) for s in t.per_entry(t.out_shape)]
        keys.append(list(zip(t.group.tolist(), t.path.tolist(), t.ident().tolist(), shapes)))
        feats.append(_Features.of_arrays(
            group=t.group, op=t.op, path=t.path, shape=np.array(shapes, dtype=np.int64),
            base=np.array([codes.code("base", op_base(o)) for o in t.op_text.tolist()], dtype=np.int64),
            perm=np.array([codes.code("perms", p) for p in t.per_entry(perm_of[t.out_shape])], dtype=np.int64),
            numel=np.array([codes.code("numels", n) for n in t.per_entry(numel_of[t.out_shape])], dtype=np.int64),
            dtype=np.array([codes.code("dtypes", d) for d in t.per_entry(t.out_dtype)], dtype=np.int64),
            module=t.kind == MODULE, paths=t.path_text, ops=t.op_text))
    alignment = align_features(feats[0], feats[1], keys[0], keys[1])
    pairs = np.array(alignment.pairs, dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0].astype(np.int32), pairs[:, 1].astype(np.int32), alignment.anchors


# ---------------------------------------------------------------------------------------------
# Lazy entries, for attribution


class ColumnEntry(Entry):
    """An Entry whose Record (and tensor lists) is built on first access; kind, op, path, name
    and group come from the table."""

    def __init__(self, table: EntryTable, pos: int) -> None:  # not Entry's: that one takes a built Record
        self.table, self.pos = table, pos
        self.path = table.path_text[pos]

    @cached_property
    def record(self):
        return self.table.columns.record(int(self.table.row[self.pos]))

    @cached_property
    def outputs(self):
        return list(self.record.output_tensors())

    @cached_property
    def inputs(self):
        return list(self.record.input_tensors())

    @property
    def kind(self) -> str:
        return KINDS[self.table.kind[self.pos]]

    @property
    def op(self) -> str:
        return self.table.op_text[self.pos]

    @property
    def name(self) -> str:
        return self.table.names[self.pos]

    @property
    def direction(self) -> str:
        return DIRECTIONS[self.table.direction[self.pos]]

    @property
    def group(self) -> tuple:
        step = int(self.table.columns.records["step"][self.table.row[self.pos]])
        return (self.kind, self.direction, None if step < 0 else step)

    def __repr__(self) -> str:
        return f"ColumnEntry({self.pos}, {self.name})"


class LazyEntries(Sequence):
    """A table's entries by position, each built (and kept) when first read."""

    def __init__(self, table: EntryTable) -> None:
        self.table = table
        self._built: dict[int, ColumnEntry] = {}

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, pos: int) -> ColumnEntry:
        if not isinstance(pos, int):
            raise TypeError("LazyEntries are read by position")
        e = self._built.get(pos)
        if e is None:
            if not 0 <= pos < len(self.table):
                raise IndexError(pos)
            e = self._built[pos] = ColumnEntry(self.table, pos)
        return e


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


class _ByPos:
    """A read-only mapping key -> entry (or rows) through a position function."""

    def __init__(self, find: Callable[[Any], Any]) -> None:
        self._find = find

    def get(self, key: Any, default: Any = None) -> Any:
        got = self._find(key)
        return default if got is None else got

    def __contains__(self, key: Any) -> bool:
        return self._find(key) is not None

    def __getitem__(self, key: Any) -> Any:
        got = self._find(key)
        if got is None:
            raise KeyError(key)
        return got


class _LazyMade:
    """causality's fingerprint map of target op outputs, built from the columns when a value
    without a recorded source first asks for it (v3 dumps name their producers)."""

    def __init__(self, table: EntryTable, entries: LazyEntries) -> None:
        self.table, self.entries = table, entries
        self._made: dict | None = None

    def __bool__(self) -> bool:
        return bool(len(self.table)) and bool(np.any(self.table.kind != MODULE))

    def get(self, fp: tuple, default: Any = None) -> Any:
        if self._made is None:
            self._made = self._build()
        return self._made.get(fp, default)

    def _build(self) -> dict:
        t, made = self.table, {}
        tens, every = t.columns.tensors, np.arange(len(t.out))
        shapes = [t.columns.shape(int(i)) for i in tens["shape"][t.out].tolist()]
        dtypes = [t.columns.strings[int(i)] for i in tens["dtype"][t.out].tolist()]
        absent = t.stat("absent", every).tolist()
        cols = [t.stat(k, every).tolist() for k in ("min", "max", "mean", "std", "nan")]
        pos_inf, neg_inf = t.stat("posinf", every).tolist(), t.stat("neginf", every).tolist()
        has = t.stat("has_stats", every).tolist()
        for e, (kind, seq, start, n) in enumerate(zip(t.kind.tolist(), t.seq.tolist(), t.out_start.tolist(),
                                                      t.n_out.tolist())):
            if kind == MODULE:
                continue
            for k in range(n):
                j = start + k
                if not has[j] or absent[j] & ABSENT_MEAN:
                    continue
                mn, mx, mean, std, nan = (c[j] for c in cols)
                fp = (shapes[j], dtypes[j], None if absent[j] & ABSENT_MIN else mn, None if absent[j] & ABSENT_MAX else mx,
                      mean, None if absent[j] & ABSENT_STD else std, nan, pos_inf[j], neg_inf[j])
                made.setdefault(fp, []).append((seq, k))
        return made


# ---------------------------------------------------------------------------------------------
# Rows


class RowPlan:
    """Which entries and outputs each row shows, in compare_loaded's order: before each matched
    pair, the target-only entries that precede it, then the bench-only ones, then the pair's rows."""

    def __init__(self, ta: EntryTable, tb: EntryTable, pa: np.ndarray, pb: np.ndarray) -> None:
        self.pa, self.pb = pa, pb
        n_pair = np.maximum(ta.n_out[pa], tb.n_out[pb])
        only_a, only_b = _unmatched(len(ta), pa), _unmatched(len(tb), pb)
        if len(only_a) or len(only_b):
            # block keys: the pair a block precedes (or is) x 3 + its category; a stable sort keeps
            # unmatched entries in their order within a gap
            cat = np.concatenate([np.zeros(len(only_b), np.int32), np.ones(len(only_a), np.int32),
                                  np.full(len(pa), 2, np.int32)])
            pair = np.concatenate([np.searchsorted(pb, only_b, "right"), np.searchsorted(pa, only_a, "right"),
                                   np.arange(len(pa))]).astype(np.int32)
            order = np.argsort(pair.astype(np.int64) * 3 + cat, kind="stable")
            cat, pair = cat[order], pair[order]
            a = np.concatenate([np.full(len(only_b), -1, np.int32), only_a, pa])[order]
            b = np.concatenate([only_b, np.full(len(only_a), -1, np.int32), pb])[order]
            n = np.concatenate([tb.n_out[only_b], ta.n_out[only_a], n_pair])[order]
            del order
        else:  # every entry matched (the same model on both sides): blocks are the pairs
            cat, pair, a, b, n = np.full(len(pa), 2, np.int32), np.arange(len(pa), dtype=np.int32), pa, pb, n_pair
        block_start = np.cumsum(n, dtype=np.int64) - n  # first row of each block

        def rep(x: np.ndarray) -> np.ndarray:  # int32: a million rows hold 6 of these
            return np.repeat(x.astype(np.int32, copy=False), n)

        self.cat, self.pair, self.a, self.b = rep(cat), rep(pair), rep(a), rep(b)
        k = np.arange(len(self.cat), dtype=np.int32) - np.repeat(block_start.astype(np.int32), n)  # output index
        self.ao = np.where(k < _gather(ta.n_out, self.a, 0), _gather(ta.out_start, self.a, 0) + k, -1).astype(np.int32)
        self.bo = np.where(k < _gather(tb.n_out, self.b, 0), _gather(tb.out_start, self.b, 0) + k, -1).astype(np.int32)
        del k
        # where each pair's rows start, by pair index
        self.pair_start = np.zeros(len(pa), np.int64)
        self.pair_rows = n_pair
        is_pair = cat == 2
        self.pair_start[pair[is_pair]] = block_start[is_pair]

    def __len__(self) -> int:
        return len(self.cat)

    def trim(self) -> None:
        """Drop the row -> entry and output maps once rows are judged (attribution reads the
        pairs, their rows and the target entry of each row)."""
        self.a = self.ao = self.bo = None


def _unmatched(n: int, matched: np.ndarray) -> np.ndarray:
    """Positions in range(n) not in ``matched`` (int32)."""
    keep = np.ones(n, dtype=bool)
    keep[matched] = False
    return np.flatnonzero(keep).astype(np.int32)


def _gather(values: np.ndarray, idx: np.ndarray, missing: Any) -> np.ndarray:
    """values[idx] where idx >= 0, else ``missing`` (values' dtype)."""
    out = np.full(len(idx), missing, dtype=values.dtype)
    ok = idx >= 0
    out[ok] = values[idx[ok]]
    return out


def _take(values: np.ndarray, idx: np.ndarray, missing: Any) -> np.ndarray:
    """values[idx] where idx >= 0, else ``missing`` (an object array)."""
    out = _objects(len(idx), missing)
    ok = idx >= 0
    out[ok] = values[idx[ok]]
    return out


def _tolerances(ta: EntryTable, tb: EntryTable, plan: RowPlan, rules: Rules) -> tuple[Tolerance | None, dict]:
    """engine.precision_floor over the matched outputs, and the tolerance of each dtype pair
    (``PairComparer.tolerance``), by (bench dtype code, target dtype code)."""
    from .engine import _torch_dtype

    both = (plan.ao >= 0) & (plan.bo >= 0)
    pairs = set(zip(ta.out_dtype[plan.ao[both]].tolist(), tb.out_dtype[plan.bo[both]].tolist()))
    text = _dtype_names(ta)
    floor = None
    for db, dt in pairs:
        if db != dt:
            tdb, tdt = _torch_dtype(text[db]), _torch_dtype(text[dt])
            if tdb is not None and tdt is not None and tdb.is_floating_point and tdt.is_floating_point:
                t = rules.tolerance(text[db], text[dt])
                floor = t if floor is None else Tolerance(max(t.rtol, floor.rtol), max(t.atol, floor.atol))
    tols = {}
    for db, dt in pairs:
        tol = rules.tolerance(text[db], text[dt])
        d = _torch_dtype(text[db])
        if floor is not None and d is not None and (d.is_floating_point or d.is_complex):
            tol = Tolerance(max(tol.rtol, floor.rtol), max(tol.atol, floor.atol))
        tols[db, dt] = tol
    return floor, tols


def _dtype_names(t: EntryTable) -> dict[int, str]:
    """dtype code -> name, both sides (their codes are shared)."""
    return dict(enumerate(t.codes.lut("dtype").tolist()))


# Status texts by verdict code, indexed so every row holds the one str object (np.where on texts
# and astype(object) would make a new str per row: 50 MB at a million rows).
_STATUS_OBJECTS = np.array([PairStatus.PASS.value, PairStatus.WARNING.value, PairStatus.FAIL.value,
                            PairStatus.NAN_INF.value], dtype=object)


def _objects(n: int, value: Any) -> np.ndarray:
    """An object array of ``n`` references to ``value`` (np.full would copy a str per element)."""
    out = np.empty(n, dtype=object)
    out.fill(value)
    return out


def _pymax(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Python's ``max(x, y)``: y only when y > x (NaN never wins against the first)."""
    return np.where(y > x, y, x)


def _pymin(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(y < x, y, x)


def _square(x: np.ndarray) -> np.ndarray:
    """``x ** 2`` as Python computes it (C pow), for results equal to stats_rms's to the bit."""
    return np.array([v ** 2 for v in x.tolist()], dtype=np.float64)


def judge_stats(b: dict, t: dict, rtol: np.ndarray, atol: np.ndarray, rules: Rules) -> dict[str, np.ndarray]:
    """``stats_compare`` + the status ``PairComparer._compare_stats`` gives, over arrays of
    output pairs (bench ``b``, target ``t``: columns of statistics, ``absent`` masks)."""
    present_b = [(b["absent"] & bit) == 0 for bit in (ABSENT_MIN, ABSENT_MAX, ABSENT_MEAN, ABSENT_STD)]
    present_t = [(t["absent"] & bit) == 0 for bit in (ABSENT_MIN, ABSENT_MAX, ABSENT_MEAN, ABSENT_STD)]
    keys = ("min", "max", "mean", "std")
    lo, hi = np.abs(b["min"]), np.abs(b["max"])
    scale = np.where(present_b[0], np.where(present_b[1], _pymax(lo, hi), lo), np.where(present_b[1], hi, 0.0))
    worst = np.zeros(len(rtol))
    with np.errstate(all="ignore"):
        for key, pb, pt in zip(keys, present_b, present_t):
            worst = np.where(pb != pt, np.inf, np.where(pb, _pymax(worst, np.abs(t[key] - b[key])), worst))
        std = np.where(present_b[3], b["std"], 0.0)
        std = np.where(std != 0, std, 0.0)  # ``std or 0.0``: -0.0 counts as 0.0 too
        rms = np.sqrt(_square(b["mean"]) + _square(std))
        base = np.where(present_b[2], rms, scale)  # tol.floor(scale if rms is None else rms)
        exact = (rtol == 0) & (atol == 0)
        floor = np.where(exact, 0.0, _pymax(atol * _pymin(base, np.ones_like(base)), ATOL_PER_RTOL * rtol * base))
        allowed = floor + rtol * scale
        within = np.where(allowed > 0, worst / allowed, np.where(worst == 0, 0.0, np.inf))
        stats_err = np.where(scale > 0, worst / scale, worst)
    verdict = np.where(within <= 1.0, 0, np.where(exact, 2, np.where(within <= rules.stats_warn_factor, 1, 2)))
    verdict[(b["nan"] != t["nan"]) | (b["inf"] != t["inf"])] = 3
    return {"status": _STATUS_OBJECTS[verdict], "stats_err": stats_err}


def _random_of(ta: EntryTable, ea: LazyEntries) -> dict[int, str]:
    """engine._random_entries over a table: only ops whose name can be random build a Record."""
    from .engine import _inside

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
        for pos in np.flatnonzero(ta.kind == MODULE).tolist():
            path = ta.path_text[pos]
            inner = next((why for p, why in sources.items() if _inside(p, path)), None)
            if inner:
                out[pos] = f"a random op ran inside it ({inner})"
    return out


class _Vocab:
    """Values by shared code, as rows show them: dtype names, shapes as text, element counts
    (one Python object per distinct value, shared by every row)."""

    def __init__(self, codes: Codes) -> None:
        self.dtype = codes.lut("dtype")
        self.shape_text = codes.lut("shape", lambda v: str(tuple(v)))
        self.numel = codes.lut("shape", math.prod)


def _row_columns(rank: str, ta: EntryTable, tb: EntryTable, plan: RowPlan, sl: slice, vocab: _Vocab) -> dict:
    """Every CompareRow field that names rows ``sl`` of the plan (compare_loaded's _row and
    _unmatched)."""
    cat, a, b, ao, bo = plan.cat[sl], plan.a[sl], plan.b[sl], plan.ao[sl], plan.bo[sl]
    pair, bench_only = cat == 2, cat == 1
    on_a = pair | bench_only  # rows whose kind and module are the bench entry's
    kinds = np.array(KINDS, dtype=object)
    note, status = _objects(len(cat), ""), _objects(len(cat), "")
    one_sided = pair & ((ao < 0) | (bo < 0))
    note[one_sided] = "output present on one side only"
    note[cat == 0] = "only in target"
    note[bench_only] = "only in bench"
    status[~pair | one_sided] = PairStatus.UNMATCHED.value

    def shown(outs: np.ndarray, lut: np.ndarray, codes: np.ndarray) -> np.ndarray:
        return _take(lut, _gather(codes, outs, -1), "")

    kind = np.where(on_a, _gather(ta.kind, a, 0), _gather(tb.kind, b, 0))

    return {
        "rank": rank, "index": list(range(sl.start, sl.stop)), "status": status, "note": note,
        "bench_name": _take(ta.names, a, ""), "target_name": _take(tb.names, b, ""),
        "kind": kinds[kind],
        "module": np.where(on_a, _take(ta.path_text, a, ""), _take(tb.path_text, b, "")),
        "bench_op": _take(ta.op_text, a, ""), "target_op": _take(tb.op_text, b, ""),
        "tensor": np.where(ao >= 0, _take(ta.out_name, ao, ""), _take(tb.out_name, bo, "")),
        "bench_seq": _take(ta.seq_value, a, None), "target_seq": _take(tb.seq_value, b, None),
        "bench_shape": shown(ao, vocab.shape_text, ta.out_shape), "target_shape": shown(bo, vocab.shape_text, tb.out_shape),
        "bench_dtype": shown(ao, vocab.dtype, ta.out_dtype), "target_dtype": shown(bo, vocab.dtype, tb.out_dtype),
    }


def _stats_columns(ta: EntryTable, tb: EntryTable, ao: np.ndarray, bo: np.ndarray, at: np.ndarray, tols: dict,
                   rules: Rules, vocab: _Vocab, cols: dict[str, Any]) -> None:
    """Judge the output pairs (``ao``, ``bo``) from their statistics into rows ``at`` of ``cols``."""
    width = len(vocab.dtype)
    kinds, inv = np.unique(ta.out_dtype[ao].astype(np.int64) * width + tb.out_dtype[bo], return_inverse=True)
    tol = [tols[divmod(k, width)] for k in kinds.tolist()]
    inv = inv.reshape(-1)
    rtol_of = np.empty(len(tol), dtype=object)  # shared float objects, as on the record path
    atol_of = np.empty(len(tol), dtype=object)
    rtol_of[:], atol_of[:] = [x.rtol for x in tol], [x.atol for x in tol]
    keys = ("absent", "min", "max", "mean", "std", "nan", "inf")
    b = {k: ta.stat(k, ao) for k in keys}
    t = {k: tb.stat(k, bo) for k in keys}
    judged = judge_stats(b, t, rtol_of[inv].astype(np.float64), atol_of[inv].astype(np.float64), rules)

    def put(name: str, values: np.ndarray) -> None:
        col = cols.get(name)
        if not isinstance(col, np.ndarray):
            col = cols[name] = _objects(len(cols["status"]), _FIELDS[name].default)
        col[at] = values

    put("status", judged["status"])
    put("mode", "stats")
    put("stats_err", judged["stats_err"])
    put("numel", vocab.numel[ta.out_shape[ao]])
    put("bench_nan", b["nan"])
    put("target_nan", t["nan"])
    put("bench_inf", b["inf"])
    put("target_inf", t["inf"])
    put("rtol", rtol_of[inv])
    put("atol", atol_of[inv])


def _vectorised(ta: EntryTable, tb: EntryTable, plan: RowPlan, random_of: dict[int, str], vocab: _Vocab) -> np.ndarray:
    """Which plan rows the statistics judge covers: both outputs with statistics, not both with
    saved data, same dtype (a known one) and shape, not empty, not a random op's. The rest go
    through PairComparer.compare, as on the record path."""
    from .engine import _torch_dtype

    fast = np.zeros(len(plan), dtype=bool)
    rows = np.flatnonzero((plan.ao >= 0) & (plan.bo >= 0))
    ao, bo = plan.ao[rows], plan.bo[rows]
    known = np.array([_torch_dtype(d) is not None for d in vocab.dtype.tolist()], dtype=bool)
    numel = np.array([n > 0 for n in vocab.numel.tolist()], dtype=bool)
    ok = (ta.stat("has_stats", ao) != 0) & (tb.stat("has_stats", bo) != 0)
    ok &= (ta.stat("data", ao) < 0) | (tb.stat("data", bo) < 0)
    ok &= (ta.out_dtype[ao] == tb.out_dtype[bo]) & (ta.out_shape[ao] == tb.out_shape[bo])
    ok &= numel[ta.out_shape[ao]] & known[ta.out_dtype[ao]]
    if random_of:
        ok &= ~np.isin(plan.a[rows], np.fromiter(random_of, dtype=np.int64, count=len(random_of)))
    fast[rows[ok]] = True
    return fast


def _total_bytes(t: EntryTable, vocab: _Vocab) -> int:
    """Bytes of the bench's saved outputs, twice (the progress bar's total)."""
    from ..dump.tensorio import dtype_from_name

    saved = np.flatnonzero(t.stat("data", np.arange(len(t.out))) >= 0)
    if not len(saved):
        return 0

    def size(text: str) -> int:
        try:
            return dtype_from_name(text).itemsize
        except ValueError:
            return 0

    itemsize = np.array([size(d) for d in vocab.dtype.tolist()], dtype=np.int64)
    numel = vocab.numel[t.out_shape[saved]].astype(np.int64)
    return int((numel * itemsize[t.out_dtype[saved]]).sum()) * 2


def compare_columns(bench: Any, target: Any, rules: Rules, *, rank: str = "",
                    progress: bool | None = None) -> tuple[list[CompareRow], dict]:
    """compare_loaded for two columnar dumps (no reference run): the same rows and totals."""
    from .engine import PairComparer

    started = time.perf_counter()
    codes = Codes()
    ta, tb = EntryTable(bench.columns, codes), EntryTable(target.columns, codes)
    pa, pb, anchors = align_tables(ta, tb, codes)
    ea, eb = LazyEntries(ta), LazyEntries(tb)
    plan = RowPlan(ta, tb, pa, pb)
    _name_rows(ta, tb, pa, pb)
    vocab = _Vocab(codes)
    floor, tols = _tolerances(ta, tb, plan, rules)
    comparer = PairComparer(bench, target, rules, None, floor)
    random_of = _random_of(ta, ea)
    for t in (ta, tb):
        t.trim("group", "op", "path", "call_index")
    comparer.bar = _progress_bar(ta, vocab, rank, progress)
    fast = _vectorised(ta, tb, plan, random_of, vocab)
    _return_freed_memory()
    rows = _rows(rank, ta, tb, plan, fast, tols, rules, vocab)
    random_rows = _judge_the_rest(bench, target, ta, tb, plan, fast, rows, comparer, random_of)
    comparer.bar.close()
    for t in (ta, tb):
        t.trim("out_name", "out_dtype", "out_shape", "seq_value")
    ta.trim("out", "out_start", "n_out")  # the bench's outputs are read through its Records from here on
    plan.trim()
    _return_freed_memory()
    matches, suspect = _matches(ta, tb, ea, eb, plan, rows, random_rows)
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


def _progress_bar(ta: EntryTable, vocab: _Vocab, rank: str, progress: bool | None) -> tqdm:
    from .engine import PROGRESS_BYTES

    total_bytes = _total_bytes(ta, vocab)
    show = total_bytes >= PROGRESS_BYTES if progress is None else progress
    return tqdm(total=total_bytes, unit="B", unit_scale=True, desc=f"compare {rank}".strip(), disable=not show,
                leave=False)


def _rows(rank: str, ta: EntryTable, tb: EntryTable, plan: RowPlan, fast: np.ndarray, tols: dict, rules: Rules,
          vocab: _Vocab) -> list[CompareRow]:
    """Every row, named; those in ``fast`` judged from statistics. Chunk by chunk, so the
    per-row columns never exist for all rows at once."""
    rows: list[CompareRow] = [None] * len(plan)  # type: ignore[list-item]  # filled below, never regrown
    with no_cyclic_gc():  # a million acyclic rows: the collector would walk them again and again
        for lo in range(0, len(plan), CHUNK):
            sl = slice(lo, min(lo + CHUNK, len(plan)))
            cols = _row_columns(rank, ta, tb, plan, sl, vocab)
            at = np.flatnonzero(fast[sl])
            _stats_columns(ta, tb, plan.ao[sl][at], plan.bo[sl][at], at, tols, rules, vocab, cols)
            rows[sl] = _build_rows(cols, sl.stop - sl.start)
    return rows


def _judge_the_rest(bench: Any, target: Any, ta: EntryTable, tb: EntryTable, plan: RowPlan, fast: np.ndarray,
                    rows: list[CompareRow], comparer: Any, random_of: dict[int, str]) -> list[int]:
    """The output pairs the statistics judge left: judged one by one from their TensorMetas,
    as compare_loaded judges every pair. Returns the rows skipped as random."""
    from .engine import _same_layout

    meta_a, meta_b = bench.columns.tensor_meta, target.columns.tensor_meta
    random_rows = []
    for n in np.flatnonzero(~fast & (plan.ao >= 0) & (plan.bo >= 0)).tolist():
        row, a = rows[n], int(plan.a[n])
        bm, tm = meta_a(int(ta.out[plan.ao[n]])), meta_b(int(tb.out[plan.bo[n]]))
        if a in random_of and _same_layout(bm, tm):  # random values differ by nature: never a divergence
            row.status, row.note = PairStatus.SKIP.value, f"values not compared: {random_of[a]}"
            random_rows.append(n)
        else:
            comparer.compare(row, bm, tm, None)
    return random_rows


_FIELDS = CompareRow.__dataclass_fields__


def _build_rows(cols: dict[str, Any], n: int) -> list[CompareRow]:
    """CompareRows from columns (lists, object arrays, or one value for every row)."""
    from itertools import repeat

    args = []
    for name, f in _FIELDS.items():
        col = cols.get(name, f.default)
        if isinstance(col, np.ndarray):
            col = col.tolist()
        elif not isinstance(col, list):
            col = repeat(col, n)
        args.append(col)
    return list(map(CompareRow, *args))


def _matches(ta: EntryTable, tb: EntryTable, ea: LazyEntries, eb: LazyEntries, plan: RowPlan,
             rows: list[CompareRow], random_rows: list[int]) -> tuple[Matches, list]:
    """causality's look-ups over every matched pair, and the pairs it starts from (those with a
    suspect row), without building an Entry for the others."""
    pair_of_b = np.full(len(tb), -1, dtype=np.int32)
    pair_of_b[plan.pb] = np.arange(len(plan.pb))
    pair_of_a = np.full(len(ta), -1, dtype=np.int32)
    pair_of_a[plan.pa] = np.arange(len(plan.pa))
    start, count = plan.pair_start, plan.pair_rows

    def pair_rows(p: int) -> list[CompareRow]:
        return rows[int(start[p]):int(start[p] + count[p])]

    def rows_of(pos: int) -> list[CompareRow] | None:
        p = int(pair_of_b[pos]) if 0 <= pos < len(pair_of_b) else -1
        return None if p < 0 else pair_rows(p)

    seq_a, seq_b = ta.seq_index(), tb.seq_index()

    def by_seq(seq: int) -> Entry | None:
        pos = seq_b.pos(seq)
        return None if pos is None else eb[pos]

    def target_of(seq: int) -> Entry | None:
        pos = seq_a.pos(seq)
        p = -1 if pos is None else int(pair_of_a[pos])
        return None if p < 0 else eb[int(plan.pb[p])]

    bad = np.zeros(len(rows), dtype=bool)
    for lo in range(0, len(rows), CHUNK):
        bad[lo:lo + CHUNK] = [r.status in _SUSPECT for r in rows[lo:lo + CHUNK]]
    suspect_pairs = np.unique(plan.pair[bad & (plan.cat == 2)])
    suspect = [(ea[int(plan.pa[p])], eb[int(plan.pb[p])], pair_rows(p)) for p in suspect_pairs.tolist()]
    random_pos = min((int(plan.b[n]) for n in random_rows if _random(rows[n])), default=len(tb))
    return Matches(by_seq=_ByPos(by_seq), rows_of=_ByPos(rows_of), target_of=_ByPos(target_of),
                   random_pos=random_pos, made=_LazyMade(tb, eb)), suspect
