"""Module state the run itself wrote: a parameter or buffer that differs between the runs is an
origin ("parameter") only where it came in different. A batch norm in training updates its
running statistics in place (``native_batch_norm``'s schema does not say so), an optimizer step
updates its parameters, a cache buffer takes new keys: the recorder keeps their names across
those writes, so a later read of such state differs by what the run computed, not by what it
was given. Told apart by the dumps themselves: both runs held the same values at the state's
first read, and the target's values changed since."""
from __future__ import annotations

from typing import Any, Iterable

_FIELDS = ("min", "max", "mean", "std", "nan", "posinf", "neginf", "numel", "sample")


def first_reads(entries: Iterable[Any]) -> dict[str, Any]:
    """Each parameter's and buffer's TensorMeta at its first read in a run (``entries`` in
    execution order), by its source (``"buffer:bn.running_mean"``)."""
    firsts: dict[str, Any] = {}
    for e in entries:
        record = getattr(e, "record", e)
        for meta in _tensor_inputs(getattr(record, "inputs", {}) or {}):
            src = getattr(meta, "source", None)
            if isinstance(src, str) and src.startswith(("param:", "buffer:")) and src not in firsts:
                firsts[src] = meta
    return firsts


def _tensor_inputs(inputs: dict) -> Iterable[Any]:
    for v in inputs.values():
        for m in (v if isinstance(v, (list, tuple)) else (v,)):
            if hasattr(m, "stats") and hasattr(m, "source"):
                yield m


def same_values(a: Any, b: Any) -> bool:
    """Whether two reads hold the same values, as far as their records tell: shape, dtype,
    every statistic and the sample, bit for bit."""
    sa, sb = getattr(a, "stats", None), getattr(b, "stats", None)
    if sa is None or sb is None or tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return False
    return all(getattr(sa, f, None) == getattr(sb, f, None) for f in _FIELDS)


def written_by_the_run(meta: Any, bench_first: dict[str, Any], target_first: dict[str, Any]) -> bool:
    """Whether the target's read ``meta`` of a parameter or buffer shows state the run wrote
    since its first read, where both runs held the same values."""
    src = getattr(meta, "source", None)
    b, t = bench_first.get(src), target_first.get(src)
    return b is not None and t is not None and t is not meta and same_values(b, t) and not same_values(t, meta)
