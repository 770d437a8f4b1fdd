"""What attribution works on and writes: a matched pair with a suspect row, and the marks it
leaves on rows (origin, cause, culprit; a downgrade to precision loss). Shared by causality.py
and statistics_only.py, so each rule writes a row the same way."""
from __future__ import annotations

from array import array
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

import numpy as np

from . import entry_records
from .entry_records import Entry
from .local import LocalError
from .op_classes import is_multi_tensor
from .result import CompareRow, PairStatus

FAILING = frozenset((PairStatus.FAIL.value, PairStatus.NAN_INF.value))
# Warnings are recomputed too: accumulated error within a run's precision can hide a local bug.
SUSPECT = FAILING | {PairStatus.WARNING.value}
PRECISION = "precision loss"


class Pending:
    """One matched record pair with a suspect row, and what phase 1 measured about it: a view of
    the PendingRun that keeps it. ``inputs``: (name, target meta, status, statistics error) of
    each input pair; ``local``, ``precision``, ``reduce``, ``outlier``, ``argument``: by output
    index, the local error, a consistent precision step, the reduction length, why far above its
    kind, a differing argument; ``sample_local``: a local error on the sample within its floor;
    ``input_errors``: input name -> accumulated_err (data)."""

    __slots__ = ("run", "index", "bench", "target", "rows", "_inputs")

    def __init__(self, run: PendingRun, index: int, bench: Entry, target: Entry, rows: list[CompareRow]) -> None:
        self.run, self.index, self.bench, self.target, self.rows = run, index, bench, target, rows
        self._inputs: list | None = None

    @property
    def inputs(self) -> list[tuple[str, Any, str, float | None]]:
        if self._inputs is None:
            self._inputs = self.run.inputs_of(self)
        return self._inputs

    @property
    def judged(self) -> list[tuple[str, str, float | None]]:
        """(name, status, statistics error) of each input pair: ``inputs`` without the metas,
        read without building a Record."""
        return self.run.judged_of(self.index)

    @property
    def local(self) -> MutableMapping[int, LocalError]:
        return _Marks(self.run.marks["local"], self.index)

    @property
    def sample_local(self) -> MutableMapping[int, LocalError]:
        """By output: a local error measured on the sample and within its floor (the op computed
        right on its sampled inputs); one beyond it is ``local``."""
        return _Marks(self.run.marks["sample_local"], self.index)

    @property
    def carried_on_sample(self) -> MutableMapping[int, float | None]:
        """By output: what its inputs' sampled differences make through the op
        (``sample_local.carried_on_sample``), measured once: the rules read it row after row."""
        return _Marks(self.run.marks["carried_on_sample"], self.index)

    @property
    def precision(self) -> MutableMapping[int, str]:
        return _Marks(self.run.marks["precision"], self.index)

    @property
    def reduce(self) -> MutableMapping[int, int]:
        return _Marks(self.run.marks["reduce"], self.index)

    @property
    def outlier(self) -> MutableMapping[int, str]:
        return _Marks(self.run.marks["outlier"], self.index)

    @property
    def input_errors(self) -> MutableMapping[str, float]:
        return _Marks(self.run.marks["input_errors"], self.index)

    @property
    def argument(self) -> MutableMapping[int, str | None]:
        return _Decided(self.run, self.index)

    def __repr__(self) -> str:
        return f"Pending({self.index}, {self.target!r})"


class _Marks(MutableMapping):
    """One pair's marks of one kind, kept in its run's map of pair -> marks: a pair without any
    holds nothing (on a run that diverged early, a million pairs have none)."""

    __slots__ = ("_store", "_i")

    def __init__(self, store: dict[int, dict], i: int) -> None:
        self._store, self._i = store, i

    def __getitem__(self, key: Any) -> Any:
        return self._store.get(self._i, _NONE)[key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._store.get(self._i, _NONE).get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._store.get(self._i, _NONE)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._store.setdefault(self._i, {})[key] = value

    def __delitem__(self, key: Any) -> None:
        marks = self._store.get(self._i, _NONE)
        del marks[key]
        if not marks:
            del self._store[self._i]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._store.get(self._i, _NONE)))

    def __len__(self) -> int:
        return len(self._store.get(self._i, _NONE))


_NONE: dict = {}  # (read only: _Marks writes a pair's own dict)


class _Decided(_Marks):
    """``argument``: decided once for every suspect output, and nearly always None (no argument
    differs): a decision is a flag per row of the run, only a found difference is text."""

    __slots__ = ("_run",)

    def __init__(self, run: PendingRun, i: int) -> None:
        super().__init__(run.marks["argument"], i)
        self._run = run

    def __contains__(self, key: object) -> bool:
        row = self._run.row_of(self._i, key)
        return super().__contains__(key) if row is None else bool(self._run.decided[row])

    def __getitem__(self, key: Any) -> Any:
        row = self._run.row_of(self._i, key)
        if row is None or not self._run.decided[row]:
            return super().__getitem__(key)
        return self.get(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        row = self._run.row_of(self._i, key)
        if row is not None:
            self._run.decided[row] = 1
        if row is None or value is not None:
            super().__setitem__(key, value)
        elif key in self._store.get(self._i, _NONE):
            super().__delitem__(key)

    def __len__(self) -> int:
        start, n = self._run.row_span(self._i)
        extra = sum(1 for k in self._store.get(self._i, _NONE) if not (isinstance(k, int) and 0 <= k < n))
        return sum(self._run.decided[start:start + n]) + extra

    def __iter__(self) -> Iterator[Any]:
        start, n = self._run.row_span(self._i)
        own = [k for k in range(n) if self._run.decided[start + k]]
        return iter(own + [k for k in self._store.get(self._i, _NONE) if k not in own])


class PendingRun(Sequence):
    """The matched pairs with a suspect row, in target order, each read as a Pending made when
    read; what attribution measures about them (inputs judged, marks) kept here, compactly.

    Why: attribution reads every pair several times, pass after pass, and on a run that diverged
    early every pair is suspect. Objects per pair (two Entries with their Records, the inputs'
    TensorMetas, six dicts) held for the whole attribution were ~6 KB a row, 7.5 GB for a million;
    here a pair is a few array elements, and its Records come from Entries' bounded cache.
    The Pendings of as many pairs as Entries keeps the Records of (``entry_records.HOLD``) are
    kept once made (~0.3 KB each): the passes read each pair about twelve times. The inputs of ``JUDGED`` pairs at a time are judged in one numpy call
    (PairComparer)."""

    JUDGED = 256

    def __init__(self, ea: Sequence[Entry], eb: Sequence[Entry], pairs: np.ndarray, plan: Any,
                 rows: list[CompareRow], comparer: Any) -> None:
        """Pair i: the plan's matched pair ``pairs[i]`` (RowPlan: its entries ``pa``/``pb``, its
        rows from ``pair_start``, ``pair_rows`` of them)."""
        self.ea, self.eb, self.comparer = ea, eb, comparer
        self.pairs, self.plan, self._rows = pairs, plan, rows
        # pair i's entries and rows, read as Python ints pass after pass: array("q"), 8 bytes each
        self._pa, self._pb, self._start, self._count = (
            array("q", np.asarray(column, dtype=np.int64)[pairs].tobytes())
            for column in (plan.pa, plan.pb, plan.pair_start, plan.pair_rows))
        self.marks: dict[str, dict[int, dict]] = {k: {} for k in ("local", "sample_local", "precision", "reduce",
                                                                   "outlier", "input_errors", "argument",
                                                                   "carried_on_sample")}
        self.decided = bytearray(len(rows))  # by row: ``argument`` was decided for it
        # the judged inputs: per pair a code into _kinds ((names, statuses)), and its errors at
        # _errors[_at[i]:...] (0.0 where none: _has False); array("i"): 4 bytes a pair, read
        # one at a time as a Python int
        self._kind = array("i", [-1]) * len(pairs)
        self._kinds: list[tuple] = []
        self._kind_code: dict[tuple, int] = {}
        self._at = array("i", [0]) * len(pairs)
        self._errors = array("d")
        self._has = bytearray()
        self._kept: list[Pending | None] = [None] * min(len(pairs), max(entry_records.HOLD, 0))
        # a target tensor -> the largest error measured on the records that held its values
        # (upstream_errors.py); set by attribution once the matches are known
        self.upstream_error: Any = None

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i %= n
        if i < len(self._kept):
            p = self._kept[i]
            if p is None:
                p = self._kept[i] = self._make(i)
            return p
        return self._make(i)

    def _make(self, i: int) -> Pending:
        start = self._start[i]
        return Pending(self, i, self.ea[self._pa[i]], self.eb[self._pb[i]], self._rows[start:start + self._count[i]])

    def __iter__(self) -> Iterator[Pending]:
        for i in range(len(self)):
            yield self[i]

    def row_span(self, i: int) -> tuple[int, int]:
        """(first row, number of rows) of pair ``i``."""
        return self._start[i], self._count[i]

    def row_of(self, i: int, k: Any) -> int | None:
        """The row number of pair ``i``'s output ``k``, or None when it has no such row."""
        start, count = self.row_span(i)
        return start + k if isinstance(k, int) and 0 <= k < count else None

    # -- inputs ---------------------------------------------------------------------------------
    def inputs_of(self, p: Pending) -> list[tuple[str, Any, str, float | None]]:
        """``Pending.inputs`` of ``p``: its statuses and errors judged here (a block of pairs at
        a time), its target TensorMetas read from its Record now."""
        judged = self.judged_of(p.index)
        inputs = dict(p.target.inputs)
        params = p.target.record.params if any(n.startswith("param:") for n, _, _ in judged) else None
        return [(n, params[n[len("param:"):]] if n.startswith("param:") else inputs[n], s, e) for n, s, e in judged]

    def judged_of(self, i: int) -> list[tuple[str, str, float | None]]:
        """(name, status, statistics error) of pair ``i``'s inputs."""
        if self._kind[i] < 0:
            self._judge(i)
        names, statuses = self._kinds[self._kind[i]]
        at = self._at[i]
        return [(n, s, self._errors[at + j] if self._has[at + j] else None)
                for j, (n, s) in enumerate(zip(names, statuses))]

    def _judge(self, i: int) -> None:
        """Judge the inputs of pairs ``i`` onwards (``JUDGED`` of them not judged yet)."""
        todo = [j for j in range(i, min(len(self), i + self.JUDGED)) if self._kind[j] < 0]
        errors = [{} for _ in todo]
        entries = [(p.bench, p.target, e) for p, e in zip(map(self.__getitem__, todo), errors)]
        for j, judged, errs in zip(todo, self.comparer.judge_inputs_of(entries), errors):
            key = (tuple(n for n, _, _, _ in judged), tuple(s for _, _, s, _ in judged))
            code = self._kind_code.get(key)
            if code is None:
                code = self._kind_code[key] = len(self._kinds)
                self._kinds.append(key)
            self._kind[j], self._at[j] = code, len(self._errors)
            for _, _, _, e in judged:
                self._errors.append(0.0 if e is None else e)
                self._has.append(e is not None)
            if errs:
                self.marks["input_errors"][j] = errs


def agreement(inputs: list[tuple[str, Any, str, float | None]]) -> str:
    """"yes" when every input pair passes, "unknown" when some were skipped, else "no"."""
    statuses = {s for _, _, s, _ in inputs}
    if statuses <= {PairStatus.PASS.value}:
        return "yes"
    if statuses <= {PairStatus.PASS.value, PairStatus.SKIP.value}:
        return "unknown"
    return "no"


def row_inputs(p: Pending, k: int | None) -> list[tuple[str, Any, str, float | None]]:
    """The inputs output ``k`` is made of: of a multi-tensor kernel's item j (``out0.j``), item j
    of each list argument and every argument that is not a list; else all of ``p.inputs``."""
    return _made_of(p.inputs, _item(p, k))


def input_error(p: Pending, k: int | None = None) -> float | None:
    """The largest statistics error among the disagreeing inputs of ``p`` (of its output ``k``:
    row_inputs) (None: they all agree, or none was judged on statistics): what they carry in.
    Read from the judged statuses (``Pending.judged``): no Record is built for it."""
    return max((e for _, s, e in _made_of(p.judged, _item(p, k))
                if e is not None and s not in (PairStatus.PASS.value, PairStatus.SKIP.value)), default=None)


def _item(p: Pending, k: int | None) -> str | None:
    """Item j of a multi-tensor kernel's output ``k`` (``out0.j``), or None: every input."""
    if k is None or not is_multi_tensor(p.target.op) or k >= len(p.target.outputs):
        return None
    _, dot, item = p.target.outputs[k][0].partition(".")
    return item if dot else None


def _made_of(inputs: list[tuple], item: str | None) -> list[tuple]:
    if item is None:
        return inputs
    return [i for i in inputs if "." not in i[0] or i[0].rsplit(".", 1)[1] == item]


def set_origin(r: CompareRow, origin: str, cause: str, culprit: str) -> None:
    r.origin, r.cause, r.culprit = origin, cause, culprit


def downgrade(r: CompareRow, why: str) -> None:
    """A failing row that is precision loss: a warning, with why. A row whose NaN/Inf counts
    differ keeps its status (a value the target's dtype could not hold is still a NaN or an Inf
    the run goes on with), and gets the why as its cause."""
    if r.status == PairStatus.NAN_INF.value:
        r.cause, r.culprit = PRECISION, why
        r.note = "; ".join(x for x in (r.note, f"precision: {why}") if x)
        return
    r.status, r.origin, r.cause, r.culprit = PairStatus.WARNING.value, "", PRECISION, why
    r.culprit_target_seq = r.culprit_bench_seq = None
    r.note = "; ".join(x for x in (r.note, f"precision loss: {why}") if x)
