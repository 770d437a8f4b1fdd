"""Compare two loaded dumps: match their entries, judge each matched output pair, localise.

Every dump is compared on columns: a format-v3 trace dump's own index, or columns built from the
Records of any other dump (xray.dump.dump_columns). Why: a million Records take minutes to build
and gigabytes to hold, while what compare needs of almost all of them (kind, direction, step,
module path, op, output shapes, dtypes and statistics) is in the columns. Records are built only
where the rules look closer: pairs the vectorised statistics judge does not cover (saved data,
dtype or shape differences, random ops, missing statistics: ``PairComparer.compare``) and the
suspect pairs attribution walks from (causality.py, through Entries and a lazy ``Matches``).

The steps, in order, freeing memory between them: entry_table.py (entries as arrays),
matching.py (which entries match), row_plan.py (the rows they make), stat_verdicts.py (the numpy
judge), row_building.py (CompareRows), entry_records.py and lazy_matches.py (what attribution
reads), attribution_bound.py (which failing rows it attributes).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import numpy as np

from ..dump.dump_columns import DumpColumns
from ..dump.model import TensorMeta
from ..dump.reader import no_cyclic_gc
from ..numerics.rules import Rules
from ..ops.nondeterminism import op_kind, nondeterministic
from ..record.elementwise_check import rerun_op
from .attribution_bound import attribute_first
from .divergence import inside
from .entry_records import Entries
from .entry_table import MODULE, Codes, EntryTable, Vocab
from .lazy_matches import matches_of
from .local import ARGUMENT_SUSPECT, CHECK_SUSPECT, check_floor, elementwise_check_floor
from .matching import align_tables
from .op_classes import skip_kernel_specific
from .pair_judge import PairComparer, progress_bar, torch_dtype
from .result import ATTRIBUTED, CompareRow, PairStatus
from .row_building import judge_the_rest, make_rows
from .row_plan import RowPlan
from .stopped import stopped_at
from .unread_terms import UNREAD_SUSPECT, unread_terms
from .sample_verdicts import MOVED_CHANGED, moved_and_changed
from .stat_verdicts import covered_by_stats, tolerances


def compare_loaded(bench: Any, target: Any, rules: Rules, *, rank: str = "", reference: Any = None,
                   progress: bool | None = None, statistics_only: bool = False,
                   ignore_step: bool = False, attributed: int | None = ATTRIBUTED) -> tuple[list[CompareRow], dict]:
    """Rows (target-only entries before each matched pair, then bench-only ones, then the pair's
    outputs) and per-dump totals for one pair of loaded dumps. ``reference``: a loaded float64
    run of the bench, matched to the bench as the target is (torch._dynamo's rule on data pairs).
    ``statistics_only``: saved tensors are left unread, every pair judged on its statistics.
    ``ignore_step``: steps pair in order, whatever their numbers (``EntryTable``). ``attributed``:
    failing rows attributed, the earliest first (None: all; attribution_bound.py); the totals
    count the others as ``unattributed``."""
    started = time.perf_counter()
    codes = Codes()
    ta, tb = (EntryTable(DumpColumns(d, statistics_only), codes, ignore_step=ignore_step) for d in (bench, target))
    pa, pb, anchors = align_tables(ta, tb, codes)
    refs = None if reference is None else _reference_outputs(
        ta, EntryTable(DumpColumns(reference), codes, ignore_step=ignore_step), codes)
    ea, eb = Entries(ta), Entries(tb)
    plan = RowPlan(ta, tb, pa, pb)
    _name_rows(ta, tb, pa, pb)
    vocab = Vocab(codes)
    floor, tols = tolerances(ta, tb, plan, rules, vocab)
    comparer = PairComparer(bench, target, rules, reference, floor)
    random_of = _random_of(ta, ea)
    other_arguments = (ta.op[pa] == tb.op[pb]) & (ta.args[pa] != tb.args[pb])  # by pair (_suspect_arguments)
    for t in (ta, tb):
        t.trim("group", "path", "call_index", "args")  # op: until rows are judged (sample_verdicts reads it)
    comparer.bar = progress_bar(_total_bytes(ta, vocab), rank, progress)
    fast = covered_by_stats(ta, tb, plan, random_of, vocab)
    _return_freed_memory()
    rows = make_rows(rank, ta, tb, plan, fast, tols, rules, vocab)
    random_rows = judge_the_rest(ta, tb, plan, fast, rows, comparer, random_of, refs)
    _suspect_moves_that_changed(tb, plan, rows)
    _suspect_self_checks(tb, plan, rows, rules)
    _suspect_arguments(plan, rows, other_arguments)
    _suspect_unread_terms(ta, tb, pa, pb, plan, rows, complete=stopped_at(target) is None)
    refs = None  # the reference run's table
    comparer.bar.close()
    for t in (ta, tb):
        t.trim("out_name", "out_dtype", "out_shape", "seq_value", "op")
    ta.trim("out", "out_start", "n_out")  # the bench's outputs are read through its Records from here on
    plan.trim()
    _return_freed_memory()
    skip_kernel_specific(rows)
    matches, suspect, failing = matches_of(ta, tb, ea, eb, plan, rows, random_rows)
    _return_freed_memory()  # matches_of's temporaries: attribution's failing rows come on top
    with no_cyclic_gc():  # each suspect pair's Records, built and dropped pass after pass: acyclic
        unattributed = attribute_first(ea, eb, suspect, failing, plan, rows, comparer, rules, target, matches,
                                       attributed)
    totals = {"bench_records": len(ta), "target_records": len(tb), "matched": len(pa), "anchors": anchors,
              "bytes_compared": comparer.bytes, "seconds": round(time.perf_counter() - started, 3)}
    if unattributed:
        totals["unattributed"] = unattributed
    return rows, totals


def _suspect_moves_that_changed(tb: EntryTable, plan: RowPlan, rows: list[CompareRow]) -> None:
    """Passing rows of a target op that only moves values, whose sample differs from its input's
    within the target run (``sample_verdicts.moved_and_changed``), become warnings: attribution
    then measures their local error, and a wrong one fails. A passing row is otherwise never
    looked at again, however its own input shows it changed values."""
    at = np.flatnonzero((plan.cat == 2) & (plan.ao >= 0) & (plan.bo >= 0))
    if not len(at):
        return
    changed = moved_and_changed(tb, plan.b[at], plan.bo[at])
    for i in at[changed].tolist():
        r = rows[i]
        if r.status == PairStatus.PASS.value:
            r.status = PairStatus.WARNING.value
            r.note = "; ".join(x for x in (r.note, MOVED_CHANGED) if x)


def _suspect_self_checks(tb: EntryTable, plan: RowPlan, rows: list[CompareRow], rules: Rules) -> None:
    """Rows that passed on statistics (no saved data) whose target call's recorded self-check
    (docs/format.md, "Self-checks") is above the least floor any call of its dtype has
    (``Rules.least_floor``) become warnings marked ``CHECK_SUSPECT``: attribution weighs
    that local error against the call's own floors, and fails a wrong call or gives the row back
    its pass. Three wrong elements in a layer norm's output change neither its statistics nor its
    32-element sample, and the row passes; its self-check, which reads every checked row, says
    10 %. A row that passed on saved data was compared element by element already."""
    check = tb.columns.check
    at = np.flatnonzero((plan.cat == 2) & (plan.bo >= 0))
    if check is None or not len(at):
        return
    outs = plan.bo[at]
    least, elementwise_least = (tb.codes.lut("dtype", lambda name: _least_check_floor(name, rules, own), dtype=np.float64)
                                for own in (check_floor, elementwise_check_floor))
    values, dtypes = check[tb.out[outs].astype(np.int64), 0], tb.out_dtype[outs]
    over = values > least[dtypes]  # (NaN: not checked)
    for i, value, dtype in zip(at[over].tolist(), values[over].tolist(), dtypes[over].tolist()):
        r = rows[i]
        if r.status != PairStatus.PASS.value or r.mode != "stats":
            continue
        if rerun_op(r.target_op) is not None and value <= elementwise_least[dtype]:
            continue  # an elementwise check's own floor is coarser (local.elementwise_check_floor)
        r.status = PairStatus.WARNING.value
        r.note = "; ".join(x for x in (r.note, CHECK_SUSPECT) if x)


def _suspect_arguments(plan: RowPlan, rows: list[CompareRow], other_arguments: np.ndarray) -> None:
    """Passing rows of a pair of one op whose non-tensor arguments differ (``other_arguments``,
    by pair: their skeletons' texts, an eps, a scale, an attention flag, a tensor passed on one
    side only) become warnings
    marked ``ARGUMENT_SUSPECT``: attribution fails a call whose arguments make another
    computation (cause "argument", whatever its values show) and passes the rest again (a dtype,
    a device, the same computation spelled otherwise). A doubled attention scale in a tiny bf16
    model moves its output within bf16's band, and the row passed."""
    if not other_arguments.any():
        return
    at = np.flatnonzero((plan.cat == 2) & (plan.ao >= 0) & (plan.bo >= 0))
    for i in at[other_arguments[plan.pair[at]]].tolist():
        r = rows[i]
        if r.status == PairStatus.PASS.value:
            r.status = PairStatus.WARNING.value
            r.note = "; ".join(x for x in (r.note, ARGUMENT_SUSPECT) if x)


def _suspect_unread_terms(ta: EntryTable, tb: EntryTable, pa: np.ndarray, pb: np.ndarray, plan: RowPlan,
                          rows: list[CompareRow], complete: bool) -> None:
    """Passing rows of the matched calls downstream of a bench-only op that reads a value the
    target computed and never read (``unread_terms``) become warnings marked
    ``UNREAD_SUSPECT``: attribution fails them for the term the target dropped, or passes them
    again. Such an op that no matched call reads from fails on its own row, born there."""
    found = unread_terms(ta, tb, pa, pb, complete)
    if found.consumers:
        at = np.flatnonzero((plan.cat == 2) & (plan.ao >= 0) & (plan.bo >= 0))
        for i in at[np.isin(ta.seq[plan.a[at]], list(found.consumers))].tolist():
            r = rows[i]
            if r.status == PairStatus.PASS.value:
                r.status = PairStatus.WARNING.value
                r.note = "; ".join(x for x in (r.note, UNREAD_SUSPECT) if x)
    if found.orphans:
        target_name = {r.target_seq: r.target_name for r in rows if r.target_seq in set(found.orphans.values())}
        at = np.flatnonzero(plan.cat == 1)
        for i in at[np.isin(ta.seq[plan.a[at]], list(found.orphans))].tolist():
            r = rows[i]
            value = found.orphans[r.bench_seq]
            r.status, r.origin, r.cause, r.culprit_bench_seq = PairStatus.FAIL.value, "born", "bench-only op", r.bench_seq
            r.culprit = (f"bench-only op {r.bench_name} reads what the target's {target_name.get(value, f'#{value}')} "
                         "makes, which nothing on the target reads; the target runs no such step, and nothing "
                         "both runs ran reads what it makes")


def _least_check_floor(dtype_name: Any, rules: Rules, own_floor: Callable[[Any], float]) -> float:
    dtype = torch_dtype(dtype_name) if isinstance(dtype_name, str) else None
    return rules.least_floor(own_floor(dtype), dtype) if dtype is not None and dtype.is_floating_point else np.inf


def _reference_outputs(ta: EntryTable, tr: EntryTable, codes: Codes) -> Callable[[int, int], TensorMeta | None]:
    """(bench entry, output index) -> the matching output of the reference run (aligned to the
    bench as the target is), or None."""
    ra, rr, _ = align_tables(ta, tr, codes)
    ref_of = np.full(len(ta), -1, dtype=np.int64)
    ref_of[ra] = rr

    def meta(a: int, k: int) -> TensorMeta | None:
        r = int(ref_of[a])
        if r < 0 or k >= tr.n_out[r]:
            return None
        return tr.source.tensor_meta(int(tr.out[tr.out_start[r] + k]))

    return meta


def _return_freed_memory() -> None:
    """Give the arrays freed so far back to the OS (glibc's malloc_trim; elsewhere nothing).

    Why: glibc raises its mmap threshold each time a large block is freed, so the later arrays
    of a few MB live in the heap, and freeing them (``trim``) leaves RSS where it was. Compare
    then holds a million rows beside both indexes; the arrays it dropped are ~100 MB of that."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def _name_rows(ta: EntryTable, tb: EntryTable, pa: np.ndarray, pb: np.ndarray) -> None:
    """Names and seqs of both sides' entries, the target's shared with its matched bench entry."""
    partner = np.full(len(tb), -1, dtype=np.int64)
    partner[pb] = pa
    ta.name_rows()
    tb.name_rows(ta, partner)


def _random_of(ta: EntryTable, ea: Entries) -> dict[int, str]:
    """Entry position -> why its values are random: ops that draw random numbers or return
    uninitialized memory (xray.ops.nondeterminism), and the modules such an op ran inside (a
    training-mode Dropout and every module enclosing it). Only ops whose name can be random
    build a Record."""
    out: dict[int, str] = {}
    sources: dict[str, str] = {}
    is_op = ta.kind != MODULE
    codes, first = np.unique(ta.op[is_op], return_index=True)
    texts = ta.op_text[np.flatnonzero(is_op)[first]].tolist()
    maybe = [c for c, op in zip(codes.tolist(), texts) if op_kind(op) is not None]
    if not maybe:
        return out
    for pos in np.flatnonzero(is_op & np.isin(ta.op, maybe)).tolist():
        why = nondeterministic(ea[pos].record)
        if why:
            out[pos] = why
            sources.setdefault(ea[pos].path, why)
    if sources:
        modules = np.flatnonzero(ta.kind == MODULE)
        out.update(random_modules(sources, zip(modules.tolist(), ta.path_text[modules].tolist())))
    return out


def _total_bytes(t: EntryTable, vocab: Vocab) -> int:
    """Bytes of the bench's saved outputs, twice (the progress bar's total)."""
    saved = np.flatnonzero(t.stat("data", np.arange(len(t.out))) >= 0)
    if not len(saved):
        return 0
    itemsize = np.array([0 if d is None else d.itemsize for d in map(torch_dtype, vocab.dtype.tolist())],
                        dtype=np.int64)
    numel = vocab.numel[t.out_shape[saved]].astype(np.int64)
    return int((numel * itemsize[t.out_dtype[saved]]).sum()) * 2


def random_modules(sources: dict[str, str], modules: Iterable[tuple[int, str]]) -> dict[int, str]:
    """Position -> why, of the ``modules`` ((position, path) pairs) a random op ran inside;
    ``sources``: module path a random op ran in -> why the op is random."""
    out: dict[int, str] = {}
    if sources:
        for pos, path in modules:
            inner = next((why for p, why in sources.items() if inside(p, path)), None)
            if inner:
                out[pos] = f"a random op ran inside it ({inner})"
    return out
