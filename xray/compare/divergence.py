"""Where the target starts to differ: the first divergence among a rank's judged rows."""
from __future__ import annotations

from .result import CompareRow, PairStatus


def first_divergence(rows: list[CompareRow]) -> CompareRow | None:
    """The earliest born failing row, or row inherited from a call with no matched record (de-dup
    folded it: ``culprit_target_seq``, the error entered there); else the earliest failing row.
    A NaN/Inf row (one side only) that ran before that pick wins over it (``_first_non_finite``).

    Module-level dumps record a module when it is entered, before its children: when the picked
    row is a module and a born failing row inside it follows (a child module, or an ATen op
    recorded inside it with dump_torch_api), the error is born in that child: the innermost wins.
    """
    failing = [r for r in rows if r.status in (PairStatus.FAIL.value, PairStatus.NAN_INF.value)]
    born = [r for r in failing if r.origin == "born" or r.culprit_target_seq is not None]
    pick = _innermost(born) if born else (failing[0] if failing else None)
    return _first_non_finite(failing, pick)


def _order(r: CompareRow) -> float:
    """Where a row ran: its target seq (its bench seq for a bench-only row)."""
    seq = r.target_seq if r.target_seq is not None else r.bench_seq
    return float("inf") if seq is None else float(seq)


def _first_non_finite(failing: list[CompareRow], pick: CompareRow | None) -> CompareRow | None:
    """NaN/Inf on one side only (an fp16 overflow) is where the run broke, whatever is judged
    born after it: every later value is off by what it carries. The first such row, in the
    target's execution order, wins over a later pick; its cause is said (``inherited``: which
    input carried it in, where causality found one)."""
    rank = pick.rank if pick is not None else None
    non_finite = [r for r in failing if r.status == PairStatus.NAN_INF.value and (rank is None or r.rank == rank)]
    if not non_finite:
        return pick
    first = min(non_finite, key=_order)
    if pick is not None and _order(pick) <= _order(first):
        return pick
    if not first.cause:
        first.cause = "nan/inf"
        first.culprit = first.culprit or "NaN/Inf first appears here, on one side only"
    return first


def _innermost(born: list[CompareRow]) -> CompareRow:
    pick = born[0]
    for r in born[1:]:
        if r.rank != pick.rank or pick.kind != "module":
            break
        if inside(r.module, pick.module):
            pick = r
        elif not inside(r.module, born[0].module):
            break
    return pick


def inside(path: str, parent: str) -> bool:
    # equal paths: a wrapper (``model``) whose prefix was stripped, entered inside its parent
    return parent == "" or path == parent or path.startswith(parent + ".")
