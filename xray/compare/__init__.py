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
from typing import TYPE_CHECKING, Any

from .result import ATTRIBUTED, COMPARE_COLUMNS, RANDOM_DRAWS, CompareResult, CompareRow, PairStatus, Summary
from .verdict import settle_verdict

if TYPE_CHECKING:
    from ..numerics.rules import Rules

__all__ = ["compare_dumps", "CompareResult", "CompareInputError", "CompareRow", "PairStatus", "Summary", "Rules",
           "Tolerance", "default_tolerance", "COMPARE_COLUMNS"]


def compare_dumps(bench: str | os.PathLike, target: str | os.PathLike, *, rules: Rules | None = None,
                  reference: str | os.PathLike | None = None, progress: bool | None = None,
                  threads: int | None = 1, statistics_only: bool = False, ignore_step: bool = False,
                  attribute_first: int | None = ATTRIBUTED) -> CompareResult:
    """Compare ``target`` against the trusted ``bench``.

    Either side may be a trace folder, its dump.json, a module-level .h5, or a folder of
    ``rank_<r>`` dumps (paired by rank). ``reference`` is an optional float64 run of the bench
    used for torch._dynamo's rule. ``threads`` caps torch's intra-op threads while comparing
    (None keeps torch's setting): compare's ops are memory-bound chunks of a few MiB, where one
    thread is as fast as two on an idle machine and far faster on a busy one (OpenMP barriers).
    ``statistics_only`` judges every pair on its statistics, as if no tensor had been saved:
    what a statistics-only recording of the same runs would be told, without reading the data.
    ``ignore_step`` pairs the two dumps' steps in order whatever their numbers (a run dumped at
    step 0 against one dumped at step 3); records otherwise pair only within one step.
    ``attribute_first``: failing rows of a rank attributed (origin, cause, culprit), the earliest
    in execution order first; later ones keep status and metrics, noted as not attributed (None:
    every row, slower where most rows fail; the verdict is the same: attribution_bound.py).
    Raises CompareInputError when the inputs are unusable.
    """
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(max(1, min(threads, previous)))
    try:
        return _compare(bench, target, rules, reference, progress, statistics_only, ignore_step, attribute_first)
    finally:
        torch.set_num_threads(previous)


def _compare(bench, target, rules: Rules | None, reference, progress: bool | None,
             statistics_only: bool = False, ignore_step: bool = False,
             attribute_first: int | None = ATTRIBUTED) -> CompareResult:
    from ..numerics.rules import Rules
    from .divergence import first_divergence
    from .engine import compare_loaded
    from .stopped import stopped_at
    from .implementations import optimizer_note
    from .sync_points import SyncPoint, divergence_order, sync_point
    from .pairing import CompareInputError, check_same_format, open_dump, pair_units

    rules = rules or Rules()
    started = time.perf_counter()
    sharded = _sharded_side(bench, target)
    units, notes = ([("", bench, target)], []) if sharded else pair_units(bench, target)
    ref_units = dict((label, rp) for label, rp, _ in pair_units(reference, reference)[0]) if reference else {}
    summary = Summary(bench=str(bench), target=str(target), warnings=list(notes))
    rows: list[CompareRow] = []
    for label, pb, pt in units:
        if sharded:  # one side a single-device run, the other a sharded one: rebuilt as one run
            db, dt = _open_unsharded(pb, pt, sharded, summary.warnings)
        else:
            db = open_dump(pb, "bench", summary.warnings)
            dt = open_dump(pt, "target", summary.warnings)
        check_same_format(db, dt, pb, pt, summary.warnings)
        for side, d in (("bench", db), ("target", dt)):
            hidden = dedup_note(d, side + (f" ({label})" if label else ""))
            if hidden:
                summary.dedup.append(hidden)
            halt = stopped_at(d)
            if halt:
                summary.stopped.append(f"{side}{f' ({label})' if label else ''}: {halt}")
            unseen = unrecorded_backward(d)
            if unseen:
                summary.unrecorded_backward.append(f"{side}{f' ({label})' if label else ''}: {unseen} calls")
        dr = None
        if reference:
            rp = ref_units.get(label) or (next(iter(ref_units.values())) if len(ref_units) == 1 else None)
            dr = open_dump(rp, "reference", summary.warnings) if rp else None
        (collectives, folded), first_seq = _collectives(dt), _first_seq(dt)
        steps = (_steps(db), _steps(dt))
        if folded:
            where = f" ({label})" if label else ""
            summary.warnings.append(f"target{where}: X_DEDUP folded {folded} collective calls into earlier records; "
                                    "the rank order counts records, not calls: record with X_DEDUP=0")
        try:
            rank_rows, totals = compare_loaded(db, dt, rules, rank=label, reference=dr, progress=progress,
                                               statistics_only=statistics_only, ignore_step=ignore_step,
                                               attributed=attribute_first)
            if sharded:
                from .unshard import blame_ranks

                run, single = (dt, db) if sharded == "target" else (db, dt)
                if not statistics_only:
                    blame_ranks(rank_rows, run, single, side=sharded)
        finally:
            for d in (db, dt, dr):
                close = getattr(d, "close", None)
                if callable(close):
                    close()
            # let the pair's index go before the next pair's (a 1M-record one is 400 MB a side)
            db = dt = dr = d = None
        if totals["bench_records"] == 0 or totals["target_records"] == 0:
            empty = pb if totals["bench_records"] == 0 else pt
            raise CompareInputError(f"{empty}: no record with an output tensor to compare "
                                    "(dump with X_DEBUG META|STATS, the default 0x102)")
        _nonfinite_warnings(rank_rows, label, summary.warnings)
        if totals.get("unattributed"):
            summary.warnings.append(_unattributed_note(totals["unattributed"], attribute_first, label))
        _step_notes(steps, totals, label, pb, pt, summary.warnings, ignore_step)
        _data_warnings(rank_rows, totals, label, pb, pt, summary.warnings)
        step = optimizer_note(rank_rows, label)
        if step:
            summary.warnings.append(step)
        fd = first_divergence(rank_rows)
        sync = sync_point(collectives, _seq(fd), first_seq) if fd else None
        summary.ranks[label] = dict(totals, first_divergence=_divergence(fd), sync=sync and sync.to_json())
        rows += rank_rows
        for k in ("bench_records", "target_records", "matched", "bytes_compared"):
            setattr(summary, k, getattr(summary, k) + totals[k])
    _count(summary, rows)
    _cross_rank(bench if sharded == "bench" else target, units, summary, sharded=bool(sharded))
    # Ranks share no clock but their collectives: the first rank is the one that diverged before the fewest.
    summary.divergence_order = divergence_order({label: SyncPoint(**r["sync"]) for label, r in summary.ranks.items()
                                                 if r["sync"]})
    if summary.divergence_order:
        summary.first_divergence = summary.ranks[summary.divergence_order[0]]["first_divergence"]
    settle_verdict(summary)
    summary.seconds = round(time.perf_counter() - started, 3)
    return CompareResult(rows, summary)


def __getattr__(name: str):  # PEP 562: the CLI's --help must not pay for torch and h5py
    if name == "CompareInputError":
        from .pairing import CompareInputError

        return CompareInputError
    if name in ("Rules", "Tolerance", "default_tolerance"):
        from ..numerics import rules

        return getattr(rules, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _count(s: Summary, rows: list[CompareRow]) -> None:
    s.rows = len(rows)
    by = {st: 0 for st in PairStatus}
    s.random_draws = 0
    for r in rows:
        by[PairStatus(r.status)] += 1
        if r.status == PairStatus.SKIP.value and RANDOM_DRAWS in r.note:
            s.random_draws += 1
    s.passed, s.warned, s.failed = by[PairStatus.PASS], by[PairStatus.WARNING], by[PairStatus.FAIL]
    s.nan_inf, s.skipped, s.unmatched = by[PairStatus.NAN_INF], by[PairStatus.SKIP], by[PairStatus.UNMATCHED]
    s.unmatched_bench = s.bench_records - s.matched
    s.unmatched_target = s.target_records - s.matched
    s.match_pct = match_pct(s.matched, s.bench_records, s.target_records)


def match_pct(matched: int, bench_records: int, target_records: int) -> float:
    return round(100.0 * matched / max(bench_records, target_records, 1), 3)


def _seq(r: CompareRow) -> int:
    """The row's place on its rank: the target's seq (the run that diverged), else the bench's."""
    return r.target_seq if r.target_seq is not None else r.bench_seq if r.bench_seq is not None else r.index


def _divergence(r: CompareRow | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {"rank": r.rank, "index": r.index, "status": r.status, "origin": r.origin or "unknown",
            "bench": r.bench_name, "target": r.target_name, "bench_seq": r.bench_seq, "target_seq": r.target_seq,
            "op": r.bench_op, "target_op": r.target_op, "tensor": r.tensor, "cosine": r.cosine,
            "max_abs_err": r.max_abs_err, "layout": r.layout or None, "module": r.module,
            "cause": r.cause or None, "culprit": r.culprit or None, "culprit_target_seq": r.culprit_target_seq,
            "culprit_bench_seq": r.culprit_bench_seq,
            "local_err": r.local_err, "local_floor": r.local_floor, "accumulated_err": r.accumulated_err}


def _sharded_side(bench, target) -> str | None:
    """"target" (or "bench") when that side is a folder of rank dumps and the other one dump: a
    sharded run against a single-device run (unshard.py); None otherwise."""
    from .pairing import dump_units
    from .unshard import rank_dumps

    try:
        nb, nt = len(dump_units(bench)), len(dump_units(target))
    except ValueError:
        return None  # pair_units says what is wrong
    if nb == 1 and nt > 1 and rank_dumps(target):
        return "target"
    if nt == 1 and nb > 1 and rank_dumps(bench):
        return "bench"
    return None


def _open_unsharded(pb, pt, sharded: str, notes: list[str]):
    """(bench, target) opened, the sharded side rebuilt as one run against the other."""
    from .pairing import CompareInputError, dump_units, open_dump
    from .unshard import UnshardError, UnshardedRun

    single_path, folder = (pb, pt) if sharded == "target" else (pt, pb)
    single_side = "bench" if sharded == "target" else "target"
    single = open_dump(next(iter(dump_units(single_path).values())), single_side, notes)
    try:
        run = UnshardedRun(folder, guide=single)
    except UnshardError as e:
        raise CompareInputError(str(e)) from None
    notes += [f"{sharded}: {n}" for n in run.found.notes]
    notes.append(f"{sharded}: {len(run.labels)} ranks of a sharded run rebuilt into one run "
                 f"({', '.join(run.labels)}) to compare with the single-device {single_side}")
    return (single, run) if sharded == "target" else (run, single)


def _cross_rank(target, units: list, summary: Summary, sharded: bool = False) -> None:
    """A multi-rank target (or the sharded side against a single run) checked within itself: what
    must agree across its ranks does (cross_rank.py); a disagreement goes into the summary and the
    verdict."""
    from .pairing import global_rank

    if not sharded and (len(units) < 2 or not all(global_rank(label) is not None for label, _, _ in units)):
        return
    from .cross_rank import check_ranks

    try:
        report = check_ranks(target)
    except Exception as e:  # noqa: BLE001 - the compare itself stands; say the check could not run
        summary.warnings.append(f"target: cross-rank check not run ({type(e).__name__}: {str(e)[:200]})")
        return
    summary.cross_rank = [f"target: {f.line()}" for f in report.findings[:20]]


def unrecorded_backward(dump) -> int:
    """How many backward calls ran under the recorder without a record (X_DEBUG without
    BACKWARD; dump.json ``summary.unrecorded``, docs/format.md): 0 when none or not said."""
    summary = getattr(dump, "summary", None)
    try:
        return int(((summary or {}).get("unrecorded") or {}).get("backward_calls") or 0)
    except (TypeError, ValueError, AttributeError):
        return 0


def dedup_note(dump, side: str) -> str | None:
    """What a de-duplicated dump hides, or None where it folded no call (it then holds every
    call, as X_DEDUP=0 would). De-duplication (X_DEDUP, the recorder's default) keeps a record
    per call of each signature per module in the pass that first makes it, and two across
    passes (by signature alone before stop 42): later calls of it there are not recorded."""
    n_records, folded = _folded(dump)
    if not folded:
        return None
    config = (getattr(dump, "header", None) or {}).get("config") or {}
    where = "in its module " if config.get("dedup_scope") == "module" else ""
    return (f"{side} dump is DE-DUPLICATED (X_DEDUP=1): {n_records} records stand for {n_records + folded} calls; "
            f"{folded} later calls of a signature already seen {where}were not recorded, so an error born in one of "
            "them is found only where a recorded call carries it, and the first divergence may be late or missing. "
            "Record with X_DEDUP=0")


def _columns(dump):
    """The dump's columns when its records are built from them (format v3), else None: facts
    about every record are then read from arrays, not from a million Records."""
    from ..dump.column_scan import native_columns

    return native_columns(dump)


def _folded(dump) -> tuple[int, int]:
    """(records, calls folded into them by de-duplication)."""
    cols = _columns(dump)
    if cols is not None:
        counts = cols.records["count"]
        return len(counts), int((counts - 1).clip(min=0).sum())
    records = list(getattr(dump, "records", []))
    return len(records), sum(max(0, r.count - 1) for r in records)


def _first_seq(dump) -> int:
    cols = _columns(dump)
    if cols is not None:
        return int(cols.records["seq"].min()) if len(cols.records) else 0
    return min((r.seq for r in dump.records), default=0)


def _steps(dump) -> list[int | None]:
    """The steps the dump's records belong to, in order (None: a dump that numbers none)."""
    cols = _columns(dump)
    if cols is not None:
        import numpy as np

        return [None if s < 0 else s for s in np.unique(cols.records["step"]).tolist()]
    return sorted({r.step for r in dump.records}, key=lambda s: -1 if s is None else s)


def _step_text(steps: list[int | None]) -> str:
    shown = ", ".join("none" if s is None else str(s) for s in steps[:5])
    return ("step " if len(steps) == 1 else "steps ") + shown + (f" ... ({len(steps)} steps)" if len(steps) > 5 else "")


def _step_notes(steps: tuple[list, list], totals: dict, label: str, pb, pt, notes: list[str],
                ignore_step: bool) -> None:
    """Records pair only within one step: say so where the two dumps hold other steps (the
    reason nothing matched, when nothing did), and what pairs them anyway."""
    from .pairing import CompareInputError

    (sb, st), where = steps, f" ({label})" if label else ""
    if ignore_step or not sb or not st or sb == st:
        return
    why = (f"bench is {_step_text(sb)}, target {_step_text(st)}: records pair only within one step; "
           "pass --ignore-step (compare_dumps(..., ignore_step=True)) to pair the steps in order")
    if totals["matched"] == 0:
        raise CompareInputError(f"{pb} vs {pt}{where}: none of {totals['bench_records']} bench and "
                                f"{totals['target_records']} target records could be matched: {why}")
    notes.append(f"steps differ{where}: {why}")


def _collectives(dump) -> tuple[list[int], int]:
    """sync_points.collective_seqs, on the columns when there are some."""
    from .sync_points import collective_seqs, is_collective

    cols = _columns(dump)
    if cols is None:
        return collective_seqs(dump.records)
    import numpy as np

    ops = cols.records["op"]
    wanted = [int(i) for i in np.unique(ops).tolist() if is_collective(cols.strings[int(i)])]
    rows = cols.records[np.isin(ops, wanted)]
    return sorted(rows["seq"].tolist()), int((rows["count"] - 1).clip(min=0).sum())


def _data_warnings(rows: list[CompareRow], totals: dict, label: str, pb, pt, notes: list[str]) -> None:
    """Say what could not be compared as recorded; refuse when nothing could be compared at all
    (a summary of 'no divergence' over nothing would read as agreement)."""
    from .pairing import CompareInputError

    where = f" ({label})" if label else ""
    if totals["matched"] == 0:
        raise CompareInputError(f"{pb} vs {pt}{where}: none of {totals['bench_records']} bench and "
                                f"{totals['target_records']} target records could be matched: not two runs of the same model?")
    matched = [r for r in rows if r.status != PairStatus.UNMATCHED.value]
    if matched and all(r.status == PairStatus.SKIP.value for r in matched):
        raise CompareInputError(f"{pb} vs {pt}{where}: nothing comparable: every matched pair was skipped "
                                f"(first: {matched[0].bench_name}: {matched[0].note})")
    unreadable = [r for r in rows if "tensor data unreadable" in (r.note or "")]
    if unreadable:
        first = unreadable[0]
        notes.append(f"DATA PROBLEM{where}: {len(unreadable)} of {len(matched)} compared pairs had unreadable tensor "
                     f"data and were compared by statistics only; first: {first.bench_name}: {first.note[:300]}")


def _nonfinite_warnings(rows: list[CompareRow], label: str, notes: list[str]) -> None:
    where = f" ({label})" if label else ""
    for side in ("bench", "target"):
        counted = [r for r in rows if r.numel and getattr(r, f"{side}_nan") is not None]
        if counted and all((getattr(r, f"{side}_nan") or 0) + (getattr(r, f"{side}_inf") or 0) >= r.numel
                           for r in counted):
            notes.append(f"{side}{where}: every compared tensor is entirely NaN/Inf; the run itself is broken")


def _unattributed_note(left: int, first: int, label: str) -> str:
    where = f" ({label})" if label else ""
    return (f"target{where}: attribution ran for the first {first} failing rows in execution order; {left} later "
            "failing rows keep status and metrics, with origin and cause left empty: pass --attribute-all "
            "(compare_dumps(..., attribute_first=None)) to attribute every row")
