"""Judge one tensor pair: saved data chunk by chunk, else statistics; the tolerances of a dtype pair.

Backend-agnostic: it sees only TensorMetas, and reads tensor data through the dump's own reader,
chunk by chunk. The statistics of most pairs are judged in numpy (stat_verdicts.py); the pairs
that judge does not cover, the inputs of suspect pairs (causality.py) and the reference run's
float64 errors come here.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from ..dump.model import TensorMeta
from ..dump.protocol import Dump
from ..dump.tensorio import dtype_from_name
from ..numerics import sample_judge, stats_judge
from ..numerics.metrics import (Partial, Workspace, as_real, chunk_partial, compute_dtype, finish, infinity_stand_in,
                                merge, rmse_partial, stats_rms)
from ..numerics.rules import Rules, Tolerance
from .layout import MAX_NUMEL, could_be_permuted, find_layout
from .op_classes import overwritten_inputs
from .result import CompareRow, PairStatus
from .sample_verdicts import may_decide, sample_note, sample_peak, sample_scale
from .stream import iter_chunks

PROGRESS_BYTES = 256 << 20  # show a progress bar when more tensor data than this is compared


def torch_dtype(name: str) -> torch.dtype | None:
    try:
        return dtype_from_name(name)
    except ValueError:
        return None


def _zip_chunks(a: Iterator[torch.Tensor], b: Iterator[torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs of equally long pieces from two chunk streams whose chunk boundaries may differ."""
    ca = cb = None
    while True:
        if ca is None or ca.numel() == 0:
            ca = next(a, None)
        if cb is None or cb.numel() == 0:
            cb = next(b, None)
        if ca is None or cb is None:
            return
        n = min(ca.numel(), cb.numel())
        yield ca[:n], cb[:n]
        ca, cb = ca[n:], cb[n:]


class PairComparer:
    """Compares tensor pairs of one bench/target dump pair under the given rules."""

    def __init__(self, bench: Any, target: Any, rules: Rules, reference: Any = None,
                 floor: Tolerance | None = None) -> None:
        self.bench, self.target, self.rules, self.reference = bench, target, rules, reference
        self.floor = floor
        self.work = Workspace()
        self.bytes = 0
        self.bar: Any = None  # xray.progress

    def tolerance(self, bm: TensorMeta, tm: TensorMeta) -> Tolerance:
        return dtype_tolerance(self.rules, self.floor, bm.dtype, tm.dtype)

    # -- data ------------------------------------------------------------------------------
    def scale(self, bm: TensorMeta, tm: TensorMeta, stand_in: float | None = None) -> float:
        """The RMS the absolute floor scales with: the larger side's, from statistics when
        recorded, else from one pass over the data. Values that stand for infinity (``stand_in``:
        a mask's ``finfo.min`` fill, which the other side may hold as -Inf) are no magnitude the
        computed values have: where a side's statistics reach them, the pass leaves them out, or a
        1 % error in the scores beside a mask would be judged at 1e38."""
        stats = (bm.stats, tm.stats)
        rb, rt = (stats_rms(st) for st in stats)
        filled = stand_in is not None and any(
            st is not None and max(abs(st.min or 0.0), abs(st.max or 0.0)) >= stand_in for st in stats)
        if rb is not None and rt is not None and math.isfinite(rb) and math.isfinite(rt) and not filled:
            return max(rb, rt)
        out = 0.0
        for dump, meta in ((self.bench, bm), (self.target, tm)):
            ss = n = 0
            for c in iter_chunks(dump, meta):
                c = as_real(c, torch.float64)
                c = c[torch.isfinite(c) & (c.abs() < stand_in)] if filled else c[torch.isfinite(c)]
                ss, n = ss + float(torch.dot(c, c)), n + c.numel()
            out = max(out, math.sqrt(ss / n) if n else 0.0)
        return out if math.isfinite(out) else 0.0

    def data_metrics(self, bm: TensorMeta, tm: TensorMeta, tol: Tolerance):
        bd, td = dtype_from_name(bm.dtype), dtype_from_name(tm.dtype)
        cd = compute_dtype(bd, td)
        stand_in = infinity_stand_in(bd, td)
        floor = tol.floor(self.scale(bm, tm, stand_in))
        total = Partial()
        for a, b in _zip_chunks(iter_chunks(self.bench, bm), iter_chunks(self.target, tm)):
            total = merge(total, chunk_partial(as_real(a, cd), as_real(b, cd), tol, self.work, floor, stand_in))
            nbytes = a.numel() * a.element_size() + b.numel() * b.element_size()
            self.bytes += nbytes
            if self.bar is not None:
                self.bar.update(nbytes)
        return finish(total)

    def ref_errors(self, rm: TensorMeta, bm: TensorMeta, tm: TensorMeta) -> tuple[float, float]:
        """RMSE of bench and of target against the float64 reference (torch._dynamo's rule)."""
        sb = st = 0.0
        nb = nt = 0
        chunks = zip(iter_chunks(self.reference, rm), iter_chunks(self.bench, bm), iter_chunks(self.target, tm))
        for r, b, t in chunks:  # equal shapes (checked by the caller): equal chunk boundaries
            r = as_real(r, torch.float64)
            s, n = rmse_partial(r, as_real(b, torch.float64))
            sb, nb = sb + s, nb + n
            s, n = rmse_partial(r, as_real(t, torch.float64))
            st, nt = st + s, nt + n
        return (sb / nb) ** 0.5 if nb else 0.0, (st / nt) ** 0.5 if nt else 0.0

    def load_whole(self, dump: Dump, meta: TensorMeta) -> torch.Tensor:
        return dump.load_tensor(meta).reshape(meta.shape)

    # -- one output pair --------------------------------------------------------------------
    def compare(self, row: CompareRow, bm: TensorMeta, tm: TensorMeta, ref: TensorMeta | None = None, *,
                layout: bool = True, later: list | None = None) -> CompareRow:
        """Judge one tensor pair into ``row``; ``layout=False`` skips the permutation search.
        ``later``: a pair left to its statistics is added there, judged (and its note set) by
        ``judge_statistics`` with the others: one numpy call for many pairs, not one each."""
        tol = self.tolerance(bm, tm)
        row.rtol, row.atol = tol.rtol, tol.atol
        notes = []
        if bm.dtype != tm.dtype:
            notes.append(dtype_note(bm.dtype, tm.dtype))
        if torch_dtype(bm.dtype) is None or torch_dtype(tm.dtype) is None:
            row.status, row.note = PairStatus.SKIP.value, f"unknown dtype {bm.dtype!r} / {tm.dtype!r}"
            return row
        if bm.numel != tm.numel:
            row.status = PairStatus.FAIL.value
            row.note = f"shape mismatch {tuple(bm.shape)} vs {tuple(tm.shape)} (different element counts)"
            return row
        if tuple(bm.shape) != tuple(tm.shape):
            return self._compare_reshaped(row, bm, tm, tol, notes, layout)
        if bm.numel == 0:
            row.status, row.numel = PairStatus.PASS.value, 0
            row.note = "; ".join(notes + ["empty tensor: nothing to compare"])
            return row
        if torch_dtype(bm.dtype).is_complex != torch_dtype(tm.dtype).is_complex:
            row.status = PairStatus.FAIL.value
            row.note = f"complex vs real dtypes ({bm.dtype} vs {tm.dtype})"
            return row
        if bm.data is not None and tm.data is not None:
            try:
                self._compare_data(row, bm, tm, tol, ref, notes, layout)
                row.note = "; ".join(notes)
                return row
            except (KeyError, OSError, ValueError) as e:
                notes.append(f"tensor data unreadable ({e}); compared statistics")
        if bm.stats is not None and tm.stats is not None:
            if later is not None:
                later.append((row, bm, tm, tol, notes))
                return row
            self.judge_statistics([(row, bm, tm, tol, notes)])
        else:
            row.status = PairStatus.SKIP.value
            notes.append("no saved data or statistics on both sides (dump with X_DEBUG STATS or X_DUMP_NUM)")
        row.note = "; ".join(notes)
        return row

    def _compare_reshaped(self, row: CompareRow, bm, tm, tol: Tolerance, notes: list[str], layout: bool) -> CompareRow:
        """Same element count, different shapes: never compared in memory order as if one tensor.
        A permutation of the bench that gives the target's shape and agrees is a layout change;
        otherwise the pair is reported as a reshape, values not compared."""
        row.status, row.numel = PairStatus.WARNING.value, bm.numel
        found = None
        if layout and bm.data is not None and tm.data is not None and bm.numel <= MAX_NUMEL:
            try:
                found = find_layout(self.load_whole(self.bench, bm), self.load_whole(self.target, tm), tol)
            except (KeyError, OSError, ValueError):
                found = None
        if found:  # the data is right, its layout is not: a layout bug
            row.status, row.layout = PairStatus.FAIL.value, found
            notes.append(f"layout mismatch: target agrees with bench.{found}")
        else:
            row.layout = f"reshape {tuple(bm.shape)} -> {tuple(tm.shape)}"
            notes.append("shapes differ, same element count: reshape-compatible, values not compared "
                         "(memory order is not the same tensor)")
        row.note = "; ".join(notes)
        return row

    def _compare_data(self, row: CompareRow, bm, tm, tol: Tolerance, ref, notes: list[str], layout: bool) -> None:
        m = self.data_metrics(bm, tm, tol)
        row.mode = "data"
        row.rel_rmse = m.rel_rmse
        row.cosine, row.rmse, row.max_abs_err, row.max_rel_err = m.cosine, m.rmse, m.max_abs_err, m.max_rel_err
        row.isclose_pct, row.gt_num, row.numel = m.isclose_pct, m.gt_num, m.numel
        row.bench_nan, row.target_nan, row.bench_inf, row.target_inf = m.nan_bench, m.nan_target, m.inf_bench, m.inf_target
        r = self.rules
        if m.nonfinite_mismatch:
            row.status = PairStatus.NAN_INF.value
            notes.append(f"{m.nonfinite_mismatch} positions NaN/Inf on one side only")
        else:
            row.status = r.judge_data(not_close=m.gt_num, numel=m.numel, max_ratio=m.max_ratio,
                                      rel_rmse=m.rel_rmse, cosine=m.cosine, tol=tol)
        if bm.stats is not None and bm.stats.min is not None and m.max_abs_err is not None:
            peak = max(abs(bm.stats.min), abs(bm.stats.max))
            row.accumulated_err = m.max_abs_err / peak if peak > 0 else (0.0 if m.max_abs_err == 0 else math.inf)
        if m.cosine is None:
            notes.append("all NaN/Inf on both sides")
        if row.status in (PairStatus.WARNING.value, PairStatus.FAIL.value) and ref is not None and ref.data is not None \
                and tuple(ref.shape) == tuple(bm.shape) == tuple(tm.shape):
            eb, et = self.ref_errors(ref, bm, tm)
            row.ref_err_bench, row.ref_err_target = eb, et
            if et <= r.fp64_multiplier * eb + tol.atol / 10:
                row.status = PairStatus.PASS.value
                notes.append(f"within {r.fp64_multiplier:g}x the bench's own float64 error")
        # The norm test is exact only over finite values: with NaN/Inf, search regardless.
        if layout and row.status == PairStatus.FAIL.value and bm.numel <= MAX_NUMEL and (
                m.nan_bench + m.inf_bench or could_be_permuted(m.bench_norm, m.target_norm, m.numel, tol)):
            found = find_layout(self.load_whole(self.bench, bm), self.load_whole(self.target, tm), tol)
            if found:
                row.layout = found
                notes.append(f"layout mismatch: target agrees with bench.{found}")

    def judge_statistics(self, pairs: list[tuple[CompareRow, TensorMeta, TensorMeta, Tolerance, list[str]]]) -> None:
        """Judge (row, bench meta, target meta, tolerance, notes) pairs on their statistics and
        samples into their rows, and set each row's note from its notes: the one rule over arrays
        (numerics/stats_judge.py), whether for one pair or many."""
        if not pairs:
            return
        got = stats_judge.judge(stats_judge.columns_of([bm.stats for _, bm, _, _, _ in pairs]),
                                stats_judge.columns_of([tm.stats for _, _, tm, _, _ in pairs]),
                                np.array([tol.rtol for *_, tol, _ in pairs]),
                                np.array([tol.atol for *_, tol, _ in pairs]), self.rules,
                                np.array([stand_in_of(bm.dtype, tm.dtype) for _, bm, tm, _, _ in pairs]))
        for (row, bm, tm, _, _), code, err in zip(pairs, got["verdict"].tolist(), got["stats_err"].tolist()):
            row.status, row.stats_err = stats_judge.VERDICT_TEXT[code], err
            row.mode, row.numel = "stats", bm.numel
            row.bench_nan, row.target_nan = bm.stats.nan, tm.stats.nan
            row.bench_inf, row.target_inf = bm.stats.inf, tm.stats.inf
        self._judge_samples(pairs)
        for row, _, _, _, notes in pairs:
            row.note = "; ".join(notes)

    def _judge_samples(self, pairs: list[tuple[CompareRow, TensorMeta, TensorMeta, Tolerance, list[str]]]) -> None:
        """The pairs' samples (equal shapes: the same elements), judged as saved data is; a
        sample that fails where the statistics do not decides the row (sample_verdicts.worse_of,
        the columnar path's twin). On an output row, only for an elementwise op or a view, as
        there (``may_decide``); an input pair (no op on the row) is judged on its sample. Pairs
        are judged in groups of one sample length: a padded row would sum in another order."""
        by_length: dict[int, list] = {}
        for pair in pairs:
            b, t = getattr(pair[1], "sample", None), getattr(pair[2], "sample", None)
            if b and t and len(b) == len(t):
                by_length.setdefault(len(b), []).append(pair)
        for group in by_length.values():
            got = sample_judge.judge(
                np.array([bm.sample for _, bm, _, _, _ in group], dtype=np.float64),
                np.array([tm.sample for _, _, tm, _, _ in group], dtype=np.float64),
                np.array([len(bm.sample) for _, bm, _, _, _ in group]), np.array([len(tm.sample) for _, _, tm, _, _ in group]),
                np.array([tol.rtol for *_, tol, _ in group]), np.array([tol.atol for *_, tol, _ in group]),
                np.array([sample_scale(bm.stats, tm.stats) for _, bm, tm, _, _ in group]),
                np.array([sample_peak(bm.stats) for _, bm, _, _, _ in group]), self.rules,
                np.array([stand_in_of(bm.dtype, tm.dtype) for _, bm, tm, _, _ in group]))
            for (row, _, tm, _, notes), code, err, beyond in zip(group, got["verdict"].tolist(),
                                                                 got["sample_err"].tolist(), got["not_close"].tolist()):
                row.sample_err = err
                if row.target_op and not may_decide(row.target_op):  # as sample_verdicts.sample_decides
                    continue
                if code >= sample_judge.FAIL and row.status == PairStatus.PASS.value:  # as sample_verdicts.worse_of
                    row.status = stats_judge.VERDICT_TEXT[code]
                    row.stats_err = float(np.fmax(row.stats_err, err))  # as the columnar path
                    notes.append(sample_note(code, beyond, len(tm.sample)))

    # -- inputs of a failing record -----------------------------------------------------------
    def judge_inputs(self, a: Any, b: Any, errors: dict[str, float] | None = None
                     ) -> list[tuple[str, TensorMeta, str, float | None]]:
        """(name, target meta, status, statistics error) for every input pair of two matched Entries, judged as
        outputs are (saved data first, else statistics), plus module parameters as "param:<name>" (format v2).
        The error is the pair's ``stats_err`` when judged on statistics, else None; ``errors`` gets
        the ``accumulated_err`` of those judged on data, by name."""
        return self.judge_inputs_of([(a, b, errors)])[0]

    def judge_inputs_of(self, pairs: list[tuple[Any, Any, dict[str, float] | None]]
                        ) -> list[list[tuple[str, TensorMeta, str, float | None]]]:
        """``judge_inputs`` of many (bench Entry, target Entry, errors) pairs, the inputs left to
        their statistics judged together (``judge_statistics``)."""
        later: list = []
        judged = []
        for a, b, errors in pairs:
            # an argument the op only writes whole (copy_'s self) is none of its inputs: a bench
            # copy_(buffer, src) reads what the target's _to_copy(self) reads, src
            tb, tt = (_read_inputs(e) for e in (a, b))
            names = [n for n in tt if n in tb]
            sides = [(n, tb[n], tt[n]) for n in names] if names else \
                [(nt, mb, mt) for (nb, mb), (nt, mt) in zip(tb.items(), tt.items())]
            sides += [(f"param:{n}", a.record.params[n], m) for n, m in b.record.params.items() if n in a.record.params]
            judged.append(([(n, tm, self.compare(CompareRow(), bm, tm, layout=False, later=later))
                            for n, bm, tm in sides], errors))
        self.judge_statistics(later)
        out = []
        for rows, errors in judged:
            if errors is not None:
                errors.update((n, r.accumulated_err) for n, _, r in rows
                              if r.mode == "data" and r.accumulated_err is not None)
            out.append([(n, tm, r.status, r.stats_err if r.mode == "stats" else None) for n, tm, r in rows])
        return out


def _read_inputs(e: Any) -> dict[str, Any]:
    """An entry's inputs by name, less those its op never reads (``overwritten_inputs``)."""
    unread = overwritten_inputs(e.op)
    return {n: m for n, m in e.inputs if n not in unread}


def dtype_floor(dtype_pairs: Iterable[tuple[str, str]], rules: Rules) -> Tolerance | None:
    """The loosest tolerance among (bench dtype, target dtype) pairs of matched float outputs
    whose dtypes differ (bf16 vs fp32), or None.

    A mixed-precision run feeds its low-precision error into ops whose outputs are float32 again
    (softmax, norms, residual adds), so every float pair of such a compare is judged at that floor.
    """
    floor = None
    for b, t in dtype_pairs:
        if b != t:
            db, dt = torch_dtype(b), torch_dtype(t)
            if db is not None and dt is not None and db.is_floating_point and dt.is_floating_point:
                tol = rules.tolerance(b, t)
                floor = tol if floor is None else \
                    Tolerance(max(tol.rtol, floor.rtol), max(tol.atol, floor.atol), max(tol.tiny, floor.tiny))
    return floor


def dtype_tolerance(rules: Rules, floor: Tolerance | None, bench_dtype: str, target_dtype: str) -> Tolerance:
    """The tolerance of an output pair of these dtypes (PairComparer.tolerance): the rules',
    raised to the mixed-precision ``floor`` for a float or complex bench output."""
    tol = rules.tolerance(bench_dtype, target_dtype)
    d = torch_dtype(bench_dtype)
    if floor is not None and d is not None and (d.is_floating_point or d.is_complex):
        tol = Tolerance(max(tol.rtol, floor.rtol), max(tol.atol, floor.atol), max(tol.tiny, floor.tiny))
    return tol


@functools.lru_cache(maxsize=256)
def stand_in_of(bench_dtype: str, target_dtype: str) -> float:
    """``metrics.infinity_stand_in`` of two dtype names, NaN where none (an array's "none")."""
    db, dt = torch_dtype(bench_dtype), torch_dtype(target_dtype)
    got = infinity_stand_in(db, dt) if db is not None and dt is not None else None
    return math.nan if got is None else got


def dtype_note(bench_dtype: str, target_dtype: str) -> str:
    """The note of a pair whose dtypes differ (a bf16 target of a float32 bench)."""
    order = ("float8_e5m2", "float8_e4m3fn", "bfloat16", "float16", "float32", "float64")
    known = [d for d in (bench_dtype, target_dtype) if d in order]
    looser = min(known, key=order.index) if known else bench_dtype
    return f"dtype {bench_dtype} vs {target_dtype}: compared after upcasting, at {looser} tolerance"


def same_layout(bm: TensorMeta, tm: TensorMeta) -> bool:
    """Equal shapes, and equal dtypes or both floating (a bf16 target of a float32 bench)."""
    if tuple(bm.shape) != tuple(tm.shape):
        return False
    if bm.dtype == tm.dtype:
        return True
    db, dt = torch_dtype(bm.dtype), torch_dtype(tm.dtype)
    return db is not None and dt is not None and db.is_floating_point and dt.is_floating_point


def progress_bar(total_bytes: int, rank: str, progress: bool | None) -> Any:
    """The bar over the bytes of saved data compared; shown from PROGRESS_BYTES unless
    ``progress`` says."""
    from ..progress import progress as progress_of

    show = total_bytes >= PROGRESS_BYTES if progress is None else progress
    return progress_of(total=total_bytes, unit="B", unit_scale=True, desc=f"compare {rank}".strip(), enabled=show)
