"""xray-compare: diff two dumps, with fuzzy matching and first-divergence localisation.

    from xray.compare import compare_dumps
    result = compare_dumps("bench_dump/", "target_dump/")
    result.summary.first_divergence   # where the target starts to differ, born there

Works on any dump ``xray.load_dump`` reads (tracer folders, module-level .h5), single or
multi-rank. Rules, statuses and CSV columns: docs/compare.md.
"""
from __future__ import annotations

import os
import time
from typing import Any

from .result import COLUMNS, CompareResult, Row, Status, Summary
from .thresholds import Rules, Tolerance, default_tolerance

__all__ = ["compare_dumps", "CompareResult", "CompareInputError", "Row", "Status", "Summary", "Rules",
           "Tolerance", "default_tolerance", "COLUMNS"]


def compare_dumps(bench: str | os.PathLike, target: str | os.PathLike, *, rules: Rules | None = None,
                  reference: str | os.PathLike | None = None, progress: bool | None = None,
                  threads: int | None = 1) -> CompareResult:
    """Compare ``target`` against the trusted ``bench``.

    Either side may be a trace folder, its dump.json, a module-level .h5, or a folder of
    ``rank_<r>`` dumps (paired by rank). ``reference`` is an optional float64 run of the bench
    used for torch._dynamo's rule. ``threads`` caps torch's intra-op threads while comparing
    (None keeps torch's setting): compare's ops are memory-bound chunks of a few MiB, where one
    thread is as fast as two on an idle machine and far faster on a busy one (OpenMP barriers).
    Raises CompareInputError when the inputs are unusable.
    """
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(max(1, min(threads, previous)))
    try:
        return _compare(bench, target, rules, reference, progress)
    finally:
        torch.set_num_threads(previous)


def _compare(bench, target, rules: Rules | None, reference, progress: bool | None) -> CompareResult:
    from .engine import compare_loaded, first_divergence
    from .pairing import CompareInputError, check_same_format, open_dump, pair_units

    rules = rules or Rules()
    started = time.perf_counter()
    units, notes = pair_units(bench, target)
    ref_units = dict((label, rp) for label, rp, _ in pair_units(reference, reference)[0]) if reference else {}
    summary = Summary(bench=str(bench), target=str(target), warnings=list(notes))
    rows: list[Row] = []
    for label, pb, pt in units:
        db = open_dump(pb, "bench", summary.warnings)
        dt = open_dump(pt, "target", summary.warnings)
        check_same_format(db, dt, pb, pt, summary.warnings)
        dr = None
        if reference:
            rp = ref_units.get(label) or (next(iter(ref_units.values())) if len(ref_units) == 1 else None)
            dr = open_dump(rp, "reference", summary.warnings) if rp else None
        try:
            rank_rows, totals = compare_loaded(db, dt, rules, rank=label, reference=dr, progress=progress)
        finally:
            for d in (db, dt, dr):
                close = getattr(d, "close", None)
                if callable(close):
                    close()
        if totals["bench_records"] == 0 or totals["target_records"] == 0:
            empty = pb if totals["bench_records"] == 0 else pt
            raise CompareInputError(f"{empty}: no record with an output tensor to compare "
                                    "(dump with X_DEBUG META|STATS, the default 0x102)")
        _nonfinite_warnings(rank_rows, label, summary.warnings)
        fd = first_divergence(rank_rows)
        summary.ranks[label] = dict(totals, first_divergence=_divergence(fd))
        rows += rank_rows
        for k in ("bench_records", "target_records", "matched", "bytes_compared"):
            setattr(summary, k, getattr(summary, k) + totals[k])
    _count(summary, rows)
    fd = first_divergence(rows)  # rows are grouped by rank in rank order: the lowest rank's first
    summary.first_divergence = _divergence(fd)
    summary.seconds = round(time.perf_counter() - started, 3)
    return CompareResult(rows, summary)


def __getattr__(name: str):  # PEP 562: the CLI's --help must not pay for torch and h5py
    if name == "CompareInputError":
        from .pairing import CompareInputError

        return CompareInputError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _count(s: Summary, rows: list[Row]) -> None:
    s.rows = len(rows)
    by = {st: 0 for st in Status}
    for r in rows:
        by[Status(r.status)] += 1
    s.passed, s.warned, s.failed = by[Status.PASS], by[Status.WARNING], by[Status.FAIL]
    s.nan_inf, s.skipped, s.unmatched = by[Status.NAN_INF], by[Status.SKIP], by[Status.UNMATCHED]
    s.unmatched_bench = s.bench_records - s.matched
    s.unmatched_target = s.target_records - s.matched
    s.match_pct = round(100.0 * s.matched / max(s.bench_records, s.target_records, 1), 3)


def _divergence(r: Row | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {"rank": r.rank, "index": r.index, "status": r.status, "origin": r.origin or "unknown",
            "bench": r.bench_name, "target": r.target_name, "bench_seq": r.bench_seq, "target_seq": r.target_seq,
            "op": r.bench_op, "target_op": r.target_op, "tensor": r.tensor, "cosine": r.cosine,
            "max_abs_err": r.max_abs_err, "layout": r.layout or None}


def _nonfinite_warnings(rows: list[Row], label: str, notes: list[str]) -> None:
    where = f" ({label})" if label else ""
    for side in ("bench", "target"):
        counted = [r for r in rows if r.numel and getattr(r, f"{side}_nan") is not None]
        if counted and all((getattr(r, f"{side}_nan") or 0) + (getattr(r, f"{side}_inf") or 0) >= r.numel
                           for r in counted):
            notes.append(f"{side}{where}: every compared tensor is entirely NaN/Inf; the run itself is broken")
