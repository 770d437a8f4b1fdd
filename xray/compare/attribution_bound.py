"""Attribution of the earliest failing rows: born, inherited and cause for the first
``ATTRIBUTED`` failing rows in the target's execution order; later ones keep their status and
metrics, with a note saying they were not attributed.

Why: attribution's rules run per suspect row in Python (causality.py, 0.3-0.5 ms a failing row
with its Records), so a run that diverged at its first op, where every row fails, takes minutes
at a million rows against seconds for an identical pair. What the verdict names is the first
divergence, among the earliest failing rows; the rows after it inherit or repeat it.

``ATTRIBUTED`` (result.py) is 16384: the suspect entries Entries keeps the Records of
(entry_records.HOLD, ~45 MiB a side), so each is built once, and attributing them takes ~5 s,
so a 1M-record all-failing compare stays within 3x an identical pair's time and under 2 GB
(tools/bench_bigdump.py --failing, docs/benchmarks.md). A run with no more failing rows than
that is attributed in full.

The first divergence is always among the rows attributed: when none of them is born (they all
settle as precision loss, say), every pair is attributed. The rules that weigh a kind over the
run (precision steps, outliers) see the pairs attributed, as if the recording ended after them.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np

from .causality import Matches, attribute
from .entry_records import Entries
from .entry_table import CHUNK
from .lazy_matches import suspect_run
from .pending import FAILING
from .result import ATTRIBUTED, COMPARE_COLUMNS, CompareRow
from .row_plan import RowPlan

_FIELDS = attrgetter(*COMPARE_COLUMNS)  # a row's values, in CompareRow's order


def attribute_first(ea: Entries, eb: Entries, pairs: np.ndarray, failing: np.ndarray, plan: RowPlan,
                    rows: list[CompareRow], comparer: Any, rules: Any, target: Any, matches: Matches,
                    first: int | None = ATTRIBUTED) -> int:
    """Attribute the suspect ``pairs`` (target order; ``failing``: the failing rows of each) up
    to the one holding the ``first``-th failing row (at least the first), or every pair
    (``first`` None, no more failing rows than that, or none of them born). Returns how many
    failing rows were left unattributed."""
    cut = len(pairs) if first is None else _cut(failing, first)
    if cut == len(pairs):
        attribute(ea, eb, suspect_run(ea, eb, pairs, plan, rows, comparer), comparer, rules, target, matches, rows)
        return 0
    head = _rows_of(pairs[:cut], plan)
    target_only = np.flatnonzero(plan.cat == 0)  # rows causality._judge_the_target_only may judge
    saved = {i: _FIELDS(rows[i]) for i in np.concatenate([head, target_only]).tolist()}
    attribute(ea, eb, suspect_run(ea, eb, pairs[:cut], plan, rows, comparer), comparer, rules, target, matches, rows)
    if not any(_born(rows[i]) for i in head.tolist()):
        for i, values in saved.items():  # as before attribution: every pair is attributed afresh
            rows[i] = CompareRow(*values)
        attribute(ea, eb, suspect_run(ea, eb, pairs, plan, rows, comparer), comparer, rules, target, matches, rows)
        return 0
    saved = None
    left = int(failing[cut:].sum())
    note = not_attributed(first, left)
    for lo in range(cut, len(pairs), CHUNK):  # a million row numbers as Python ints would be ~40 MB
        for i in _rows_of(pairs[lo:lo + CHUNK], plan).tolist():
            r = rows[i]
            if r.status in FAILING:
                r.note = f"{r.note}; {note}" if r.note else note
    return left


def not_attributed(first: int, left: int) -> str:
    """The note of a failing row past the bound (one string, shared by every such row)."""
    return (f"not attributed: attribution ran for the first {first} failing rows in execution order, "
            f"{left} later ones keep status and metrics only (xray-compare --attribute-all, "
            "or compare_dumps(attribute_first=None), attributes every row)")


def _cut(failing: np.ndarray, first: int) -> int:
    """The number of pairs up to the one holding the ``first``-th failing row (all of them when
    no more rows fail)."""
    total = np.cumsum(failing)
    if not len(total) or total[-1] <= first:
        return len(failing)
    return int(np.searchsorted(total, max(first, 1))) + 1


def _rows_of(pairs: np.ndarray, plan: RowPlan) -> np.ndarray:
    """Every row of the matched ``pairs``."""
    start, count = plan.pair_start[pairs], plan.pair_rows[pairs].astype(np.int64)
    if not len(pairs):
        return np.zeros(0, dtype=np.int64)
    return np.repeat(start - np.cumsum(count) + count, count) + np.arange(int(count.sum()))


def _born(r: CompareRow) -> bool:
    """A row first_divergence may pick before any failing row (divergence.first_divergence)."""
    return r.status in FAILING and (r.origin == "born" or r.culprit_target_seq is not None)
