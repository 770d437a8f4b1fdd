"""What attribution works on and writes: a matched pair with a suspect row, and the marks it
leaves on rows (origin, cause, culprit; a downgrade to precision loss). Shared by causality.py
and statistics_only.py, so each rule writes a row the same way."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .entry_records import Entry
from .local import LocalError
from .op_classes import is_multi_tensor
from .result import CompareRow, PairStatus

FAILING = frozenset((PairStatus.FAIL.value, PairStatus.NAN_INF.value))
# Warnings are recomputed too: accumulated error within a run's precision can hide a local bug.
SUSPECT = FAILING | {PairStatus.WARNING.value}
PRECISION = "precision loss"


@dataclass
class Pending:
    """One matched record pair with a suspect row, and what phase 1 measured about it."""

    bench: Entry
    target: Entry
    rows: list[CompareRow]
    inputs: list[tuple[str, Any, str, float | None]]  # (name, target meta, status, statistics error)
    local: dict[int, LocalError] = field(default_factory=dict)  # output index -> local error
    precision: dict[int, str] = field(default_factory=dict)  # output index -> consistent step
    reduce: dict[int, int] = field(default_factory=dict)  # output index -> reduction length
    outlier: dict[int, str] = field(default_factory=dict)  # output index -> why far above its kind
    input_errors: dict[str, float] = field(default_factory=dict)  # input name -> accumulated_err (data)
    argument: dict[int, str | None] = field(default_factory=dict)  # output index -> a differing argument


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
    if k is None or k >= len(p.target.outputs) or not is_multi_tensor(p.target.op):
        return p.inputs
    _, dot, item = p.target.outputs[k][0].partition(".")
    if not dot:
        return p.inputs
    return [i for i in p.inputs if "." not in i[0] or i[0].rsplit(".", 1)[1] == item]


def input_error(p: Pending, k: int | None = None) -> float | None:
    """The largest statistics error among the disagreeing inputs of ``p`` (of its output ``k``:
    row_inputs) (None: they all agree, or none was judged on statistics): what they carry in."""
    return max((e for _, _, s, e in row_inputs(p, k)
                if e is not None and s not in (PairStatus.PASS.value, PairStatus.SKIP.value)), default=None)


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
    r.culprit_target_seq = None
    r.note = "; ".join(x for x in (r.note, f"precision loss: {why}") if x)
