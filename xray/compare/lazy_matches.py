"""causality's ``Matches`` over the tables: look-ups answered from arrays, on demand.

Why: attribution reads a few matched pairs; dicts (and Entries) for every pair would cost a
million objects. The suspect pairs it starts from are picked from the rows here too.
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..dump.columns import ABSENT_MAX, ABSENT_MEAN, ABSENT_MIN, ABSENT_STD
from ..numerics.stats_judge import stats_error
from .causality import Matches
from .entry_table import CHUNK, MODULE, EntryTable
from .entry_records import Entries, Entry
from .pending import FAILING, SUSPECT, PendingRun
from .result import CompareRow, PairStatus
from .row_plan import RowPlan


def matches_of(ta: EntryTable, tb: EntryTable, ea: Entries, eb: Entries, plan: RowPlan,
               rows: list[CompareRow], random_rows: list[int]) -> tuple[Matches, np.ndarray, np.ndarray]:
    """causality's look-ups over every matched pair, the pairs it starts from (those with a
    suspect row, in target order) and the number of failing rows of each, without building an
    Entry for the others."""
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

    def around(seq: int) -> tuple[Entry | None, Entry | None]:
        before, after = seq_b.around(seq)
        return (None if before is None else eb[before]), (None if after is None else eb[after])

    def target_of(seq: int) -> Entry | None:
        pos = seq_a.pos(seq)
        p = -1 if pos is None else int(pair_of_a[pos])
        return None if p < 0 else eb[int(plan.pb[p])]

    grade = np.zeros(len(rows), dtype=np.int8)  # 1: suspect, 2: failing
    for lo in range(0, len(rows), CHUNK):
        grade[lo:lo + CHUNK] = [_GRADE.get(r.status, 0) for r in rows[lo:lo + CHUNK]]
    matched = plan.cat == 2
    suspect_pairs = np.unique(plan.pair[(grade > 0) & matched]).astype(np.int32)
    suspect_pairs = suspect_pairs[np.argsort(plan.pb[suspect_pairs], kind="stable")]  # target order
    failing = np.bincount(plan.pair[(grade == 2) & matched], minlength=len(plan.pa))[suspect_pairs]
    del grade, matched
    # every row judge_the_rest skipped as random is one causality's _random finds
    random_pos = int(plan.b[random_rows].min()) if random_rows else len(tb)

    def _saved_stats_error(i: int) -> float | None:
        """The statistics error of plan row ``i``, a matched saved-data row (None without
        statistics on both sides): read through the pair's entries, the plan's row -> output
        maps being trimmed once rows are judged."""
        p = int(plan.pair[i])
        k = i - int(plan.pair_start[p])
        a, b = ea[int(plan.pa[p])].outputs, eb[int(plan.pb[p])].outputs
        if k >= len(a) or k >= len(b):
            return None
        return stats_error(a[k][1], b[k][1])

    def kind_errors(candidates: list[tuple[int, CompareRow]]) -> list[Sequence[tuple[int, float, str]]]:
        """For each (target position, row) the (row index, statistics error, status) of every
        matched statistics-only row of its kind on this run, in row order: the same op, direction
        and output (one pass over the rows). Candidates of one kind share one population."""
        def kind(pos: int, r: CompareRow) -> tuple:
            return r.target_op, int(tb.direction[pos]), r.tensor

        wanted = {kind(pos, r): _Population() for pos, r in candidates}
        ops = {k[0] for k in wanted}
        for i, r in enumerate(rows):
            if r.target_op not in ops or plan.cat[i] != 2 or r.mode not in ("stats", "data"):
                continue
            errors = wanted.get(kind(int(plan.b[i]), r))
            # a saved-data row's calls are its kind's as much as a statistics-only row's
            err = None if errors is None else r.stats_err if r.mode == "stats" else _saved_stats_error(i)
            if err is not None:
                errors.append((r.index, err, r.status))
        return [wanted[kind(pos, r)] for pos, r in candidates]

    return Matches(by_seq=_ByPos(by_seq), rows_of=_ByPos(rows_of), target_of=_ByPos(target_of),
                   random_pos=random_pos, made=_LazyMade(tb, eb), kind_errors=kind_errors, around=around), \
        suspect_pairs, failing


_GRADE = {s: 2 if s in FAILING else 1 for s in SUSPECT}


def suspect_run(ea: Entries, eb: Entries, pairs: np.ndarray, plan: RowPlan, rows: list[CompareRow],
                comparer: Any) -> PendingRun:
    """The PendingRun attribution reads over ``pairs`` (target order), the Records of their
    entries read ahead in that order."""
    ea.read_ahead(np.sort(plan.pa[pairs]))
    eb.read_ahead(plan.pb[pairs])
    return PendingRun(ea, eb, pairs, plan, rows, comparer)


class _Population(Sequence):
    """(row index, statistics error, status) of the rows of one kind, in row order, as columns:
    a kind of a run that diverged early is most of its million rows."""

    _STATUSES = tuple(s.value for s in PairStatus)
    _CODES = {s: i for i, s in enumerate(_STATUSES)}

    def __init__(self) -> None:
        self._index, self._error, self._status = array("q"), array("d"), bytearray()

    def append(self, item: tuple[int, float, str]) -> None:
        index, error, status = item
        self._index.append(index)
        self._error.append(error)
        self._status.append(self._CODES[status])

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._index[i], self._error[i], self._STATUSES[self._status[i]]

    def __iter__(self) -> Iterator[tuple[int, float, str]]:
        statuses = self._STATUSES
        for index, error, status in zip(self._index, self._error, self._status):
            yield index, error, statuses[status]


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
    """causality's fingerprint map of target op outputs (fingerprint -> [(seq, output index)], in
    entry order), read from the columns when a value without a recorded source first asks for it
    (v3 dumps name their producers). Held as each output's ``hash`` of its fingerprint, sorted,
    and checked against the columns on a hit: as a dict of tuples it was ~330 bytes an output."""

    def __init__(self, table: EntryTable, entries: Entries) -> None:
        self.table, self.entries = table, entries
        self._hashes: np.ndarray | None = None
        self._outs = np.zeros(0, dtype=np.int32)

    def __bool__(self) -> bool:
        return bool(len(self.table)) and bool(np.any(self.table.kind != MODULE))

    def get(self, fp: tuple, default: Any = None) -> Any:
        if self._hashes is None:
            self._index()
        h = hash(fp)
        lo, hi = np.searchsorted(self._hashes, h, "left"), np.searchsorted(self._hashes, h, "right")
        t, outs = self.table, self._outs[lo:hi]
        found = []
        for j, e, got in zip(outs.tolist(), self._entry_of(outs).tolist(), self._fingerprints(outs)):
            if got == fp:
                found.append((int(t.seq[e]), j - int(t.out_start[e])))
        return found or default

    def _index(self) -> None:
        t = self.table
        every = np.arange(len(t.out))
        mean_known = (t.stat("absent", every) & ABSENT_MEAN) == 0
        outs = np.flatnonzero(np.repeat(t.kind != MODULE, t.n_out) & (t.stat("has_stats", every) != 0) & mean_known)
        outs = outs.astype(np.int32)
        hashes = np.empty(len(outs), dtype=np.int64)
        step = 4096  # fingerprints made at a time (a tuple and five floats each)
        for lo in range(0, len(outs), step):
            hashes[lo:lo + step] = [hash(fp) for fp in self._fingerprints(outs[lo:lo + step])]
        order = np.argsort(hashes, kind="stable")  # equal fingerprints stay in entry order
        self._hashes, self._outs = hashes[order], outs[order]

    def _entry_of(self, outs: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.table.out_start, outs, "right") - 1

    def _fingerprints(self, outs: np.ndarray) -> list[tuple]:
        """causality._fingerprint of outputs ``outs``, from the columns."""
        t = self.table
        tens = t.columns.tensors
        shapes = [t.columns.shape(int(i)) for i in tens["shape"][t.out[outs]].tolist()]
        dtypes = [t.columns.strings[int(i)] for i in tens["dtype"][t.out[outs]].tolist()]
        absent = t.stat("absent", outs).tolist()
        mn, mx, mean, std, nan = (t.stat(k, outs).tolist() for k in ("min", "max", "mean", "std", "nan"))
        pos_inf, neg_inf = t.stat("posinf", outs).tolist(), t.stat("neginf", outs).tolist()
        return [(shapes[i], dtypes[i], None if a & ABSENT_MIN else mn[i], None if a & ABSENT_MAX else mx[i], mean[i],
                 None if a & ABSENT_STD else std[i], nan[i], pos_inf[i], neg_inf[i]) for i, a in enumerate(absent)]
