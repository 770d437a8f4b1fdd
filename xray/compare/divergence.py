"""Where the target starts to differ: the first divergence among a rank's judged rows."""
from __future__ import annotations

from .result import CompareRow, PairStatus


def first_divergence(rows: list[CompareRow]) -> CompareRow | None:
    """The earliest born failing row, or row inherited from a call with no matched record (de-dup
    folded it: ``culprit_target_seq``, the error entered there); else the earliest failing row.

    Module-level dumps record a module when it is entered, before its children: when the picked
    row is a module and a born failing row inside it follows (a child module, or an ATen op
    recorded inside it with dump_torch_api), the error is born in that child: the innermost wins.
    """
    failing = [r for r in rows if r.status in (PairStatus.FAIL.value, PairStatus.NAN_INF.value)]
    born = [r for r in failing if r.origin == "born" or r.culprit_target_seq is not None]
    if not born:
        return failing[0] if failing else None
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
