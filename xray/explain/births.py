"""Where the first Inf/NaN the bench does not have is born, and which modules made its inputs.

A graft casts the bench's value to the target's dtype, so a value that dtype cannot hold (an
fp16 overflow) is Inf again when grafted: every graft then leaves an Inf, every share is 0, and
grafts cannot rank. The birth can: compare marks each matched call whose output is NaN/Inf where
the other side's is finite (status ``nan/inf``), and the first of them in the target's order is
where the overflow happens. Its inputs' producers, read from the dump's sources (``op:SEQ:K``),
name the module whose output the overflowing op consumed: the island that keeps that output in
float32 when the overflow is in the parent's own code between two submodules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .ops import OpCall

NAN_INF = "nan/inf"  # compare's status (compare.result.Status.NAN_INF)
# How many ops of the born call's own module are walked back through to reach another module's.
MAX_WALK = 64


@dataclass
class Birth:
    call: OpCall  #: compare's row of the first call whose output is Inf/NaN where the bench's is not
    module: str  #: the module it runs in ("" for the model's own forward)
    producers: list[str] = field(default_factory=list)  #: modules whose ops made its floating inputs


def first_nonfinite(calls: list[OpCall]) -> OpCall | None:
    """The first call, in the target's order, that compare finds NaN/Inf against a finite bench."""
    return min((c for c in calls if c.status == NAN_INF), key=lambda c: c.target_seq, default=None)


def birth(calls: list[OpCall], target_dump: Path) -> Birth | None:
    """The first non-finite call and the modules that produced its inputs (nearest first)."""
    from ..dump import load_dump

    call = first_nonfinite(calls)
    if call is None:
        return None
    with load_dump(target_dump) as dump:
        records = {r.seq: r for r in dump.records if r.kind == "op"}
    born = records.get(call.target_seq)
    module = born.module if born is not None and born.module is not None else _module(call.module)
    return Birth(call, module, producers(records, call.target_seq, module))


def producers(records: dict, seq: int, module: str) -> list[str]:
    """The modules outside ``module``'s own code whose ops made the floating inputs of call
    ``seq``: ops of ``module`` itself (a cast, a transpose) are walked through."""
    found: list[str] = []
    todo, seen = [seq], set()
    while todo and len(seen) < MAX_WALK:
        rec = records.get(todo.pop(0))
        if rec is None or rec.seq in seen:
            continue
        seen.add(rec.seq)
        for source in _sources(rec):
            src = records.get(source)
            if src is None:
                continue
            if (src.module or "") == module:
                todo.append(src.seq)
            elif src.module and src.module not in found:
                found.append(src.module)
    return found


def _sources(rec) -> list[int]:
    """The seqs of the op calls whose outputs are ``rec``'s floating tensor inputs."""
    out = []
    for meta in rec.inputs.values():
        for m in meta if isinstance(meta, list) else [meta]:
            source = getattr(m, "source", None) or ""
            dtype = getattr(m, "dtype", "")
            if source.startswith("op:") and dtype.startswith(("float", "bfloat")):
                out.append(int(source.split(":")[1]))
    return out


def _module(name: str) -> str:
    return "" if name == "<root>" else name
