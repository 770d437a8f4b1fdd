"""CompareRows from a RowPlan: naming fields, statistics verdicts, then the pairs left to PairComparer.

Why: rows are made as columns (one shared object per distinct value) and turned into CompareRows
a chunk at a time, so the per-row columns of a million rows never exist at once.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..dump.columns import KINDS
from ..dump.model import UNWRITTEN, unwritten
from ..dump.reader import no_cyclic_gc
from ..numerics.rules import Rules
from .entry_table import CHUNK, EntryTable, Vocab, gather, objects, take
from .pair_judge import dtype_note, same_layout, stand_in_of
from .result import CompareRow, PairStatus
from .row_plan import RowPlan
from .sample_verdicts import judge_samples, sample_decides, sample_note, worse_of
from .stat_verdicts import judge_stats

_FIELDS = CompareRow.__dataclass_fields__


def make_rows(rank: str, ta: EntryTable, tb: EntryTable, plan: RowPlan, fast: np.ndarray, tols: dict, rules: Rules,
              vocab: Vocab) -> list[CompareRow]:
    """Every row, named; those in ``fast`` judged from statistics. Chunk by chunk, so the
    per-row columns never exist for all rows at once."""
    rows: list[CompareRow] = [None] * len(plan)  # type: ignore[list-item]  # filled below, never regrown
    with no_cyclic_gc():  # a million acyclic rows: the collector would walk them again and again
        for lo in range(0, len(plan), CHUNK):
            sl = slice(lo, min(lo + CHUNK, len(plan)))
            cols = _row_columns(rank, ta, tb, plan, sl, vocab)
            at = np.flatnonzero(fast[sl])
            _stats_columns(ta, tb, plan.ao[sl][at], plan.bo[sl][at], plan.b[sl][at], at, tols, rules, vocab, cols)
            rows[sl] = _build_rows(cols, sl.stop - sl.start)
    return rows


def _row_columns(rank: str, ta: EntryTable, tb: EntryTable, plan: RowPlan, sl: slice, vocab: Vocab) -> dict:
    """Every CompareRow field that names rows ``sl`` of the plan (the entries' names,
    ops, sequence numbers, shapes and dtypes)."""
    cat, a, b, ao, bo = plan.cat[sl], plan.a[sl], plan.b[sl], plan.ao[sl], plan.bo[sl]
    pair, bench_only = cat == 2, cat == 1
    on_a = pair | bench_only  # rows whose kind and module are the bench entry's
    kinds = np.array(KINDS, dtype=object)
    note, status = objects(len(cat), ""), objects(len(cat), "")
    one_sided = pair & ((ao < 0) | (bo < 0))
    note[one_sided] = "output present on one side only"
    note[cat == 0] = "only in target"
    note[bench_only] = "only in bench"
    status[~pair | one_sided] = PairStatus.UNMATCHED.value

    def shown(outs: np.ndarray, lut: np.ndarray, codes: np.ndarray) -> np.ndarray:
        return take(lut, gather(codes, outs, -1), "")

    kind = np.where(on_a, gather(ta.kind, a, 0), gather(tb.kind, b, 0))

    return {
        "rank": rank, "index": list(range(sl.start, sl.stop)), "status": status, "note": note,
        "bench_name": take(ta.names, a, ""), "target_name": take(tb.names, b, ""),
        "kind": kinds[kind],
        "module": np.where(on_a, take(ta.path_text, a, ""), take(tb.path_text, b, "")),
        "bench_op": take(ta.op_text, a, ""), "target_op": take(tb.op_text, b, ""),
        "tensor": np.where(ao >= 0, take(ta.out_name, ao, ""), take(tb.out_name, bo, "")),
        "bench_seq": take(ta.seq_value, a, None), "target_seq": take(tb.seq_value, b, None),
        "bench_shape": shown(ao, vocab.shape_text, ta.out_shape), "target_shape": shown(bo, vocab.shape_text, tb.out_shape),
        "bench_dtype": shown(ao, vocab.dtype, ta.out_dtype), "target_dtype": shown(bo, vocab.dtype, tb.out_dtype),
    }


def _stats_columns(ta: EntryTable, tb: EntryTable, ao: np.ndarray, bo: np.ndarray, eb: np.ndarray, at: np.ndarray,
                   tols: dict, rules: Rules, vocab: Vocab, cols: dict[str, Any]) -> None:
    """Judge the output pairs (``ao``, ``bo``; ``eb``: the target entries) from their statistics
    and samples into rows ``at`` of ``cols``."""
    width = len(vocab.dtype)
    kinds, inv = np.unique(ta.out_dtype[ao].astype(np.int64) * width + tb.out_dtype[bo], return_inverse=True)
    pairs = [divmod(k, width) for k in kinds.tolist()]
    tol = [tols[pair] for pair in pairs]
    inv = inv.reshape(-1)
    rtol_of = np.empty(len(tol), dtype=object)  # shared float objects: one per dtype pair
    atol_of = np.empty(len(tol), dtype=object)
    rtol_of[:], atol_of[:] = [x.rtol for x in tol], [x.atol for x in tol]
    keys = ("absent", "min", "max", "mean", "std", "nan", "inf")
    b = {k: ta.stat(k, ao) for k in keys}
    t = {k: tb.stat(k, bo) for k in keys}
    rtol, atol = rtol_of[inv].astype(np.float64), atol_of[inv].astype(np.float64)
    tiny = np.array([x.tiny for x in tol], dtype=np.float64)[inv]
    stand_in = np.array([stand_in_of(vocab.dtype[db], vocab.dtype[dt]) for db, dt in pairs], dtype=np.float64)[inv]
    judged = judge_stats(b, t, rtol, atol, rules, stand_in, tiny)
    sample = judge_samples(ta, tb, ao, bo, b, t, rtol, atol, rules, stand_in, tiny)
    status, stats_err, decided = worse_of(judged, sample, sample_decides(tb, eb))

    def put(name: str, values: np.ndarray) -> None:
        col = cols.get(name)
        if not isinstance(col, np.ndarray):
            col = cols[name] = objects(len(cols["status"]), _FIELDS[name].default)
        col[at] = values

    if sample is not None:
        put("sample_err", np.where(sample["judged"], sample["sample_err"].astype(object), None))
    put("status", status)
    put("mode", "stats")
    put("stats_err", stats_err)
    put("numel", vocab.numel[ta.out_shape[ao]])
    put("bench_nan", b["nan"])
    put("target_nan", t["nan"])
    put("bench_inf", b["inf"])
    put("target_inf", t["inf"])
    put("rtol", rtol_of[inv])
    put("atol", atol_of[inv])
    if any(db != dt for db, dt in pairs):  # mixed dtypes carry PairComparer.compare's note
        note_of = np.array([dtype_note(vocab.dtype[db], vocab.dtype[dt]) if db != dt else "" for db, dt in pairs],
                           dtype=object)
        put("note", note_of[inv])
    if decided.any():  # a few rows: their notes are built one by one
        notes = cols["note"] if isinstance(cols.get("note"), np.ndarray) else objects(len(cols["status"]), "")
        k = sample["not_close"]
        for i in np.flatnonzero(decided).tolist():
            n = int(ta.columns.sample_n[ta.out[ao[i]]])
            text = sample_note(int(sample["verdict"][i]), int(k[i]), n)
            notes[at[i]] = f"{notes[at[i]]}; {text}" if notes[at[i]] else text
        cols["note"] = notes


def judge_the_rest(ta: EntryTable, tb: EntryTable, plan: RowPlan, fast: np.ndarray, rows: list[CompareRow],
                   comparer: Any, random_of: dict[int, str], refs: Callable[[int, int], Any] | None) -> list[int]:
    """The output pairs the statistics judge left: judged one by one from their TensorMetas
    (``refs``: the reference run's output for a bench entry and output index). Returns the rows
    skipped as random. An output recorded as uninitialised memory (on either side) is skipped:
    its values are not data (xray/record/unwritten.py)."""
    meta_a, meta_b = ta.source.tensor_meta, tb.source.tensor_meta
    random_rows = []
    for n in np.flatnonzero(~fast & (plan.ao >= 0) & (plan.bo >= 0)).tolist():
        row, a = rows[n], int(plan.a[n])
        bm, tm = meta_a(int(ta.out[plan.ao[n]])), meta_b(int(tb.out[plan.bo[n]]))
        if a in random_of and same_layout(bm, tm):  # random values differ by nature: never a divergence
            row.status, row.note = PairStatus.SKIP.value, f"values not compared: {random_of[a]}"
            random_rows.append(n)
        elif unwritten(bm) or unwritten(tm):
            sides = " and ".join(s for s, m in (("bench", bm), ("target", tm)) if unwritten(m))
            row.status, row.note = PairStatus.SKIP.value, f"{UNWRITTEN} ({sides}): values not compared"
        else:
            ref = None if refs is None else refs(a, int(plan.ao[n] - ta.out_start[a]))
            comparer.compare(row, bm, tm, ref)
    return random_rows


def _build_rows(cols: dict[str, Any], n: int) -> list[CompareRow]:
    """CompareRows from columns (lists, object arrays, or one value for every row)."""
    from itertools import repeat

    args = []
    for name, f in _FIELDS.items():
        col = cols.get(name, f.default)
        if isinstance(col, np.ndarray):
            col = col.tolist()
        elif not isinstance(col, list):
            col = repeat(col, n)
        args.append(col)
    return list(map(CompareRow, *args))
