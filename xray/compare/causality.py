"""Where is an error born? Attribution of failing rows along the dump's data edges.

Each input of a record names its producer (``TensorMeta.source``, format v2): the op output it
came from, a parameter/buffer, or a model input. A failing record is *born* when

- every input agrees and the op's own local error (recomputed on the target's inputs, when the
  tensors were saved) is above its noise floor: cause "local error";
- or a disagreeing input is a parameter/buffer: cause "parameter";
- or a disagreeing input was produced by an op only the target ran: cause "target-only op";
- or a disagreeing input is a model input: cause "model input";
- or the same op ran with another non-tensor argument (an eps, a scale, an approximation, a
  flag): cause "argument", whatever its inputs carry.

Otherwise it is *inherited* from the failing record that produced its disagreeing input. An op
kind off by a consistent reduced-precision step on every call is "precision loss" (a warning),
and rows that only carry such loss forward, computing correctly on their inputs, are warnings
too. v1 dumps have no sources: any disagreeing input then makes a row inherited (execution-order
rule), as before. Rows recorded with statistics only, where nothing can be recomputed, get the
rules of statistics_only.py after this pass.
"""
from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..dump.model import Scalar, Source, TensorMeta, source_of
from ..dump.tensorio import dtype_from_name, dtype_name
from ..numerics.metrics import normwise_error
from ..numerics.rules import Tolerance, eps
from ..numerics.math_settings import run_math
from ..numerics.kernel_families import family_of
from ..record.elementwise_check import rerun_op
from .entry_records import Entry
from .local import ARGUMENT_SUSPECT, CHECK_SUSPECT, LocalError, checked_error, local_error, local_error_with, measurable, reads_right
from .moved_values import moved_local_error, same_multiset
from .sample_local import sample_local_error, swapped_local_error, tensor_arguments
from .sample_verdicts import MOVED_CHANGED, sample_decided, sample_peak
from .matching import op_base
from .noise_floor import Floors, is_matmul_like, outliers, reduction_length
from .op_classes import THRESHOLD_ARG, cast_class, is_cast, is_discontinuous, is_value_preserving, overwritten_inputs
from . import statistics_only
from .reordered_sums import reordered_sum
from .summed_means import summed_mean_error
from .unread_terms import UNREAD_SUSPECT
from .unseen_inputs import unseen_input_difference
from .upstream_errors import upstream_errors
from .written_state import first_reads
from .pending import FAILING, PRECISION, SUSPECT, Pending, PendingRun, agreement, downgrade, row_inputs, set_origin
from .result import RANDOM_DRAWS, CompareRow, PairStatus


def attribute(ea: Sequence[Entry], eb: Sequence[Entry], pending: PendingRun, comparer: Any, rules: Any,
              target_dump: Any, index: Matches, every_row: Sequence[CompareRow] = ()) -> None:
    """Fill origin, cause, culprit, local error and inputs_agree of every failing matched row;
    measured precision loss turns rows into warnings.

    ``pending``: the pairs with a suspect row, in target order, each read as a Pending (their
    marks kept in the run: a pass holds one pair at a time); ``index`` answers the look-ups over
    every matched pair (Matches, read from the arrays: lazy_matches.py), so a million passing
    pairs cost nothing here."""
    on_samples: list[tuple[int, int, LocalError]] = []  # (pair, output, local error)
    devices: set[str] = set()
    pending.upstream_error = upstream_errors(index.by_seq, index.rows_of, _row_error)
    for p in pending:
        b, rows = p.target, p.rows
        devices.update(str(m.device or "cpu").split(":")[0] for _, m in b.outputs[:1])
        for k, r in enumerate(rows):
            if r.status in SUSPECT and k < len(b.outputs):
                le = local_error(b.record, target_dump, b.outputs[k][1], k) \
                    if r.mode == "data" or measurable(b.outputs[k][1], b.op) else None
                if le is not None and r.mode == "data":  # a normwise error dilutes three wrong elements of 524k
                    sharper = _sharper_of(le, _elementwise_check(b.record, b.outputs[k][1]))
                    if sharper is not le:
                        le = sharper
                        _say_measured_on(r, le)
                if le is None and r.mode == "stats":
                    meta = b.outputs[k][1]
                    if (on_sample := _unsaved_local_error(b.record, meta, k)) is not None:
                        on_samples.append((p.index, k, on_sample))
                if le is not None:
                    p.local[k] = le
                    p.reduce[k] = reduction_length(b.record, k)
                    r.local_err, r.local_floor = le.local, le.floor
    floors = Floors(rules, run_math(getattr(target_dump, "header", None), devices, rules.tf32))
    floors.established = _mark_precision_loss(pending, rules, floors.math)
    _mark_outliers(pending, floors)
    # A local error measured on a sample beyond its floor makes a row born; one within it only
    # clears the sample's own verdict (_decide), the statistics are left to the statistics-only
    # rules, which weigh the run's precision loss (it joins neither the precision steps nor the
    # outliers above: 32 elements are not the call). An elementwise self-check read every element:
    # within a unit of its reference, the call computed right on its inputs (local.reads_right).
    for i, k, le in on_samples:
        p = pending[i]
        if floors.beyond(le, p.target.op, 1) or reads_right(le):
            r = p.rows[k]
            p.local[k], r.local_err, r.local_floor = le, le.local, le.floor
            _say_measured_on(r, le)
        else:
            p.sample_local[k] = le
    for p in pending:  # the device floor is what the row shows
        for k, le in p.local.items():
            p.rows[k].local_floor = floors.floor(le, p.target.op, p.reduce.get(k, 1))
    graph = _Graph(index, floors, target_dump, getattr(comparer, "bench", None),
                   (ea, eb) if _module_dump(eb) else ((), ()), bench_entries=ea,
                   columns=(ea.table.columns, eb.table.columns))
    # v1 dumps: once an error is born (or random values differ) earlier in execution order, a
    # difference in an input may be that error; before it, only precision can be carried.
    random_pos = index.random_pos
    seen = _SeenPrecision()
    inherited = _Inherited()  # rows inherited from a failing row, with what _decide saw: _decide_again
    matched_target = index.target_of  # bench seq -> its target entry
    for p in pending:  # target execution order: producers are decided before their consumers
        agree = agreement(p.inputs)  # (per row below: row_inputs)
        inserted = _inserted_op_change(p, graph, matched_target, target_dump, rules)
        skipped = _skipped_step(p, graph) if inserted is None and any(r.status in SUSPECT for r in p.rows) else None
        if inserted is None and skipped is None:  # a term dropped shows on a passing row too
            skipped = _unread_term(p, graph)
        for k, r in enumerate(p.rows):
            if inserted is not None and r.status in SUSPECT:
                op, why = inserted
                r.status, r.inputs_agree = PairStatus.FAIL.value, agree
                set_origin(r, "born", "target-only op", f"target-only op {op.name} {why}")
                r.culprit_target_seq = op.record.seq
                seen.origin = True
                continue
            if skipped is not None and r.status in SUSPECT:
                name, op = skipped
                _drop_note(r, UNREAD_SUSPECT)
                r.status, r.inputs_agree = PairStatus.FAIL.value, agree
                why = graph.dropped.get(op.record.seq) or f"makes the bench's {name}"
                set_origin(r, "born", "bench-only op", f"bench-only op {op.name} {why}; the target runs no such step")
                r.culprit_bench_seq = op.record.seq
                seen.origin = True
                continue
            if UNREAD_SUSPECT in (r.note or ""):  # no term dropped behind it after all: passing again
                _drop_note(r, UNREAD_SUSPECT)
                if r.status == PairStatus.WARNING.value and not any(
                        mark in r.note for mark in (ARGUMENT_SUSPECT, CHECK_SUSPECT, MOVED_CHANGED)):
                    r.status = PairStatus.PASS.value
                    continue
            if r.status == PairStatus.WARNING.value and ARGUMENT_SUSPECT in (r.note or ""):
                # it passed; only its call's arguments made it suspect (engine._suspect_arguments)
                _drop_note(r, ARGUMENT_SUSPECT)
                if _differing_argument(p, r, k, graph) is not None:
                    r.status = PairStatus.FAIL.value
                    r.note = "; ".join(x for x in (r.note, "its values pass, but it ran with another argument") if x)
                elif CHECK_SUSPECT not in r.note:
                    r.status = PairStatus.PASS.value
                    continue
            if r.status == PairStatus.WARNING.value and CHECK_SUSPECT in (r.note or ""):
                # it passed; only its recorded self-check made it suspect (engine._suspect_self_checks).
                # Where the bench's own call is as wrong (one kernel bug on both runs), the runs agree.
                if not _wrong_on_its_inputs(p, k, floors) or _wrong_on_the_bench_too(p, k, floors):
                    r.status = PairStatus.PASS.value
                    _drop_note(r, CHECK_SUSPECT)
                    continue
                r.status = PairStatus.FAIL.value
                r.note = "; ".join(x for x in (r.note, "its statistics and sample pass, but it is wrong on its "
                                               "own inputs") if x)
            elif r.status == PairStatus.WARNING.value:
                # Accumulated error within the run's precision, but this op is wrong on its own
                # inputs (a 5 % kernel bug under bf16 noise), ran with another argument, or (on
                # statistics) made far more error than it received: judged as a failure, which
                # the rules below may still find precision loss.
                why = "wrong on its own inputs" if _wrong_on_its_inputs(p, k, floors) \
                    else "another argument" if _differing_argument(p, r, k, graph) is not None \
                    else _jumps_beyond_its_inputs(p, k, rules.precision_factor)
                if why is None:
                    seen.add(r)
                    continue  # within the compare's precision, and computed right on what it got
                r.status = PairStatus.FAIL.value
                r.note = "; ".join(x for x in (r.note, "within the run's precision, but " + why) if x)
            r.inputs_agree = agreement(row_inputs(p, k))
            if r.status in FAILING:
                born_seen = seen.origin or p.target.pos > random_pos
                _decide(r, p, k, graph, floors, born_seen, seen)
                if r.cause == "inherited" and r.culprit_target_seq is None:
                    inherited.add(p, k, born_seen, seen)
                # a row born with nothing recomputed (statistics only, or outputs saved past
                # X_DUMP_NUM's inputs) is provisional: the rules run last may find it precision loss
                if r.origin == "born" and p.target.kind == "op" and not (
                        r.cause == "local error" and r.local_err is None):
                    seen.origin = True
                seen.add(r)
    _modules_follow_their_ops(pending, eb, graph)
    statistics_only.precision_loss(pending, rules, floors, _module_dump(eb), index.kind_errors)
    _inherited_precision_loss(pending, graph, rules)
    _received_precision(pending, rules.precision_factor)
    _decide_again(inherited.rows(pending), graph, floors)
    # a module whose ops were recorded is judged by them (_modules_follow_their_ops), not as a kind
    statistics_only.kind_outliers((p for p in pending if p.target.kind != "module" or not _ops_inside(p.target, eb, True)),
                                  rules, index.kind_errors)
    _judge_the_target_only(every_row, graph, floors)


def _unsaved_local_error(record: Any, meta: Any, k: int) -> LocalError | None:
    """Output ``k``'s local error where its tensors were not saved: recomputed on its inputs'
    samples (an elementwise op), or, for an op that only moves values, its statistics against
    its input's (moved_values.py); a sum's means that do not add up (summed_means.py) win over
    a sample that missed the elements that made them, and so does an elementwise op's self-check
    that reads every element (record/elementwise_check.py) where it says more, or where both find
    it right."""
    on_sample = sample_local_error(record, meta, k)
    moved = moved_local_error(record, meta, k)  # (a copy: the larger of it and its sample's)
    if moved is not None and (on_sample is None or moved.local > on_sample.local):
        on_sample = moved
    summed = summed_mean_error(record, meta, k)
    on_sample = summed if summed is not None and (on_sample is None or summed.local > summed.floor) else on_sample
    check = _elementwise_check(record, meta)
    if reads_right(check) and (on_sample is None or _beyond_own_floor(on_sample) <= 1):
        return check  # both right: the check read the call, the sample 32 of its elements
    return _sharper_of(on_sample, check)


def _drop_note(r: CompareRow, text: str) -> None:
    """Take a suspicion's mark (engine's CHECK_SUSPECT, ARGUMENT_SUSPECT, UNREAD_SUSPECT) off row ``r``'s note."""
    r.note = "; ".join(x for x in r.note.split("; ") if x != text)


def _say_measured_on(r: CompareRow, le: LocalError) -> None:
    """Note on row ``r`` what its local error was measured on, where not its saved tensors."""
    r.note = "; ".join(x for x in (r.note, "local error measured on " + (le.seen_by or "the sample")) if x)


def _elementwise_check(record: Any, meta: Any) -> LocalError | None:
    """An elementwise (or row) op's recorded self-check as a local error: the largest error of
    one element (record/elementwise_check.py), or None where it has none."""
    return checked_error(meta, record.op) if rerun_op(record.op) is not None else None


def _sharper_of(le: LocalError | None, check: LocalError | None) -> LocalError | None:
    """The elementwise self-check where it says more than ``le`` (recomputed on a sample or on
    the saved tensors: a normwise error), each as a share of its own floor: three doubled
    elements of 524k read 1 there and a few thousandths normwise."""
    if check is not None and (le is None or _beyond_own_floor(check) > _beyond_own_floor(le)):
        return check
    return le


def _beyond_own_floor(le: LocalError) -> float:
    """How many times its own floor a local error is (a floor of 0, where the CPU's recomputation
    at the dtype is exact: 0 for no error, infinitely many for any)."""
    return le.local / le.floor if le.floor > 0 else math.inf if le.local > 0 else 0.0


def _judge_the_target_only(rows: Sequence[CompareRow], graph: "_Graph", floors: Floors) -> None:
    """A target record with no partner (a cast autocast inserts, a kernel the bench ran another
    way, a call the bench folded into a record of another signature) has nothing to compare with;
    its local error needs nothing. Wrong on its own inputs (saved tensors, its self-check, or its
    sample), it is born there: an unmatched row, otherwise judged only through a consumer that
    fails, and a 5 % bug in a bf16 autocast cast leaves every consumer within bf16's band."""
    for r in rows:
        if r.status != PairStatus.UNMATCHED.value or r.bench_seq is not None or r.target_seq is None:
            continue
        e = graph.by_seq.get(r.target_seq)
        if e is None or e.kind != "op":
            continue
        k = next((i for i, (name, _) in enumerate(e.outputs) if name == r.tensor), None)
        if k is None:
            continue
        meta = e.outputs[k][1]
        le = local_error(e.record, graph.dump, meta, k) if measurable(meta, e.op) else _unsaved_local_error(e.record, meta, k)
        floor = floors.floor(le, e.op, reduction_length(e.record, k)) if le is not None else None
        if floor is None or le.local <= floor:
            swapped = graph.swapped_for(e) if k == 0 else None
            if swapped is not None:
                r.status, r.culprit_target_seq = PairStatus.FAIL.value, e.record.seq
                set_origin(r, "born", "target-only op", f"this op is {swapped}")
            continue
        r.status, r.local_err, r.local_floor = PairStatus.FAIL.value, le.local, floor
        why = ("the bench de-duplicated its call into a record of another signature"
               if graph.call_counts() is not None and graph.folded_on_the_bench(e) else "the bench has no such call")
        set_origin(r, "born", "local error", f"this op, on its own inputs: recorded on the target only, {why}")


def _modules_follow_their_ops(pending: list[Pending], eb: Sequence[Entry], graph: _Graph) -> None:
    """A module record of a trace that also recorded the ATen ops inside it is judged by those
    ops: born only when a born failing op lies inside, precision loss when its failing content
    is all precision loss, else inherited from its first failing op."""
    for p in pending:
        if p.target.kind != "module" or not any(r.status in FAILING for r in p.rows):
            continue
        inner = [graph.rows_of.get(e.pos) for e in _ops_inside(p.target, eb)]
        inner = [r for rows in inner if rows for r in rows]
        if not inner:
            continue  # a module dump, or nothing recorded inside: the module is the finest record
        born = [r for r in inner if r.origin == "born" and r.status in FAILING]
        failing = [r for r in inner if r.status in FAILING]
        for k, r in enumerate(p.rows):
            if r.status not in FAILING or r.cause in ("parameter", "target-only op", "model input"):
                continue
            made = _target_only_maker(p.target, k, graph) if not born else None
            if made is not None:  # the module's output came out of an op only the target ran
                set_origin(r, "born", "target-only op", f"target-only op {made.name} made its output {r.tensor}")
                r.culprit_target_seq = made.record.seq
            elif born:
                set_origin(r, "inherited", "inherited", f"error born inside it, at {_row_name(born[0])}")
            elif not failing and any(x.cause == PRECISION for x in inner):
                downgrade(r, "its ops inside lose precision only")
            elif failing:
                set_origin(r, "inherited", "inherited", f"its ops inside inherit the error ({_row_name(failing[0])})")


def _target_only_maker(m: Entry, k: int, graph: _Graph) -> Entry | None:
    """The target-only op whose result is output ``k`` of module call ``m``, if it is one and no
    failing matched record feeds that op."""
    if k >= len(m.outputs):
        return None
    kind, detail = graph.producer(m.outputs[k][1], m.record.seq + 1)
    if kind != "target-only":
        return None
    kind, detail = graph.target_only_origin(detail)
    return detail if kind == "target-only" else None


def _ops_inside(m: Entry, eb: Sequence[Entry], first: bool = False) -> list[Entry]:
    """Op entries recorded during module call ``m`` (``first``: the first one found, enough to
    know there are some). Traces record a module when it exits (its ops come just before it);
    module-level dumps when it is entered (its ops follow it)."""
    def inside(e: Entry) -> bool:
        return m.path == "" or e.path == m.path or e.path.startswith(m.path + ".")

    # by position, not slices: ``eb`` may be a lazy sequence, and the walk stops at the module's edge
    for span in (range(m.pos - 1, -1, -1), range(m.pos + 1, len(eb))):
        out = []
        for i in span:
            e = eb[i]
            if not inside(e) or (e.kind == "module" and e.path == m.path):
                break  # left the module, or reached another call of it
            if e.kind == "op" and e.direction == m.direction:
                out.append(e)
                if first:
                    break
        if out:
            return out
    return []


@dataclass
class Matches:
    """What attribution looks up about every matched pair and every target entry.

    ``by_seq``: target seq -> Entry; ``rows_of``: target position -> the pair's rows;
    ``target_of``: bench seq -> the matched target Entry; ``random_pos``: the first target
    position whose rows were skipped as random (len(eb) if none); ``made``: fingerprint ->
    [(seq, output index)] of target op outputs (v1 traces, which name no producers). Mappings
    only need ``get``, ``in``, ``[]`` (and ``made`` truthiness), so they may be lazy views.
    ``kind_errors``: [(target position, row)] -> for each, the (row index, statistics error) of
    every matched statistics-only row of its kind (op, direction, output), or None.
    ``around``: seq -> the target entries recorded nearest before and after it (a folded call's
    neighbours), or None."""

    by_seq: Any
    rows_of: Any
    target_of: Any
    random_pos: int
    made: Any
    kind_errors: Any = None
    around: Any = None


class _Graph:
    """Target records by seq, and which of them are matched (with their rows)."""

    def __init__(self, index: Matches, floors: Floors | None = None, dump: Any = None, bench_dump: Any = None,
                 entries: tuple[Any, Any] = ((), ()), bench_entries: Any = (), columns: tuple[Any, Any] = (None, None)
                 ) -> None:
        self.by_seq = index.by_seq
        self.around = index.around
        self._folds: Any = False  # (columns, rows, first_seq, last_seq) of records with folded calls
        self._calls: Any = False  # (bench, target) calls per op when either side is de-duplicated
        self.folded_into: dict[tuple, str] = {}  # (seq, shape, dtype) -> _folded_into's text
        self.rows_of = index.rows_of
        self.made = index.made
        self.target_of = index.target_of
        self.floors, self.dump, self.bench_dump = floors, dump, bench_dump
        self._entries = entries  # (bench, target) entries: module forward calls are looked up there
        self._forward: list[dict] | None = None
        self._bench, self._bench_pos = bench_entries, None  # bench seq -> position (bench_output)
        self._within: dict[tuple[int, bool], bool | None] = {}  # (target pos, substituted) -> verdict
        # target pos -> why a target-only op fails its judgement: a substituted kernel wrong on its
        # inputs, or an op that could not be judged (_unmeasured_why)
        self.wrong: dict[int, str] = {}
        self._swapped: dict[tuple[int, int], str | None] = {}  # (target pos, bench seq) -> another_function
        self.dropped: dict[int, str] = {}  # bench seq -> why its op is a term the target dropped
        self._readers: dict[tuple[int, int], list[int]] | None = None  # target (seq, index) -> seqs reading it
        self._columns = columns  # (bench, target) dump columns: written_by_the_run
        self._first_reads: tuple[dict, dict] | None = None  # (bench, target) module state at its first read

    def written_by_the_run(self, meta: Any) -> bool:
        """A parameter or buffer read as ``meta``, which differs between the runs here, that both
        runs held alike at its first read (written_state.first_reads): a run changed it since (a
        batch norm's running statistics, a parameter after an optimizer step), either one (a
        running mean that is rounding noise, written as exact zeros on one side), so it did not
        come in different. Alike: the same statistics (``_fingerprint``) and sample."""
        if self._first_reads is None:
            self._first_reads = tuple(first_reads(c) if c is not None else {} for c in self._columns)
        bench, target = (reads.get(getattr(meta, "source", None)) for reads in self._first_reads)
        return bench is not None and target is not None and _held_alike(bench, target)

    def folds(self) -> tuple | None:
        """The target's records that stand for more than one call (their rows in its columns, and
        their first and last seqs), found once; None when the dump has no columns."""
        if self._folds is False:
            from ..dump.column_scan import native_columns

            columns = native_columns(self.dump) if self.dump is not None else None
            if columns is None:
                self._folds = None
            else:
                r = columns.records
                rows = np.flatnonzero(r["count"] > 1)
                self._folds = (columns, rows, r["first_seq"][rows], r["last_seq"][rows])
        return self._folds

    def bench_output(self, row: CompareRow) -> Any:
        """The bench's TensorMeta of a matched row's output, or None."""
        if row.bench_seq is None or not row.tensor.startswith("out"):
            return None
        e = self.bench_entry(row.bench_seq)
        outputs = e.outputs if e is not None else ()
        k = int(row.tensor[3:]) if row.tensor[3:].isdigit() else len(outputs)
        return outputs[k][1] if k < len(outputs) else None

    def skipped_on_the_target(self, p: Pending, name: str, row: CompareRow) -> Entry | None:
        """The op only the bench ran that made the bench's input ``name`` of ``p``, where the
        target's comes from ``row``'s call, or None: the target skipped a step of the bench's
        data flow (a dropped attention mask's add, between the scores and the softmax). An op
        the bench runs and the target does not is never judged by its own row (it has no
        partner); its consumer's inputs, made by different calls, are where it shows. Forward
        calls only: in backward, autograd orders each run's gradient accumulation its own way
        (autocast's casts move it), so a sum the bench alone runs is the same sum associated
        otherwise, not a step skipped."""
        if p.target.record.direction == "backward":
            return None
        src = source_of(dict(p.bench.inputs).get(name))
        if src is None or src.kind != "op" or src.seq == row.bench_seq or src.seq in self.target_of:
            return None
        e = self.bench_entry(src.seq)
        if e is None:
            return None
        # a move or a cast computes nothing: the target may make it elsewhere (a transpose
        # after autocast's cast of a weight, where the bench transposes the float32 weight), and
        # then what the consumer reads differs as little as what its target producer carries
        if is_value_preserving(e.op) or is_cast(e.op):
            return e if self._moved_apart(p, name, row) else None
        return e

    def dropped_on_the_target(self, p: Pending, name: str, e: Entry | None) -> Entry | None:
        """The bench-only op behind the bench's input ``name`` of ``p`` that reads a value the
        target computed (a matched record's output) and that the target never reads to make its
        input ``name``, through moves and casts of one tensor: neither through the target-only
        ops that make it (``e`` and the ops behind it, each right on its own inputs) nor, where
        ``e`` is None, straight from the matched record it reads. The target dropped a term of
        the bench's computation (``residual + h`` written ``h``, then cast by autocast), so its ops
        are no other kernel of the same values. None when there is no such op, or a region is
        not all recorded. Forward only, as ``skipped_on_the_target``."""
        if p.target.record.direction == "backward":
            return None
        if e is None:
            src = _op_source(next((m for n, m, _, _ in p.inputs if n == name), None))
            if src is None:
                return None
            reads = {self._root(src.seq, src.index or 0)}
        else:
            kind, _, ops = self.region(e)
            if kind != "target-only":
                return None
            mine = {op.record.seq for op in ops}
            reads = {self._root(src.seq, src.index or 0) for op in ops for _, m in op.inputs
                     if (src := _op_source(m)) is not None and src.seq not in mine}
        for seq, partner, index in self._bench_region_reads(p, name) or ():
            if self._root(partner.record.seq, index) not in reads:
                self.dropped[seq] = f"reads what the target's {partner.name} makes, which " + (
                    "nothing on the target reads" if self._unread(partner.record.seq, index, p.target.record.seq)
                    else f"the target's ops that make its {name} never read")
                return self.bench_entry(seq)
        return None

    def unread_on_the_target(self, p: Pending, name: str) -> Entry | None:
        """The bench-only op behind the bench's input ``name`` of ``p`` that reads a value the
        target computed and nothing on the target reads (``_unread``), or None: a term dropped,
        whatever the values (a BERT attention output left out of its residual sum moves the
        norm after it 0.7 %, inside bf16's passing band). A value both runs computed and only one
        uses is no rounding. Forward only."""
        if p.target.record.direction == "backward":
            return None
        for seq, partner, index in self._bench_region_reads(p, name) or ():
            if self._unread(partner.record.seq, index, p.target.record.seq):
                self.dropped[seq] = f"reads what the target's {partner.name} makes, which nothing on the target reads"
                return self.bench_entry(seq)
        return None

    def _bench_region_reads(self, p: Pending, name: str) -> list[tuple[int, Entry, int]] | None:
        """(bench seq, target partner, output) of each matched value the bench-only ops behind
        the bench's input ``name`` of ``p`` read, walked back to matched records; None when one
        of those ops is not recorded or the region is longer than MAX_REGION."""
        src = _op_source(dict(p.bench.inputs).get(name))
        todo = [src.seq] if src is not None and src.seq not in self.target_of else []
        seen: set[int] = set()
        out = []
        while todo:
            seq = todo.pop()
            if seq in seen:
                continue
            b = self.bench_entry(seq)
            if b is None or b.kind != "op" or len(seen) >= MAX_REGION:
                return None
            seen.add(seq)
            for _, m in b.inputs:
                made = _op_source(m)
                partner = self.target_of.get(made.seq) if made is not None else None
                if made is not None and partner is None:
                    todo.append(made.seq)
                elif partner is not None:
                    out.append((seq, partner, made.index or 0))
        return out

    def _unread(self, seq: int, index: int, until: int) -> bool:
        """No target record reads output ``index`` of call ``seq``, and no call folded between
        it and ``until`` could have (a fold keeps its first argument's producer only); False
        where the target dump has no columns to tell."""
        if self._columns[1] is None or self.readers(seq, index):
            return False
        folds = self._columns[1].folds
        return not np.any((folds["seq"] > seq) & (folds["seq"] < until))

    def _root(self, seq: int, index: int) -> tuple[int, int]:
        """(seq, output) of the target op that made the values of output ``index`` of its call
        ``seq``: back through moves and casts of one tensor (a view, autocast's copy)."""
        for _ in range(MAX_REGION):
            t = self.by_seq.get(seq)
            if t is None or t.kind != "op" or not (is_value_preserving(t.op) or is_cast(t.op)):
                break
            tensors = [m for _, m in t.inputs if isinstance(m, TensorMeta)]
            src = _op_source(tensors[0]) if len(tensors) == 1 else None  # (a cat joins several)
            if src is None:
                break
            seq, index = src.seq, src.index or 0
        return seq, index

    def _moved_apart(self, p: Pending, name: str, row: CompareRow) -> bool:
        """Whether input ``name`` of ``p``, of one shape on both sides, differs on its statistics
        or its sample (the same positions) far beyond what ``row``, its target producer's, carries
        and the row's tolerance: the bench's own move put other values there (a transpose the
        target skipped keeps every statistic of a square weight, not its elements)."""
        bench = dict(p.bench.inputs).get(name)
        target = next((m for n, m, _, _ in p.inputs if n == name), None)
        if not isinstance(bench, TensorMeta) or not isinstance(target, TensorMeta) \
                or tuple(bench.shape) != tuple(target.shape) or self.floors is None:
            return False
        carried = max(_row_error(row) or 0.0, row.rtol or 0.0)
        st_b, st_t = getattr(bench, "stats", None), getattr(target, "stats", None)
        peak = sample_peak(st_b) if st_b is not None else math.nan
        on_stats = statistics_only.stats_difference(st_b, st_t) / peak if st_t is not None and peak > 0 else 0.0
        differs = max(on_stats if math.isfinite(on_stats) else 0.0, statistics_only.sample_error(bench, target))
        return differs > self.floors.rules.precision_factor * carried

    def _row_of_bench(self, src: Source) -> CompareRow | None:
        """The row of the bench's output ``src`` (an op's), as ``source_kind`` picks it."""
        e = self.target_of.get(src.seq)
        rows = self.rows_of.get(e.pos) if e is not None else None
        if not rows:
            return None
        return rows[src.index] if src.index < len(rows) else rows[0]

    def bench_entry(self, seq: int) -> Entry | None:
        """The bench's record ``seq``, or None."""
        if not len(self._bench):
            return None
        if self._bench_pos is None:
            self._bench_pos = self._bench.table.seq_index()
        pos = self._bench_pos.pos(seq)
        return self._bench[pos] if pos is not None else None

    def folded_on_the_bench(self, e: Entry) -> bool:
        """Whether a target op record with no bench partner is a call the bench folded into a
        record of another signature, not an op only the target runs: either side is
        de-duplicated, and the bench ran that op exactly as many times as the target. De-dup
        keys a call by its arguments' strides and dtypes too, so a device that lays a tensor out
        its own way (channels-last where the CPU is contiguous) records a call the bench folded."""
        calls = self.call_counts()
        if calls is None or e.kind != "op":
            return False
        bench, target = calls
        return bench.get(e.op, 0) == target.get(e.op, -1)

    def call_counts(self) -> tuple[dict, dict] | None:
        """Each side's calls per op, folded ones included; None where neither side folded any
        (or a side has no columns): then no record is a call the other side folded."""
        if self._calls is False:
            from ..dump.column_scan import native_columns, op_call_counts

            sides = [native_columns(d) if d is not None else None for d in (self.bench_dump, self.dump)]
            folded = any(c is not None and len(c.records) and bool((c.records["count"] > 1).any()) for c in sides)
            self._calls = None if None in sides or not folded else tuple(op_call_counts(c) for c in sides)
        return self._calls

    @property
    def folds_per_module(self) -> bool:
        """The target dump's de-dup folded a call into a record of its own module (config
        ``dedup_scope``, written since stop 42; before, into any module's)."""
        header = getattr(self.dump, "header", None) or {}
        return (header.get("config") or {}).get("dedup_scope") == "module"

    def fold_of(self, seq: int) -> tuple[int, int, int] | None:
        """(record seq, src_seq, src_k) of a call de-dup folded (the dump's folds table, written
        since stop 41: the record it was folded into, its first argument's producer), or None."""
        folds = self.folds()
        return folds[0].fold_of(seq) if folds is not None and len(folds[0].folds) else None

    def producer(self, meta: Any, consumer_seq: int | None = None) -> tuple[str, Any]:
        """("param"|"input"|"failing"|"settled"|"target-only"|"unrecorded"|"none", detail). A
        target-only op that moved its input's values unchanged (an autocast's widening cast,
        seen by its statistics: _same_values_by_statistics) is looked through to that input's
        producer."""
        kind, detail = self._producer(meta, consumer_seq)
        for _ in range(MAX_REGION):
            if kind != "target-only" or not _same_values_by_statistics(detail):
                break
            kind, detail = self._producer(detail.inputs[0][1], detail.record.seq)
        return kind, detail

    def _producer(self, meta: Any, consumer_seq: int | None = None) -> tuple[str, Any]:
        src = source_of(meta)
        if src is None and consumer_seq is not None and self.made:
            src = self._infer(meta, consumer_seq)
        if src is None:
            return "none", None
        return self.source_kind(src)

    def source_kind(self, src: Source) -> tuple[str, Any]:
        """``producer``'s answer for a data edge: through folded calls that only move values
        (the folds table) to the call that made them."""
        if src.kind in ("param", "buffer"):
            return "param", src.name
        if src.kind == "input":
            return "input", None
        e = self.by_seq.get(src.seq)
        for _ in range(MAX_REGION):  # a folded view, transpose or detach: its argument's producer
            fold = self.fold_of(src.seq) if e is None else None
            record = self.by_seq.get(fold[0]) if fold is not None else None
            if record is None or fold[1] < 0 or not is_value_preserving(record.op):
                break
            src = Source("op", seq=fold[1], index=fold[2])
            e = self.by_seq.get(src.seq)
        if e is None:
            return "unrecorded", src.seq
        rows = self.rows_of.get(e.pos)
        if rows is None:
            return "target-only", e
        row = rows[src.index] if src.index < len(rows) else rows[0]
        return ("failing" if row.status in FAILING or _random(row) else "settled"), row

    def _infer(self, meta: Any, consumer_seq: int) -> Source | None:
        fp = _fingerprint(meta)
        if fp is None:
            return None
        earlier = [sk for sk in self.made.get(fp, ()) if sk[0] < consumer_seq]
        if earlier:
            return Source("op", seq=earlier[-1][0], index=earlier[-1][1])
        # from outside the recorded ops: parameters require grad, model inputs do not
        where = self.by_seq[consumer_seq].path if consumer_seq in self.by_seq else ""
        return Source("param", name=f"<a parameter used in {where or 'the model'}>") if meta.requires_grad \
            else Source("input")

    def target_only_origin(self, e: Entry) -> tuple[str, Any]:
        """A target-only op is the origin unless a failing matched record feeds it (walked back
        through chains of target-only ops)."""
        kind, detail, _ = self.region(e)
        return kind, detail

    def region(self, e: Entry) -> tuple[str, Any, Sequence[Entry]]:
        """The target-only ops behind ``e`` (itself included), walked back to matched records:
        ("failing", row, ops) at the first failing one met, else ("target-only", e, ops). Not
        cached: a producer's row may settle after a consumer asked (``_decide_again``)."""
        seen, todo, ops = set(), [e], []
        while todo:
            cur = todo.pop()
            if cur.pos in seen:
                continue
            seen.add(cur.pos)
            ops.append(cur)
            passed = _passed_on(cur)
            for name, m in cur.inputs:
                if passed is not None and name != passed:
                    continue  # its output is that input's values: what else it read did not matter
                kind, detail = self.producer(m, cur.record.seq)
                if kind == "failing":
                    return "failing", detail, ops
                if kind == "target-only":
                    todo.append(detail)
        return "target-only", e, ops

    def forward_call(self, e: Entry, bench: bool) -> Entry | None:
        """The forward record of the module call whose backward is ``e`` (module dumps)."""
        if self._forward is None:
            self._forward = [{(x.path, x.record.call_index, x.record.step): x for x in side
                              if x.kind == "module" and x.direction == "forward"} for side in self._entries]
        return self._forward[0 if bench else 1].get((e.path, e.record.call_index, e.record.step))

    def judge_target_only(self, e: Entry, substituted: bool) -> tuple[str, Any]:
        """("failing", row) when a failing matched record feeds the target-only ops that made
        this value; ("target-only", op) naming the op where the difference enters; or
        ("computed", why) when every one of them computed right on its own inputs.

        ``substituted``: the bench made the value with ops of its own (a CUDA math-form
        attention for the CPU's fused kernel): each target-only op is then judged by its local
        error against its device floor. Otherwise the ops were inserted on an edge both runs
        share: only value-preserving ops and casts that change nothing beyond their dtype's
        rounding are harmless (an inserted ``x * 1.001`` computes right, and is the bug)."""
        kind, detail, ops = self.region(e)
        if kind == "failing" or self.floors is None or self.dump is None or len(ops) > MAX_REGION:
            return kind, detail
        casts, unmeasured = [], False
        for op in sorted(ops, key=lambda x: x.record.seq):  # the first op beyond its floor is named
            key = (op.pos, substituted)
            if key not in self._within:
                self._within[key] = self._computed_right(op, substituted)
            if self._within[key] is False:
                return "target-only", op
            if self._within[key] is None and not unmeasured:
                unmeasured = True
                self.wrong.setdefault(e.pos, _unmeasured_why(op))
            cast = _cast_of(op)
            if cast:
                casts.append(cast)
        if unmeasured:
            return "target-only", e
        why = f"{len(ops)} target-only op(s) from {e.name} back computed right on their inputs"
        return "computed", why + (f" ({casts[0]}: precision loss)" if casts else "")

    def another_function(self, p: Pending, name: str, e: Entry) -> str | None:
        """Why target-only op ``e``, right on its own inputs, is no other kernel of the bench's
        computation, or None. The bench made input ``name`` of ``p`` with one op of its own from
        the values ``e`` reads (each tensor argument's producers a matched pair, or one parameter);
        ``e``'s op run on that op's sampled inputs must then give its sampled output
        (``sample_local.swapped_local_error``). GELU run as SiLU is each op right on its own
        inputs, and another function of the same values; a fused attention for a decomposed one
        has no single bench op to run it against, and is not judged here."""
        return self._against_the_bench_maker(dict(p.bench.inputs).get(name), e)

    def swapped_for(self, e: Entry) -> str | None:
        """``another_function`` for a target-only op ``e`` whatever its consumers' status: each
        matched consumer of what ``e`` makes (through target-only moves and casts) against the
        bench op that made the same argument of its partner. GELU run as SiLU under bf16 can hand
        on a value within bf16's band, so no consumer fails, yet the two compute other functions
        of one value."""
        if e.kind != "op" or self.floors is None or is_value_preserving(e.op) or is_cast(e.op):
            return None
        todo, seen = [(e.record.seq, 0)], set()
        while todo and len(seen) < MAX_REGION:
            made = todo.pop()
            seen.add(made)
            for seq in self.readers(made[0], made[1]):
                reader = self.by_seq.get(seq)
                rows = self.rows_of.get(reader.pos) if reader is not None else None
                if reader is None or not rows:  # a target-only move or cast hands it on
                    if reader is not None and (is_value_preserving(reader.op) or is_cast(reader.op)) \
                            and (seq, 0) not in seen:
                        todo.append((seq, 0))
                    continue
                partner = self.bench_entry(rows[0].bench_seq) if rows[0].bench_seq is not None else None
                if partner is None:
                    continue
                theirs = dict(partner.inputs)
                for name, m in reader.inputs:
                    src = source_of(m)
                    if src is not None and src.kind == "op" and (src.seq, src.index) == made \
                            and (why := self._against_the_bench_maker(theirs.get(name), e)) is not None:
                        return why
        return None

    def readers(self, seq: int, index: int) -> list[int]:
        """The seqs of the target's records that read output ``index`` of its call ``seq``."""
        if self._readers is None:
            self._readers = {}
            cols = self._columns[1]
            if cols is not None and len(cols.tensors):
                from ..dump.columns import INPUT, SRC_OP

                t = cols.tensors
                rows = np.flatnonzero((t["role"] == INPUT) & (t["src_kind"] == SRC_OP))
                readers = cols.records["seq"][t["record"][rows]]
                for src, i, reader in zip(t["src_seq"][rows].tolist(), t["src_index"][rows].tolist(), readers.tolist()):
                    got = self._readers.setdefault((src, i), [])
                    if not got or got[-1] != reader:
                        got.append(reader)
        return self._readers.get((seq, index), [])

    def _against_the_bench_maker(self, bench_meta: Any, e: Entry) -> str | None:
        """``another_function``'s test of ``e`` against the bench-only op that made ``bench_meta``."""
        src = _op_source(bench_meta)
        b = self.bench_entry(src.seq) if src is not None and src.seq not in self.target_of else None
        if b is None or b.kind != "op" or e.kind != "op" or self.floors is None \
                or any(is_value_preserving(x) or is_cast(x) for x in (e.op, b.op)):
            return None
        key = (e.pos, src.seq)
        if key not in self._swapped:
            self._swapped[key] = self._swapped_why(b, e, src.index or 0)
        return self._swapped[key]

    def _swapped_why(self, b: Entry, e: Entry, k: int) -> str | None:
        """Why ``e`` computes another function than bench op ``b`` (its output ``k``) of the same
        values, or None: not the same values, not measurable on the samples, or within the floor."""
        ours, theirs = tensor_arguments(e.record), tensor_arguments(b.record)
        if not ours or theirs is None or len(ours) != len(theirs):
            return None
        for (_, mt), (_, mb) in zip(ours, theirs):  # the same values on both sides
            kind, detail = self.producer(mt, e.record.seq)
            sb = source_of(mb)
            same = sb is not None and (
                kind == "settled" and sb.kind == "op" and detail is self._row_of_bench(sb)
                or kind == "param" and sb.kind in ("param", "buffer") and detail == sb.name)
            if not same:
                return None
        le = swapped_local_error(b.record, e.record, k)
        if le is None or not self.floors.beyond(le, e.op, 1):
            return None
        return (f"right on its own inputs, yet run on the sampled inputs of the bench's {b.name} it is "
                f"{le.local:.3g} off that call's output (floor {self.floors.floor(le, e.op, 1):.3g}): "
                "another function of the same values")

    def _computed_right(self, op: Entry, substituted: bool) -> bool | None:
        """True: within its floor (and, when inserted, value-preserving, or passing one input on
        unchanged); False: beyond it; None: not measurable."""
        if not substituted and _passed_on(op) is not None:
            return True
        if not substituted and not is_value_preserving(op.op):
            return False
        measured = False
        for k, (_, meta) in enumerate(op.outputs):
            # saved, a constant, or a recorded self-check; else (a kernel the bench ran too) its
            # sample or what it moved
            le = local_error(op.record, self.dump, meta, k) if measurable(meta, op.op) \
                else _unsaved_local_error(op.record, meta, k) if substituted else None
            if le is None:
                continue
            measured = True
            floor = self.floors.floor(le, op.op, reduction_length(op.record, k))
            if le.local > floor:
                if substituted:
                    self.wrong[op.pos] = (f"wrong on its own inputs (local error {le.local:.3g} vs floor {floor:.3g}) "
                                          "where the bench ran ops of its own")
                return False
            if not substituted and _changed_beyond_rounding(op, meta, self.dump, self.floors.rules):
                return False
        if not measured and not substituted and is_cast(op.op) and op.inputs and op.outputs:  # statistics only
            return statistics_only.cast_rounds_only(op.inputs[0][1], op.outputs[0][1], self.floors.rules.local_factor)
        return True if measured or is_value_preserving(op.op) and substituted else None


def _passed_on(op: Entry) -> str | None:
    """The input whose values ``op``'s one output holds unchanged: the same shape and dtype, the
    same sample bit for bit, and statistics of one multiset (``same_multiset``), or None. A clamp's backward
    (``where(lo <= x <= hi, grad, 0)``, run only where the model clamps float16 values) passes
    its gradient on where nothing was clamped: an op of another name that moved no value."""
    if len(op.outputs) != 1 or not isinstance(out := op.outputs[0][1], TensorMeta) \
            or not dtype_from_name(out.dtype).is_floating_point:
        return None
    for name, m in op.inputs:
        if not isinstance(m, TensorMeta) or m.dtype != out.dtype or tuple(m.shape) != tuple(out.shape):
            continue
        a, b = m.stats, out.stats
        if a is None or b is None or not a.sample or a.sample != b.sample:
            continue
        if all(getattr(x, f) is not None for x in (a, b) for f in ("min", "max", "mean", "std")) \
                and same_multiset(a, b):
            return name
    return None


def _unmeasured_why(op: Entry) -> str:
    """Why a target-only op is not judged, and what recording would judge it."""
    tensors = [m for _, m in (*op.inputs, *op.outputs) if isinstance(m, TensorMeta)]
    saved = sum(m.data is not None for m in tensors)
    if saved == len(tensors):
        return f"not judged: {op.name} cannot be recomputed here"
    need = max(sum(isinstance(m, TensorMeta) for _, m in side) for side in (op.inputs, op.outputs))
    return (f"not judged: {op.name} has {saved} of the {len(tensors)} tensors it reads and writes saved "
            f"(X_DUMP_NUM); record with X_DUMP_NUM={need} (so many inputs and outputs) to judge it")


def _same_values_by_statistics(op: Entry) -> bool:
    """Statistics only: a value-preserving op (a view, a widening cast) whose output statistics
    are its first input's (one multiset) moved its values unchanged (a float16 -> float32 cast
    always does).
    Of one shape, its sample must be its input's too: a square matrix transposed keeps every
    statistic and puts its elements elsewhere (a weight used transposed)."""
    if not op.outputs or not op.inputs or not is_value_preserving(op.op):
        return False
    out, first = op.outputs[0][1], op.inputs[0][1]
    a, b = (getattr(m, "stats", None) for m in (out, first))
    # one multiset by its statistics (moved_values.same_multiset): a bf16 tensor's spread and its
    # float32 copy's are summed in other orders, and differ in their eighth digit
    if a is None or b is None or any(getattr(x, f) is None for x in (a, b) for f in ("min", "max", "mean", "std")) \
            or getattr(out, "numel", None) != getattr(first, "numel", None) or not same_multiset(a, b):
        return False
    samples = [getattr(getattr(m, "stats", None), "sample", None) for m in (out, first)]
    return getattr(out, "shape", None) != getattr(first, "shape", None) or None in samples \
        or tuple(samples[0]) == tuple(samples[1])


MAX_REGION = 64  # target-only ops judged one by one behind one input; a longer region stays the origin
# What an input may carry for "its output moves at most a few times as much" to hold: the first
# order of small perturbations. Beyond it a square or a quotient moves its output without bound (a
# key bias's gradient, 0 in exact arithmetic and rounding noise on both runs, then Adam's g * g).
LINEAR_REGIME = 0.1


def _cast_of(op: Entry) -> str | None:
    ins = [m for _, m in op.inputs if hasattr(m, "dtype")]
    outs = [m for _, m in op.outputs]
    return cast_class(op.op, ins[0].dtype, outs[0].dtype) if ins and outs else None


def _changed_beyond_rounding(op: Entry, meta: Any, dump: Any, rules: Any) -> bool:
    """An inserted op's output against its same-size float input: more than its dtype's rounding?"""
    feeds = [m for _, m in op.inputs if getattr(m, "data", None) is not None and tuple(m.shape) == tuple(meta.shape)]
    if len(feeds) != 1:
        return False
    try:
        before, after = dump.load_tensor(feeds[0]), dump.load_tensor(meta)
    except (KeyError, OSError, ValueError):
        return False
    if not (before.is_floating_point() and after.is_floating_point()):
        return False
    change = normwise_error(after.reshape(-1), before.reshape(-1).to(after.dtype).to(torch.float64),
                            torch.finfo(after.dtype).tiny)
    return change > rules.local_factor * eps(after.dtype)


def _fingerprint(meta: Any) -> tuple | None:
    st = getattr(meta, "stats", None)
    if st is None or st.mean is None:
        return None
    return (tuple(meta.shape), meta.dtype, st.min, st.max, st.mean, st.std, st.nan, st.posinf, st.neginf)


def _held_alike(a: Any, b: Any) -> bool:
    """Two reads with the same statistics and sample, bit for bit."""
    fa = _fingerprint(a)
    return fa is not None and fa == _fingerprint(b) and a.stats.sample == b.stats.sample


def _random(r: CompareRow) -> bool:
    """A row skipped because its values are random by nature, or made from such values that
    differ: what it feeds differs by nature."""
    return r.status == PairStatus.SKIP.value and (r.note.startswith("values not compared") or RANDOM_DRAWS in r.note)


# records looked at for the one a folded call belongs to (their calls span its seq)
MAX_FOLD_CANDIDATES = 256


class _SeenPrecision:
    """The largest error (max |target - bench| / max |bench|) that calls so far, in execution
    order, showed as precision: rows within the compare's rules, and rows downgraded to
    precision loss. Rounding grows with depth, a call at a time; a bug jumps. ``origin``: an
    error was born in a recorded call before (random values that differ are not one: the data
    edges follow where they go)."""

    def __init__(self) -> None:
        self.level = 0.0
        self.origin = False

    def add(self, r: CompareRow) -> None:
        if r.status == PairStatus.WARNING.value and r.mode == "data" and r.accumulated_err is not None \
                and math.isfinite(r.accumulated_err):
            self.level = max(self.level, r.accumulated_err)


class _Inherited:
    """Rows decided inherited, to decide again (``_decide_again``) with what was seen before them:
    pair, output, born_seen and a copy of _SeenPrecision, as columns (every row of a run that
    diverged early is one: a tuple and a copy each would be a million objects)."""

    def __init__(self) -> None:
        self.pair, self.k, self.level, self.flags = array("i"), array("i"), array("d"), bytearray()

    def add(self, p: Pending, k: int, born_seen: bool, seen: _SeenPrecision) -> None:
        self.pair.append(p.index)
        self.k.append(k)
        self.level.append(seen.level)
        self.flags.append(bool(born_seen) | bool(seen.origin) << 1)

    def rows(self, pending: PendingRun) -> Iterator[tuple[CompareRow, Pending, int, bool, _SeenPrecision]]:
        """(row, pair, output, born_seen, seen) of each, in the order added."""
        for i, k, level, flags in zip(self.pair, self.k, self.level, self.flags):
            p, seen = pending[i], _SeenPrecision()
            seen.level, seen.origin = level, bool(flags & 2)
            yield p.rows[k], p, k, bool(flags & 1), seen


def _carried_from_unrecorded(r: CompareRow, p: Pending, k: int, name: str, seq: Any, seen: _SeenPrecision,
                             floors: Floors, graph: _Graph) -> str | None:
    """Why a row whose disagreeing input comes from a call the dump does not hold (folded by
    de-dup) is precision carried in, or None (then it stays an inherited failure).

    De-dup records a signature's first call only, so a layer's later calls leave gaps in the data
    edges. Where this op computed right on its own inputs (or only moves values) and no recorded
    call before it was an origin, what it carries comes from calls like the recorded ones; it is
    called precision when the error it carries in (input ``name``'s; the row's own when that
    input was not judged on data; that input's statistics' error when neither was) is within
    ``precision_factor`` x the largest error calls
    before it showed as precision: rounding grows through the calls xray did not see, a bug
    among them jumps. What this op made of it is its own: it computed right, and a max pool's
    backward, say, moves a gradient whole where its forward chose another element. Where no
    local error was measured (not every input saved: X_DUMP_NUM counts each side), its error
    (its statistics' where its outputs were not saved) must stay within the factor of the most
    any of its inputs carries in. A
    run with no such error (the same kernels on both sides), or a jump beyond that, keeps the
    failure: something xray did not see went wrong.
    """
    f = floors.rules.precision_factor
    err = p.input_errors.get(name, r.accumulated_err)
    if err is None:  # a row judged on statistics (X_DUMP_NUM spent): that input's statistics' error
        err = next((e for n, _, _, e in row_inputs(p, k) if n == name), None)
    if err is None or not math.isfinite(err):
        return None
    # beyond the level (or no level yet: nothing before it showed precision loss): still rounding
    # where the folded call is a sum that cancels what its recorded argument carries
    through = (_folded_sum(graph, p, name, seq, f) or _folded_cast(graph, p, k, name, seq, f)
               or _folded_product(graph, p, name, seq, f)) if err > f * seen.level else ""
    if through is None:
        return None
    if p.local.get(k) is not None or (is_value_preserving(p.target.op) and not r.layout):
        how = "it computed right on its inputs"
    elif r.mode == "stats" and r.stats_err is not None and r.stats_err <= f * (carried := _carried_in(p, k, err)):
        how = f"its statistics' error {r.stats_err:.3g} is within {f:g}x of what its inputs carry ({carried:.3g})"
    elif r.mode == "data" and r.accumulated_err is not None and p.local.get(k) is None \
            and r.accumulated_err <= f * (carried := _carried_in(p, k, err)):
        # its outputs saved, not all its inputs (X_DUMP_NUM per side): nothing recomputed, as above
        how = f"its error {r.accumulated_err:.3g} is within {f:g}x of what its inputs carry ({carried:.3g})"
    elif through and r.mode == "stats" and p.local.get(k) is None:
        # as a recorded producer's precision loss is carried (local error not measured): a
        # square of a value that is rounding (an optimizer's second moment) is rounding too
        how = "its own local error is not measured"
    else:
        return None
    unseen = "recorded on the target only" if seq in graph.by_seq else "not recorded"
    if through:
        return (f"carries a difference from op seq {seq}, {unseen} (de-duplicated): {through}, and {how}; "
                "record with X_DEDUP=0 to judge that call")
    return (f"carries a difference from op seq {seq}, {unseen} (de-duplicated): {name}'s error {err:.3g} "
            f"is within {f:g}x the precision loss calls before it show ({seen.level:.3g}), and {how}; "
            "record with X_DEDUP=0 to judge that call")


def _folded_cast(graph: _Graph, p: Pending, k: int, name: str, seq: Any, f: float) -> str | None:
    """Input ``name`` (of output ``k``) comes from folded call ``seq``, a cast of a matched record's output (the
    folds table names it): the reason when the input's difference is within ``f`` x what that
    output carries plus the cast's rounding, measured alike (saved data against data,
    statistics and samples against theirs); else None. A bf16 run casts a layer norm's input
    gradient, the rounding of a sum that cancels, to bfloat16: it differs by 27 % there, as
    it already did before the cast."""
    fold = graph.fold_of(seq) if isinstance(seq, int) else None
    rep = graph.by_seq.get(fold[0]) if fold is not None else None
    if rep is None or fold[1] < 0 or not is_cast(rep.op) or not rep.outputs:
        return None
    kind, row = graph.source_kind(Source("op", seq=fold[1], index=fold[2]))
    if kind != "settled" or row.status not in (PairStatus.PASS.value, PairStatus.WARNING.value):
        return None
    if name in p.input_errors:
        err, carried = p.input_errors[name], row.accumulated_err
    else:
        err = next((e for n, _, _, e in row_inputs(p, k) if n == name), None)
        carried = max((e for e in (row.stats_err, row.sample_err) if e is not None), default=None)
    try:
        rounding = float(torch.finfo(dtype_from_name(rep.outputs[0][1].dtype)).eps)
    except (TypeError, ValueError, AttributeError):
        return None
    if err is None or carried is None or not math.isfinite(carried) or err > f * (carried + rounding):
        return None
    return (f"a cast of {_row_name(row)}, whose difference ({err:.3g}) is within {f:g}x what that output "
            f"carries ({carried:.3g}) and the cast's rounding")


def _folded_sum(graph: _Graph, p: Pending, name: str, seq: Any, f: float) -> str | None:
    """Input ``name`` comes from folded call ``seq``, a sum whose argument a recorded call made
    (through folded views; or a call folded into that record) and carries precision loss: ``statistics_only.folded_sum``'s reason
    when the sum's difference between the runs, at that argument's magnitude, is within the
    factor of that loss; else None. Needs the dump's folds table."""
    fold = graph.fold_of(seq) if isinstance(seq, int) else None
    rep = graph.by_seq.get(fold[0]) if fold is not None else None
    if rep is None or fold[1] < 0:
        return None
    kind, row = graph.source_kind(Source("op", seq=fold[1], index=fold[2]))
    if kind == "unrecorded" and (argument_fold := graph.fold_of(fold[1])) is not None:
        # the argument's call was folded too: its record (one signature, module and input roles:
        # a call like it) stands for it, as the recorded calls stand for their folds
        kind, row = graph.source_kind(Source("op", seq=argument_fold[0], index=fold[2]))
    if kind != "settled" or row.status not in (PairStatus.PASS.value, PairStatus.WARNING.value):
        return None
    carried = row.accumulated_err if row.accumulated_err is not None else row.stats_err
    made = graph.by_seq.get(row.target_seq)
    arg = next((m for n, m in made.outputs if n == row.tensor), None) if made is not None else None
    b, t = (dict(e.inputs).get(name) for e in (p.bench, p.target))
    if carried is None or arg is None or b is None or t is None:
        return None
    return statistics_only.folded_sum(rep, carried, arg.stats, b.stats, t.stats, f)


def _folded_product(graph: _Graph, p: Pending, name: str, seq: Any, f: float) -> str | None:
    """Input ``name`` comes from folded call ``seq``, a product whose first factor a recorded
    call made on the target (the folds table names it), and whose counterpart the bench recorded
    (the bench's producer of the same input, the same op): ``statistics_only.folded_product``'s
    reason, from that factor's statistics on both sides; else None."""
    fold = graph.fold_of(seq) if isinstance(seq, int) else None
    rep = graph.by_seq.get(fold[0]) if fold is not None else None
    made = graph.by_seq.get(fold[1]) if rep is not None and fold[1] >= 0 else None
    b_in, t_in = (dict(e.inputs).get(name) for e in (p.bench, p.target))
    src = _op_source(b_in)
    theirs = graph.bench_entry(src.seq) if made is not None and src is not None else None
    if theirs is None or theirs.op != rep.op or fold[2] >= len(made.outputs):
        return None
    arg_b = next((m for _, m in theirs.inputs if isinstance(m, TensorMeta)), None)
    arg_t = made.outputs[fold[2]][1]
    return statistics_only.folded_product(rep, *(getattr(m, "stats", None) for m in (arg_b, arg_t, b_in, t_in)), f)


def _folded_where(graph: _Graph, seq: int) -> str:
    """Where a folded call ran, told by the calls recorded around it (its own record is an
    earlier call's): "; ran inside <module>, between seq A and seq B" when both ran in one
    module, else the two neighbours' modules. Empty when neither is known."""
    if graph.around is None:
        return ""
    fold = graph.fold_of(seq)
    record = graph.by_seq.get(fold[0]) if fold is not None and graph.folds_per_module else None
    if record is not None:  # it ran in its record's module (encode.dedup_key)
        return f"; ran inside {record.record.module}" if record.record.module else "; ran outside any module"
    before, after = graph.around(seq)
    if before is None and after is None:
        return ""

    def where(e: Any) -> str:
        return f"{e.op} in {e.record.module}" if e.record.module else f"{e.op}, outside any module"

    if before is not None and after is not None:
        common = _common_module(before.record.module or "", after.record.module or "")
        span = f"between seq {before.record.seq} and seq {after.record.seq}"
        return f"; ran inside {common}, {span}" if common else \
            f"; ran {span}: after {where(before)}, before {where(after)}"
    e, side = (before, "after") if before is not None else (after, "before")
    return f"; ran {side} seq {e.record.seq} ({where(e)})"


def _folded_into(graph: _Graph, seq: int, meta: Any) -> str:
    """The record a folded call was folded into, where one fits: a record of the target dump
    whose calls span ``seq`` (first_seq < seq <= last_seq) and one of whose outputs has the
    consumer's input's shape and dtype. De-dup folds a call into the record of its signature,
    so that record's op is the folded call's. Empty when none or several fit (v3 dumps only:
    their columns hold the spans)."""
    fold = graph.fold_of(seq)
    record = graph.by_seq.get(fold[0]) if fold is not None else None
    if record is not None:  # the dump's folds table says: exact
        return f"; a call of {record.op}, folded into its record seq {record.record.seq} " \
               f"({record.record.module or 'outside any module'})"
    shape, dtype = getattr(meta, "shape", None), getattr(meta, "dtype", None)
    folds = graph.folds()
    if folds is None or shape is None:
        return ""
    key = (seq, tuple(shape), dtype)
    if key not in graph.folded_into:
        columns, rows, first, last = folds
        fits = []
        for i in rows[(first < seq) & (last >= seq)][:MAX_FOLD_CANDIDATES].tolist():
            rec = columns.record(i)
            if rec.kind == "op" and any(list(m.shape) == list(shape) and m.dtype == dtype
                                        for _, m in rec.output_tensors()):
                fits.append(rec)
        graph.folded_into[key] = "" if len(fits) != 1 else \
            f"; a call of {fits[0].op}, folded into its record seq {fits[0].seq} ({fits[0].module or 'outside any module'})"
    return graph.folded_into[key]


def _common_module(a: str, b: str) -> str:
    """The innermost module path both dotted paths lie in ("" when none)."""
    common = []
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        common.append(x)
    return ".".join(common)


# Arguments that say where and how a value is stored or which kernel runs it, never what it is:
# they differ legitimately across devices, precisions and layouts (autocast's casts, CUDA's
# half_to_float softmax), and names a run gives its process groups
_STORAGE_TAGS = frozenset(("dtype", "device", "layout", "memory_format"))  # a value of these kinds, whatever its name
_HOW_STORED = frozenset(("device", "dtype", "layout", "memory_format", "pin_memory", "non_blocking", "copy",
                         "generator", "half_to_float", "cudnn_enabled", "group_name", "tag",
                         "benchmark", "deterministic", "allow_tf32"))  # (cudnn's convolution knobs)


def _differing_argument(p: Pending, r: CompareRow, k: int, graph: "_Graph") -> str | None:
    """Why the target's call ran with other arguments than the bench's, or None: a non-tensor
    argument of another value (an eps, a scale, gelu's approximation, a training flag), or a
    tensor argument one side passes and the other does not (an attention mask the target dropped)
    or passes in another shape. The target then computes right on its own inputs and arguments,
    so no local error shows it, yet it is a different computation: "argument eps differs: bench
    1e-05, target 1". Tensor values are judged along their data edges, as inputs.

    Where the target's inputs were saved, the call is re-run with the bench's arguments (and the
    tensors only the bench passed, where saved): a target output that agrees with that is the
    same computation spelled otherwise (``is_causal`` for a causal mask), no argument cause.
    Decided once per output (``Pending.argument``)."""
    if k not in p.argument:
        p.argument[k] = _argument_verdict(p, r, k, graph)
    return p.argument[k]


def _argument_verdict(p: Pending, r: CompareRow, k: int, graph: "_Graph") -> str | None:
    differing = _differing_arguments(p, r, graph.floors)
    if not differing:
        return None
    why = "; ".join(differing.values())
    le = p.local.get(k)
    bench, target = p.bench.record, p.target.record
    if le is None or bench.op != target.op or k >= len(p.target.outputs):
        return why  # nothing recomputed: the arguments' own difference decides
    taken = {n: v for n, v in bench.inputs.items() if _recomputed_with(n, v, target.inputs)}
    with_bench = local_error_with(target, graph.dump, p.target.outputs[k][1], k, taken, graph.bench_dump)
    if with_bench is None:
        return why
    floor = graph.floors.floor(with_bench, p.target.op, p.reduce.get(k, 1))
    # the same computation spelled otherwise (is_causal for a causal mask) reads what the target's
    # own arguments read, its rounding: measured against that, not against the device's floor,
    # under which a bf16 attention's doubled scale hides (a 2 % change, a floor of 3.5 %)
    if with_bench.local <= max(graph.floors.rules.precision_factor * le.local, le.floor):
        return None
    if not graph.floors.beyond(le, p.target.op, p.reduce.get(k, 1)):
        return (f"{why}; on the target's inputs it computes right with its own arguments (local error "
                f"{le.local:.3g}) and is off by {with_bench.local:.3g} from the bench's")
    return (f"{why}; on the target's inputs it is off by {le.local:.3g} with its own arguments and by "
            f"{with_bench.local:.3g} with the bench's (floor {floor:.3g})")


def _recomputed_with(name: str, bench_value: Any, target_inputs: dict) -> bool:
    """Whether the bench's argument ``name`` replaces the target's in a re-run: its non-tensor
    arguments (not how values are stored: the target's dtype stays), and a tensor argument one
    side alone passes; where both pass a tensor, it is the target's input."""
    if name in _HOW_STORED or isinstance(bench_value, Scalar) and bench_value.tag in _STORAGE_TAGS:
        return False
    return not (_holds_tensor(bench_value) and _holds_tensor(target_inputs.get(name)))




def _differing_arguments(p: Pending, r: CompareRow, floors: Floors) -> dict[str, str]:
    """Argument name -> how it differs between the two calls (``_differing_argument``)."""
    bench, target = p.bench.record, p.target.record
    if bench.kind != "op" or target.kind != "op" or is_value_preserving(target.op):
        return {}  # a view's sizes say only where values go, and may be spelled -1 on one side
    same_op = bench.op == target.op
    if same_op:
        b_args, t_args = bench.inputs, target.inputs
    else:  # two kernels of one family: the arguments both name (kernel flags left out)
        family = family_of(bench.op)
        if family is None or family is not family_of(target.op):
            return {}
        b_args, t_args = (family.argument_names(x.inputs) for x in (bench, target))
        # their tensors are the inputs (a kernel's own ones differ: CUDA pads its logsumexp), but a mask
        shared = {n for n in b_args.keys() & t_args.keys()
                  if n == "attn_mask" or not (_holds_tensor(b_args[n]) or _holds_tensor(t_args[n]))}
        b_args, t_args = ({n: v for n, v in x.items() if n in shared} for x in (b_args, t_args))
    try:
        rtol = floors.rules.tolerance(r.bench_dtype or "float32", r.target_dtype).rtol
    except (ValueError, TypeError):
        rtol = floors.rules.tolerance("float32").rtol
    out: dict[str, str] = {}
    for name in [*b_args, *(n for n in t_args if n not in b_args)]:
        b, t = b_args.get(name, _ABSENT), t_args.get(name, _ABSENT)
        if name in _HOW_STORED or any(isinstance(v, Scalar) and v.tag in _STORAGE_TAGS for v in (b, t)):
            continue
        if _holds_tensor(b) or _holds_tensor(t):
            # a side that recorded any argument records every tensor: absent there is not a tensor
            if (b is _ABSENT and not b_args) or (t is _ABSENT and not t_args):
                continue
            why = _tensor_argument_differs(b, t)
            if why:
                out[name] = f"argument {name} differs: {why}"
            continue
        if b is _ABSENT or t is _ABSENT:
            continue  # not recorded on one side (no META there)
        b, t = _meant(name, b, bench), _meant(name, t, target)
        if not _same_argument(b, t, rtol):
            out[name] = f"argument {name} differs: bench {_shown(b)}, target {_shown(t)}"
    return out


class _Absent:
    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()


def _tensor_argument_differs(b: Any, t: Any) -> str | None:
    """How a tensor argument differs in kind or shape (its values are judged as an input), or None.
    In a list, items that hold no tensor on either side (``index``'s None for a dimension taken
    whole) are the same where they are equal."""
    if not (_holds_tensor(b) or _holds_tensor(t)):
        return None if b == t else f"bench {_described(b)}, target {_described(t)}"
    if not (_holds_tensor(b) and _holds_tensor(t)):
        return f"bench {_described(b)}, target {_described(t)}"
    if isinstance(b, (list, tuple)) != isinstance(t, (list, tuple)):
        return f"bench {_described(b)}, target {_described(t)}"
    if isinstance(b, (list, tuple)):
        if len(b) != len(t):
            return f"bench {len(b)} tensors, target {len(t)}"
        return next((w for w in (_tensor_argument_differs(x, y) for x, y in zip(b, t)) if w), None)
    if not (isinstance(b, TensorMeta) and isinstance(t, TensorMeta)):
        return f"bench {_described(b)}, target {_described(t)}"
    if _dtype_kind(b.dtype) != _dtype_kind(t.dtype) or not _broadcast_alike(b.shape, t.shape):
        return f"bench {_described(b)}, target {_described(t)}"
    return None


def _described(v: Any) -> str:
    if isinstance(v, TensorMeta):
        return f"a {v.dtype} tensor of shape {tuple(v.shape)}"
    if isinstance(v, (list, tuple)) and _holds_tensor(v):
        return f"{len(v)} tensors"
    return "none" if v is _ABSENT or v is None else _shown(v)


def _dtype_kind(dtype: str) -> str:
    """bool, integer or floating: a mask's kind; its width (an autocast's bf16) is how it is stored."""
    d = str(dtype)
    return "bool" if d == "bool" else "float" if ("float" in d or "complex" in d) else "int"


def _broadcast_alike(a: Any, b: Any) -> bool:
    """Shapes that differ only where one is 1 (or missing): a (1, 1, L, S) mask and one a CUDA
    kernel expanded to (B, H, L, S) are the same argument; (L, S) and (L, S') are not."""
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(tuple(a or ())), reversed(tuple(b or ()))))


def _meant(name: str, v: Any, record: Any) -> Any:
    """What an argument left None stands for, where a call spells it either way: attention's
    scale=None is 1/sqrt(head size)."""
    if v is None and name == "scale":
        q = record.inputs.get("query")
        if isinstance(q, TensorMeta) and q.shape:
            return 1.0 / math.sqrt(q.shape[-1])
    return v


def _holds_tensor(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_holds_tensor(x) for x in v)
    return isinstance(v, TensorMeta)


def _same_argument(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_argument(x, y, rtol) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rtol * max(abs(a), abs(b))) \
                or _extreme_kind(a) is not None and _extreme_kind(a) == _extreme_kind(b)
    return a == b


def _extreme_kind(v: float) -> str | None:
    """"min" or "max" when ``v`` is a float dtype's extreme: a mask filled with finfo(dtype).min
    is -65504 in a float16 run and -3.4e38 in a float32 one, the same argument."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        fi = torch.finfo(dtype)
        if v == fi.min:
            return "min"
        if v == fi.max:
            return "max"
    return None


def _shown(v: Any) -> str:
    text = f"{v.value}" if isinstance(v, Scalar) else f"{v:g}" if isinstance(v, float) else f"{v}"
    return text if len(text) <= 60 else text[:57] + "..."


def _carried_in(p: Pending, k: int, at_least: float) -> float:
    """The largest error any disagreeing input of output ``k`` carries in, at least ``at_least``
    (``statistics_only.carried_error``: on data where it was judged so, else on statistics or its
    sample), grown by its sum's cancellation: a norm's mean of a residual stream that nearly
    cancels moves more, relative to itself, than the stream it averages."""
    error, grown = statistics_only.carried_error(p, k, disagreeing=True) or (0.0, statistics_only.cancellation(p, k))
    return max(at_least, error) * grown


def _decide(r: CompareRow, p: Pending, k: int, graph: _Graph, floors: Floors, born_seen: bool,
            seen: _SeenPrecision | None = None) -> None:
    causes: dict[str, tuple[str, Any]] = {}
    carried_precision = None  # a producer whose difference is measured precision loss
    computed_region = None  # target-only ops that computed right on their inputs (a substituted kernel)
    random_only = True  # every failing producer is a random op's (or fed by one) whose draws differ
    overwritten = overwritten_inputs(p.target.op)
    for name, meta, status, _ in row_inputs(p, k):
        if status in (PairStatus.PASS.value, PairStatus.SKIP.value) or name in overwritten:
            continue
        if name.startswith("forward_params."):  # v1 module dumps kept parameters among the inputs
            name = f"param:{p.target.path + '.' if p.target.path else ''}{name[len('forward_params.'):]}"
        kind, detail = ("param", _param_name(name, meta)) if name.startswith("param:") \
            else graph.producer(meta, p.target.record.seq)
        if kind == "param" and graph.written_by_the_run(meta):
            kind = "written"
        if kind == "settled" and (moved := _changed_in_a_fold(meta, status, detail, graph)) is not None:
            kind, detail = "unrecorded", moved
        if kind == "unrecorded" and (drawn := _drawn_through_folds(graph, detail)) is not None:
            kind, detail = "failing", drawn  # a folded call that moved or computed on random draws
        if kind == "settled" and status in FAILING \
                and (skipped := graph.skipped_on_the_target(p, name, detail)) is not None:
            kind, detail = "bench-only", skipped
        if kind == "settled" and detail.cause == PRECISION:
            carried_precision = carried_precision or detail
        if kind == "failing":  # whatever the input's own status: its producer already fails
            causes.setdefault(kind, (name, detail))
            random_only = random_only and _random(detail)
        if status == PairStatus.WARNING.value or kind == "settled":
            continue
        if kind == "target-only":
            e = detail
            # a call the bench ran too (folded into a record of another signature) is not an
            # inserted op: its own local error judges it, as a substituted kernel's does
            substituted = _substituted(p, name, graph)
            kind, detail = graph.judge_target_only(e, substituted or graph.folded_on_the_bench(e))
            if kind == "computed" and substituted and (why := graph.another_function(p, name, e)) is not None:
                graph.wrong.setdefault(e.pos, why)
                kind, detail = "target-only", e
            if kind == "computed" and substituted and (dropped := graph.dropped_on_the_target(p, name, e)) is not None:
                kind, detail = "bench-only", dropped
            if kind == "computed":
                computed_region = computed_region or detail
                continue
            if kind == "target-only" and (summed := reordered_sum(graph, e, p, k, name)) is not None:
                computed_region = computed_region or summed
                continue
            if kind == "target-only" and graph.folded_on_the_bench(e):  # not judged right on its own
                kind, detail = "unrecorded", e.record.seq
            if kind == "failing":  # a failing row feeds the target-only ops that made the input
                random_only = random_only and _random(detail)
        causes.setdefault(kind, (name, detail))
    le = p.local.get(k)
    op = p.target.op
    if "param" in causes:
        name, qual = causes["param"]
        set_origin(r, "born", "parameter", f"parameter {qual} differs")
    elif "target-only" in causes:
        name, e = causes["target-only"]
        wrong = graph.wrong.get(e.pos)
        set_origin(r, "born", "target-only op", f"target-only op {e.name} " + (f"is {wrong}; it " if wrong else "")
                   + f"feeds {name}")
        r.culprit_target_seq = e.record.seq
    elif "bench-only" in causes:
        name, e = causes["bench-only"]
        why = graph.dropped.get(e.record.seq) or f"makes the bench's {name}"
        set_origin(r, "born", "bench-only op", f"bench-only op {e.name} {why}; the target runs no such step")
        r.culprit_bench_seq = e.record.seq
    elif "input" in causes:
        set_origin(r, "born", "model input", f"model input {causes['input'][0]} differs")
    elif (argument := _differing_argument(p, r, k, graph)) is not None:
        set_origin(r, "born", "argument", argument)
    elif (tiny := statistics_only.below_normal_range(r, p, k)) is not None:
        downgrade(r, tiny)  # whatever its inputs carry, or a kernel that flushes subnormals makes of them
    elif _wrong_on_its_inputs(p, k, floors) and not _as_wrong_on_the_bench(p, k, floors):
        # wrong on the target's own inputs: born here, whatever those inputs were
        # the culprit is this op; its numbers are the row's local_err / local_floor columns
        set_origin(r, "born", "local error",
                   (p.outlier.get(k) or "this op, on the target's own inputs") + _wrong_on_the_bench_too(p, k, floors))
    elif statistics_only.holds_rounding(p, k, floors.rules.precision_factor, both=True):
        # (a data row too; with its local error measured, it computed right on its inputs: a wrong
        # one is born above)
        # whatever its inputs carry: a sum that cancels to its rounding on both sides shows none of it
        downgrade(r, "0 in exact arithmetic: its values are the rounding of a sum that cancels, no larger than that "
                     "rounding on either side (nothing recomputed)")
    elif "failing" in causes and random_only:
        # two runs whose random ops drew differently: nothing made of those draws can be compared
        name, row = causes["failing"]
        r.status, r.origin, r.cause, r.culprit = PairStatus.SKIP.value, "", "", ""
        r.note = "; ".join(x for x in (r.note, f"{RANDOM_DRAWS} (input {name} from {_row_name(row)})") if x)
    elif "failing" in causes:
        set_origin(r, "inherited", "inherited", f"input {causes['failing'][0]} from {_row_name(causes['failing'][1])}")
    elif "unrecorded" in causes:
        name, seq = causes["unrecorded"]
        meta = next((m for n, m, _, _ in row_inputs(p, k) if n == name), None)
        carried = None if seen is None or seen.origin \
            else _carried_from_unrecorded(r, p, k, name, seq, seen, floors, graph)
        if carried is not None:
            downgrade(r, carried)
        else:  # the error enters at a call with no matched record: it is named as the origin
            why = ("recorded on the target only: the bench de-duplicated that call into a record of another "
                   "signature" if seq in graph.by_seq  # (_Graph.folded_on_the_bench)
                   else f"not recorded: de-duplicated{'' if graph.fold_of(seq) else '?'}"
                        f"{_folded_into(graph, seq, meta)}{_folded_where(graph, seq)}")
            set_origin(r, "inherited", "inherited", f"input {name} from op seq {seq} ({why})")
            r.culprit_target_seq = seq
    elif k in p.precision:
        downgrade(r, f"consistent with {p.precision[k]} on every call of {p.target.op}"
                      f" (local error {le.local:.3g}, that precision's {le.steps[p.precision[k]]:.3g})")
    elif "none" in causes and le is not None and not born_seen:
        # v1 dump, but this op computed correctly on its inputs and no error was born before it
        # in execution order: what it carries is precision, not a bug
        downgrade(r, f"computed correctly on its inputs (local error {le.local:.3g}, floor {r.local_floor:.3g}); "
                      "no error born before it")
    elif "none" in causes:  # v1 dump: no data edges, the execution-order rule
        set_origin(r, "inherited", "inherited", f"input {causes['none'][0]} differs")
    elif (on_sample := p.sample_local.get(k)) is not None and sample_decided(r):
        # the sample alone failed it, and the op computed right on those very elements: what
        # differs there came in with its inputs (bf16 noise a square doubles), it was not made here
        downgrade(r, f"computed correctly on its sampled inputs (local error on the sample {on_sample.local:.3g}, "
                     f"floor {on_sample.floor:.3g}): the sample's difference came in with its inputs")
    elif le is not None and (unseen := unseen_input_difference(
            p, k, _row_error(r), max(r.local_floor or 0.0, le.local), floors.rules.precision_factor,
            graph.by_seq.get)) is not None:
        set_origin(r, "inherited", "inherited", unseen[0])
        r.culprit_target_seq = unseen[1]
    elif le is not None:
        why = f"computed correctly on its inputs (local error {le.local:.3g}, floor {r.local_floor:.3g})"
        carried = _row_name(carried_precision) + "'s precision loss" if carried_precision else computed_region
        downgrade(r, why + (f"; carries {carried}" if carried else ""))
    elif carried_precision is not None and statistics_only.unmeasured(r) \
            and r.stats_err > floors.rules.precision_factor * (carried := _carried_in(p, k, 0.0)) \
            and carried < LINEAR_REGIME:
        # far beyond what its inputs carry: the statistics-only rules weigh that jump against the
        # run's precision level (an optimizer step on TF32 gradients, 2e-2 from 5e-4: a bug)
        set_origin(r, "inherited", "inherited", f"carries {_row_name(carried_precision)}'s precision loss, "
                                                "and more (local error not measured)")
    elif carried_precision is not None:
        downgrade(r, f"carries {_row_name(carried_precision)}'s precision loss (local error not measured)")
    elif computed_region is not None:
        downgrade(r, f"carries what {computed_region}")
    elif "written" in causes:
        name, state = causes["written"]
        set_origin(r, "inherited", "inherited", f"input {name}: {state}, which the run wrote since its first read "
                                                "(both runs held the same values then); its writer is not recorded")
    elif r.inputs_agree == "unknown":
        r.origin = ""
    elif is_value_preserving(op) and not r.layout and (changed := _changed_what_it_moved(p)) is not None:
        set_origin(r, "born", "local error", changed)
    elif is_value_preserving(op) and not r.layout:
        downgrade(r, f"{op} moves its input's values: never an origin on its own")
    elif (flips := _across_boundary(r, p, k, graph)) is not None:
        downgrade(r, flips)
    elif (ties := statistics_only.selection_indices(r, p, k)) is not None:
        downgrade(r, ties)
    elif (fill := statistics_only.dtype_extreme_fill(r, p, k)) is not None:
        downgrade(r, fill)
    elif (bound := _reduction_noise(r, p, k, floors)) is not None:
        downgrade(r, bound)
    else:
        set_origin(r, "born", "local error", "inputs agree" if r.inputs_agree == "yes" else
             "inputs within precision (local error not measured)")


def _across_boundary(r: CompareRow, p: Pending, k: int, graph: _Graph) -> str | None:
    """A discontinuous op or module (relu's mask, forward or backward) whose output disagrees
    only where its decision input lies on different sides of the boundary in the two runs:
    the input's own noise crossed the boundary, precision loss, not a bug. None otherwise."""
    e = p.target
    if not is_discontinuous(e.op, e.kind) or k >= len(e.outputs) or k >= len(p.bench.outputs):
        return None
    pair = _decision_inputs(p, graph)
    if pair is None:
        return None
    dump_b, dump_t = graph.bench_dump, graph.dump
    try:
        xb, xt = dump_b.load_tensor(pair[0]).reshape(-1), dump_t.load_tensor(pair[1]).reshape(-1)
        yb, yt = dump_b.load_tensor(p.bench.outputs[k][1]).reshape(-1), dump_t.load_tensor(e.outputs[k][1]).reshape(-1)
    except (AttributeError, KeyError, OSError, ValueError, RuntimeError):
        return None
    if not (xb.numel() == xt.numel() == yb.numel() == yt.numel()) or not xb.is_floating_point():
        return None
    boundary = 0.0
    threshold = e.record.inputs.get(THRESHOLD_ARG) if e.kind == "op" else None
    if isinstance(threshold, (int, float)):
        boundary = float(threshold)
    xb, xt, yb, yt = (t.to(torch.float64) for t in (xb, xt, yb, yt))
    flipped = (xb > boundary) != (xt > boundary)
    if not bool(flipped.any()):
        return None
    # the elements whose decision agrees, judged as a row is: pass or precision-like warning
    tol = Tolerance(r.rtol or 0.0, r.atol or 0.0)
    b, t = yb[~flipped], yt[~flipped]
    if b.numel():
        allowed = tol.floor(float(yb.square().mean().sqrt())) + tol.rtol * b.abs()
        d = (t - b).abs()
        ratio = float((d / allowed.clamp_min(1e-300)).max())
        norm = float(b.norm())
        rel = float(d.norm()) / norm if norm > 0 else (0.0 if float(d.norm()) == 0 else math.inf)
        cos = float(torch.nn.functional.cosine_similarity(b, t, dim=0)) if norm > 0 and float(t.norm()) > 0 else None
        verdict = graph.floors.rules.judge_data(not_close=int((d > allowed).sum()), numel=b.numel(), max_ratio=ratio,
                                                rel_rmse=rel, cosine=cos, tol=tol)
        if verdict == PairStatus.FAIL.value:
            return None
    return (f"{int(flipped.sum())} of {flipped.numel()} elements flipped {e.op}'s decision: there the input lies on "
            f"either side of {boundary:g} in the two runs, within its own noise; the other elements agree")


def _decision_inputs(p: Pending, graph: _Graph) -> tuple[Any, Any] | None:
    """(bench, target) metas of the value a discontinuous op decides on: its ``self``/first input
    (a trace's threshold_backward gets it as ``self``); for a module's backward, its forward
    call's input."""
    def first(entry: Entry, name: str = "self") -> Any:
        ins = dict(entry.inputs)
        meta = ins.get(name) if name in ins else next(iter(ins.values()), None)
        return meta if getattr(meta, "data", None) is not None else None

    if p.target.kind == "op":
        b, t = first(p.bench), first(p.target)
    elif p.target.direction == "backward":
        fb, ft = graph.forward_call(p.bench, bench=True), graph.forward_call(p.target, bench=False)
        if fb is None or ft is None:
            return None
        b, t = first(fb), first(ft)
    else:
        b, t = first(p.bench), first(p.target)
    return (b, t) if b is not None and t is not None else None


def _module_dump(eb: Any) -> bool:
    """Module-level dumps (few records, module calls first): worth indexing their forward calls."""
    try:
        return len(eb) > 0 and eb[0].kind == "module"
    except (TypeError, IndexError):
        return False


def _substituted(p: Pending, name: str, graph: _Graph) -> bool:
    """The bench made input ``name`` with ops the target did not run (another kernel of the
    same computation), not straight from a record both ran."""
    src = _op_source(dict(p.bench.inputs).get(name))
    return src is not None and graph.target_of.get(src.seq) is None


def _reduction_noise(r: CompareRow, p: Pending, k: int, floors: Floors) -> str | None:
    """Statistics only, inputs agree, the output a reduction of its input (a norm's mean and
    rstd, a sum; statistics_only.reduction_change): the statistics' difference within the
    accumulation-order bound at the *input's* magnitude is another summation order, however large
    relative to a cancelled output (a mean of 4.6e-5 from values of 1). Inputs that agree only
    within the row's tolerance (an fp16 or autocast run: rtol x |x| per element) move an average
    by as much at their magnitude, so that is allowed on top. None when not such a row or beyond
    the bound."""
    reduction = statistics_only.reduction_change(p, k)
    if reduction is None:
        return None
    diff, scale, n, dtype = reduction
    bound = floors.rules.local_factor * floors.accumulation(dtype, n) * scale + (r.rtol or 0.0) * scale
    if diff > bound:
        return None
    return (f"statistics differ by {diff:.3g}, within the accumulation-order bound of a {n}-term reduction "
            f"of inputs of magnitude {scale:.3g} ({bound:.3g})")


def _inserted_op_change(p: Pending, graph: _Graph, matched_target: dict, dump: Any,
                        rules: Any) -> tuple[Entry, str] | None:
    """A target-only op inserted on a data edge that both runs share (the bench feeds this input
    straight from a record the target also ran, the target routes it through an extra op) must
    leave the values alone but for its output dtype's rounding, as autocast's casts do. One that
    changes them beyond that is where the difference enters, even when the difference is small
    enough to pass as precision downstream. Measured on the saved tensors; where they were not
    saved, on the samples of the shared value and of what the consumer received, where those
    have one shape (positions come from the shape: the same elements) and only moves and casts
    lie between them (a square weight transposed keeps every statistic, not its elements).
    Returns (that op, what it did), or None."""
    bench_inputs = dict(p.bench.inputs)
    for name, meta, status, _ in p.inputs:
        if status == PairStatus.PASS.value or name not in bench_inputs:
            continue
        kind, op = graph.producer(meta, p.target.record.seq)
        if kind != "target-only" or graph.folded_on_the_bench(op):  # a call the bench folded is no insertion
            continue
        src_b = _op_source(bench_inputs[name])
        if src_b is None or matched_target.get(src_b.seq) is None:
            continue  # the bench made it another way (a substituted implementation), not an insertion
        shared = matched_target[src_b.seq].record.seq
        found = (_saved_change(op, meta, shared, dump, rules) if meta.data is not None else None) \
            or _sampled_change(op, meta, shared, graph, rules)
        if found is not None:
            return found
    return None


def _unread_term(p: Pending, graph: _Graph) -> tuple[str, Entry] | None:
    """(input name, the bench-only op behind it) that reads a value the target computed and
    nothing on the target reads (``_Graph.unread_on_the_target``), whatever the input's status."""
    for name, _, _, _ in p.inputs:
        if (e := graph.unread_on_the_target(p, name)) is not None:
            return name, e
    return None


def _skipped_step(p: Pending, graph: _Graph) -> tuple[str, Entry] | None:
    """(input name, the bench-only op that made it) where the target skipped a step of the
    bench's data flow, judged on a statistics row too (inside bf16's warning band), not only a
    failing one (``_decide``'s O2b):

    - a move or cast: the target reads that input straight from a matched record and the
      bench's move put other values there, far beyond what the matched record carries
      (``_Graph._moved_apart``: a bf16 matmul fed a square weight untransposed moves 11 %);
    - a dropped term: a bench-only op behind the input reads a value the target computed and
      never reads to make it (``_Graph.dropped_on_the_target``: a residual left out, the sum a
      norm and a convolution only the bench pairs read, within bf16's band on statistics)."""
    for name, meta, status, _ in p.inputs:
        if status == PairStatus.PASS.value:
            continue
        kind, detail = graph.producer(meta, p.target.record.seq)
        if kind == "settled":
            e = graph.skipped_on_the_target(p, name, detail)
            if e is not None and (is_value_preserving(e.op) or is_cast(e.op)):
                return name, e
            if e is not None and (dropped := graph.dropped_on_the_target(p, name, None)) is not None:
                return name, dropped
        elif kind == "target-only" and _substituted(p, name, graph) \
                and graph.judge_target_only(detail, True)[0] == "computed" \
                and (dropped := graph.dropped_on_the_target(p, name, detail)) is not None:
            return name, dropped
    return None


def _rounding_of(through: list[Entry], meta: Any) -> tuple[torch.dtype, float]:
    """The coarsest dtype the values passed through (a bf16 cast widened back: ``producer`` looks
    through that) and the largest smallest normal among them: rounding to a dtype moves an element
    by at most its eps / 2 relative, or half a step of gradual underflow below its smallest normal
    (an fp16 gradient of 1e-6), whichever is larger."""
    dtypes = [dtype_from_name(meta.dtype)] + [dtype_from_name(m.dtype) for x in through for _, m in x.outputs]
    floating = [d for d in dtypes if d.is_floating_point]
    return max(dtypes, key=eps), max((torch.finfo(d).tiny for d in floating), default=0.0)


def _beyond_rounding(op: Entry, change: float, coarsest: torch.dtype, rules: Any) -> tuple[Entry, str] | None:
    """(op, what it did) where ``change`` (measured at a scale no smaller than ``_rounding_of``'s
    smallest normal) is beyond the rounding of ``coarsest``, else None."""
    allowed = rules.local_factor * eps(coarsest)
    if change <= allowed:
        return None
    return op, f"changed its input by {change:.3g}, beyond {dtype_name(coarsest)} rounding ({allowed:.3g})"


def _saved_change(op: Entry, meta: Any, shared: int, dump: Any, rules: Any) -> tuple[Entry, str] | None:
    """``_inserted_op_change`` on saved tensors: the shared value ``op`` reads against ``meta``."""
    feeds = [m for _, m in op.inputs if m.data is not None and m.numel == meta.numel
             and getattr(_op_source(m), "seq", None) == shared]
    if len(feeds) != 1:
        return None
    try:
        before, after = dump.load_tensor(feeds[0]), dump.load_tensor(meta)
    except (KeyError, OSError, ValueError):
        return None
    if not (before.is_floating_point() and after.is_floating_point()):
        return None
    coarsest, tiny = _rounding_of([op], meta)
    return _beyond_rounding(op, normwise_error(after, before.to(after.dtype).to(torch.float64), tiny), coarsest, rules)


def _sampled_change(op: Entry, meta: Any, shared: int, graph: _Graph, rules: Any) -> tuple[Entry, str] | None:
    """``_inserted_op_change`` on samples: the target-only moves and casts from the shared value
    to ``meta``, each one's output sample against the shared value's, from the first on; the
    first beyond the rounding of the dtypes passed through is named. None where another op lies
    between, or a sample does not hold the same elements (another shape)."""
    chain, cur = [], op
    for _ in range(MAX_REGION):
        if not (is_value_preserving(cur.op) or is_cast(cur.op)) or not cur.inputs:
            return None
        chain.append(cur)
        first = cur.inputs[0][1]
        src = _op_source(first)
        if src is None:
            return None
        if src.seq == shared:
            break
        cur = graph.by_seq.get(src.seq)
        if cur is None or graph.rows_of.get(cur.pos) is not None:
            return None  # not recorded, or a matched record: not a chain of target-only ops
    else:
        return None
    before = _sample_of(first, first)
    coarsest, tiny = _rounding_of(chain, meta)
    received = _beyond_rounding(op, _sampled_difference(meta, before, first, tiny), coarsest, rules) \
        if before is not None else None
    if received is None:
        return None  # what the consumer received is the shared value, rounded (a transpose and back)
    chain.reverse()
    for i, x in enumerate(chain):
        step, step_tiny = _rounding_of(chain[:i + 1], meta)
        change = _sampled_difference(x.outputs[0][1] if x.outputs else None, before, first, step_tiny)
        if (named := _beyond_rounding(x, change, step, rules)) is not None:
            return named
    return received


def _sampled_difference(meta: Any, before: np.ndarray, like: Any, least_scale: float = 0.0) -> float:
    """The normwise difference of ``meta``'s sample from ``before`` (``like``'s), each element's
    scale no smaller than ``least_scale`` (a smallest normal); 0 where the samples do not hold
    the same elements."""
    after = _sample_of(meta, like)
    if after is None:
        return 0.0
    scale = float(np.linalg.norm(np.maximum(np.abs(before), least_scale)))
    return float(np.linalg.norm(after - before)) / scale if scale > 0 else 0.0 if not after.any() else math.inf


def _sample_of(meta: Any, like: Any) -> np.ndarray | None:
    """``meta``'s sample as float64, where it holds the elements ``like``'s does (one shape, one
    length) and is finite; else None."""
    sample, other = getattr(meta, "sample", None), getattr(like, "sample", None)
    if not sample or not other or len(sample) != len(other) or tuple(meta.shape) != tuple(like.shape) \
            or not dtype_from_name(meta.dtype).is_floating_point:
        return None
    values = np.asarray(sample, dtype=np.float64)
    return values if np.isfinite(values).all() else None


def _row_error(r: CompareRow) -> float | None:
    """The largest difference a row measured: on data, statistics or its sample."""
    return max((e for e in (r.rel_rmse, r.stats_err, r.sample_err) if e is not None), default=None)


def _jumps_beyond_its_inputs(p: Pending, k: int, factor: float) -> str | None:
    """Why a statistics row in the warning band is judged as a failure, or None. The band (up to
    ``stats_warn_factor`` x the dtype's tolerance) is for error a run accumulates; a call whose
    inputs all carry less than 1/``factor`` of its own error, however they were judged, did not
    receive it: it made it (a 5 % matmul bug under bf16 whose inputs agree to 1e-5). Only rows
    with nothing recomputed; what an input carries is the larger of its statistics' and its sample's
    error, grown by the cancellation of a sum (``statistics_only.carried_error``).

    Forward calls only. Measured on bf16 training steps (tools/bench_accuracy.py, the defaults): a
    T5 weight gradient grows what its inputs carry, 2.3e-2, to 1.6e-1 with no cancellation its
    statistics show, and Adam's first step (``_foreach_addcdiv_``: the sign of each gradient,
    flipped where noise crosses 0) 8e-3 to 5.3e-2: backward calls and calls that write their
    arguments (an optimizer's update) failed 5 noise runs that had no bug. Their errors stay
    warnings."""
    r = p.rows[k]
    if r.mode != "stats" or r.local_err is not None or not r.stats_err or p.target.record.direction != "forward" \
            or getattr(p.target.record, "mutates", None):
        return None
    carried = statistics_only.carried_error(p, k)
    if carried is None or r.stats_err <= factor * carried[0] * carried[1]:
        return None
    grown = f", grown {carried[1]:.3g}x by its sum's cancellation" if carried[1] > 1 else ""
    return (f"its statistics error {r.stats_err:.3g} is beyond {factor:g}x what its inputs carry "
            f"({carried[0]:.3g}{grown})")


def _received_precision(pending: list[Pending], factor: float) -> None:
    """A row still born with nothing recomputed, on inputs within precision, whose error is no
    more than ``factor`` x what those inputs carry (``_within_what_it_receives``) is precision it
    received. Run after the statistics rules, which read the run's precision level from such rows
    (a TF32 run's matmuls), and before ``_decide_again``, which re-decides the rows fed by them."""
    for p in pending:
        for k, r in enumerate(p.rows):
            if r.status == PairStatus.FAIL.value and r.origin == "born" and r.cause == "local error" \
                    and r.local_err is None and r.inputs_agree != "yes" \
                    and (received := _within_what_it_receives(r, p, k, factor)) is not None:
                downgrade(r, received)


def _within_what_it_receives(r: CompareRow, p: Pending, k: int, factor: float) -> str | None:
    """Why a failing row whose inputs were judged within precision is not born there, or None:
    its error is no more than ``factor`` x what those inputs carry, grown by its sum's
    cancellation (``statistics_only.carried_error``), so it is what it received. The mirror of
    ``_jumps_beyond_its_inputs``, with the same measure: in a bf16 backward, a norm's or a
    matmul's gradient that cancels to 1e-12 moves by 30 % because its incoming gradient does, not
    because it computed wrong."""
    err = r.stats_err if r.mode == "stats" else r.accumulated_err
    carried = statistics_only.carried_error(p, k)
    if not err or carried is None or not carried[0] or err > factor * carried[0] * carried[1]:
        return None
    grown = f", grown {carried[1]:.3g}x by its sum's cancellation" if carried[1] > 1 else ""
    return (f"its error {err:.3g} is within {factor:g}x what its inputs carry ({carried[0]:.3g}{grown}), "
            "which were judged within precision (nothing recomputed)")


def _changed_what_it_moved(p: Pending) -> str | None:
    """Why a value-moving op (a view, a transpose, a clone) changed values itself, or None: where
    every tensor input is the same on both runs (equal statistics and samples), its output must
    be too, whatever part of them it moves; a failing output was written wrong by the target's
    op (a layout or copy kernel). Elsewhere it carries what its inputs differ by."""
    bench = dict(p.bench.inputs)
    tensors = [(n, m.stats) for n, m in p.target.inputs if getattr(m, "stats", None) is not None]
    if not tensors or any(getattr(bench.get(name), "stats", None) != st or bench[name].stats.sample != st.sample
                          for name, st in tensors):
        return None
    return f"{p.target.op} moves values, and its inputs are the same on both runs (statistics and samples): it changed them"


def _drawn_through_folds(graph: _Graph, seq: int) -> CompareRow | None:
    """The random-draws row (``_random``) a de-dup folded call ``seq`` was made from, through
    its first argument and chains of folded calls (the folds table), or None."""
    for _ in range(MAX_REGION):
        fold = graph.fold_of(seq)
        if fold is None or fold[1] < 0:
            return None
        kind, detail = graph.source_kind(Source("op", seq=fold[1], index=fold[2]))
        if kind != "unrecorded":
            return detail if kind == "failing" and _random(detail) else None
        seq = detail
    return None


def _changed_in_a_fold(meta: Any, status: str, producer_row: CompareRow, graph: _Graph) -> int | None:
    """The seq of the de-duplicated call that changed an input's values, or None. The folds
    table looks through an unrecorded view to the call that made its values (they only move);
    where that call's output passes and the input as its consumer read it fails, the values
    changed in between, in the unrecorded call itself (a view kernel that writes wrong
    elements), not in the producer."""
    src = _op_source(meta)
    if status != PairStatus.FAIL.value or producer_row.status != PairStatus.PASS.value or src is None \
            or src.seq in graph.by_seq:
        return None
    return src.seq


def _op_source(meta: Any) -> Source | None:
    """The op output ``meta`` came from, or None."""
    src = source_of(meta)
    return src if src is not None and src.kind == "op" else None


def _wrong_on_its_inputs(p: Pending, k: int, floors: Floors) -> bool:
    """Output ``k``'s local error is far above its own kind's level on this run, or beyond its
    device floor and not a measured precision step."""
    le = p.local.get(k)
    if le is None:
        return False
    if k in p.outlier:
        return True
    return k not in p.precision and floors.beyond(le, p.target.op, p.reduce.get(k, 1))


def _as_wrong_on_the_bench(p: Pending, k: int, floors: Floors) -> bool:
    """The bench's own call is wrong on its inputs by its self-check, and the target's local
    error on output ``k`` is within the precision factor of the bench's: one kernel's error on
    both runs (CPU's layer norm backward sums a bias gradient that cancels past its floor on
    either), not where the runs part; what its inputs carry decides the row. A bug in the
    target's call (1e-2 against the bench's 1e-5) is still far beyond it."""
    le = p.local.get(k)
    if le is None or k >= len(p.bench.outputs):
        return False
    theirs = checked_error(p.bench.outputs[k][1], p.bench.op)
    return theirs is not None and floors.beyond(theirs, p.bench.op, p.reduce.get(k, 1)) \
        and le.local <= floors.rules.precision_factor * theirs.local


def _wrong_on_the_bench_too(p: Pending, k: int, floors: Floors) -> str:
    """Where the bench's own call of a call born wrong is wrong as well, by its recorded
    self-check (a kernel wrong on both runs: torch's CPU batch norm backward, on a gradient of
    one sample laid out channels-last with another batch stride), the words that say so: the
    bench is then no reference there, and the runs' difference is not all this call's."""
    if k >= len(p.bench.outputs):
        return ""
    le = checked_error(p.bench.outputs[k][1], p.bench.op)
    if le is None or not floors.beyond(le, p.bench.op, p.reduce.get(k, 1)):
        return ""
    return f"; the bench's own call is wrong too (its local error {le.local:.3g}): the kernel is wrong on both runs"


def _param_name(name: str, meta: Any) -> str:
    """The qualified name of a module record's parameter, from its source when recorded."""
    src = source_of(meta)
    return src.name if src is not None and src.name else name[len("param:"):]


def _inherited_precision_loss(pending: list[Pending], graph: "_Graph", rules: Any) -> None:
    """Rows left failing as inherited, with nothing recomputed, whose failing inputs all came
    from rows settled after they were decided (statistics-only rules run last):

    - computed from a tensor that is 0 in exact arithmetic (statistics_only.holds_rounding) and
      otherwise from inputs within precision: rounding too, whatever its error (the views of a
      key bias's gradient, the optimizer's moments and update of that bias);
    - else within the precision factor of what its inputs carry, when one of them is precision
      loss: it carries that loss.

    An input from a failing row, a parameter or a model input keeps the row failing."""
    f = rules.precision_factor
    rounding: set[int] = set()  # rows holding only rounding, by id: made so, or computed from such alone
    for p in pending:  # target execution order: a producer's rows are settled before its consumers'
        if p.target.kind != "op":
            continue
        for k, r in enumerate(p.rows):
            zero = statistics_only.holds_rounding(p, k, f)
            if zero:
                rounding.add(id(r))
            if r.status == PairStatus.FAIL.value and (r.cause != "inherited" or r.local_err is not None):
                continue  # born, or measured: decided (or decided again: _decide_again)
            carried, losses, zeros, settled = 0.0, [], [], True
            for name, meta, status, err in row_inputs(p, k):
                if status in (PairStatus.PASS.value, PairStatus.SKIP.value):
                    continue
                kind, row = ("param", None) if name.startswith("param:") else graph.producer(meta, p.target.record.seq)
                if kind != "settled" or err is None:
                    settled = False
                    break
                carried = max(carried, err)
                if id(row) in rounding:
                    zeros.append(row)
                elif row.cause == PRECISION:
                    losses.append(row)
            if settled and zero:
                if r.status == PairStatus.FAIL.value and r.stats_err:
                    downgrade(r, "0 in exact arithmetic: its values are the rounding of a sum that cancels, no larger "
                                 "than that rounding on the bench (nothing recomputed)")
            elif settled and zeros:
                rounding.add(id(r))
                if r.status == PairStatus.FAIL.value and r.stats_err:
                    downgrade(r, f"computed from {_row_name(zeros[0])}, which is 0 in exact arithmetic and holds "
                                 "only rounding, and from inputs within precision (nothing recomputed)")
            elif r.status == PairStatus.FAIL.value and settled and losses and r.stats_err \
                    and r.stats_err <= f * carried:
                downgrade(r, f"carries {_row_name(losses[0])}'s precision loss: its error {r.stats_err:.3g} is "
                             f"within {f:g}x what its inputs carry ({carried:.3g}; nothing recomputed)")


def _decide_again(inherited: Iterable[tuple], graph: "_Graph", floors: Floors) -> None:
    """Rows decided inherited from a row that the statistics rules (run last) settled since, as
    precision loss, are decided again, in execution order, with what was seen before them: a
    record that de-dup keeps statistics of (its signature's tensors were copied in another module)
    settles late, and the rows fed by it must not stay failures it no longer is."""
    for r, p, k, born_seen, seen in inherited:
        if r.status != PairStatus.FAIL.value or r.cause != "inherited" or not _producers_settled(p, k, graph):
            continue
        r.origin = r.cause = r.culprit = ""
        _decide(r, p, k, graph, floors, born_seen, seen)


def _producers_settled(p: Pending, k: int, graph: "_Graph") -> bool:
    """No disagreeing input of output ``k`` comes from a failing row any more. A row made from
    random draws that differ (skipped) is settled too: decided again, a row that also reads it is
    skipped as made from them, not left inherited from a producer since found precision loss."""
    for name, meta, status, _ in row_inputs(p, k):
        if status in (PairStatus.PASS.value, PairStatus.SKIP.value) or name.startswith(("param:", "forward_params.")):
            continue
        kind, detail = graph.producer(meta, p.target.record.seq)
        if kind == "failing" and not _random(detail):
            return False
    return True


def _row_name(r: CompareRow) -> str:
    return r.target_name or r.bench_name


def _mark_precision_loss(pending: list[Pending], rules: Any, math: Any = None) -> dict[str, list[float]]:
    """An op kind whose failing calls carry local error near one reduced-precision step's (one
    the run may round to: ``math.may_round``) is precision loss, call by call; a call far from
    the kind's level stays a bug. Near: most of the kind's calls within ``precision_factor`` of
    their median ratio, not the median alone, which two calls far apart (a 1e-2 bug at 4x the bf16
    step, a right fp32 call at 1e-3 of it) put at neither."""
    kinds: dict[tuple, list[tuple[Pending, int, LocalError]]] = {}
    for p in pending:
        for k, le in p.local.items():
            if rules.is_local_error(le.local, le.floor, le.dtype) and le.steps:
                kinds.setdefault((p.target.op, p.target.record.direction), []).append((p, k, le))
    f = rules.precision_factor
    established: dict[str, list[float]] = {}  # step -> levels of the kinds consistent with it
    for calls in kinds.values():
        if len(calls) < 2:
            continue
        best = None
        for step in calls[0][2].steps:
            if math is not None and not math.may_round(step):
                continue
            ratios = [le.local / le.steps[step] for _, _, le in calls if le.steps.get(step, 0) > 0]
            if len(ratios) != len(calls):
                continue
            level = statistics.median(ratios)
            near = sum(1 for x in ratios if level / f <= x <= f * level)
            if 1 / f <= level <= f and 2 * near > len(ratios) \
                    and (best is None or abs(_log(level)) < abs(_log(best[1]))):
                best = (step, level, ratios)
        if best is None:
            continue
        step, level, ratios = best
        established.setdefault(step, []).append(level)
        for (p, k, _), ratio in zip(calls, ratios):
            if level / f <= ratio <= f * level:
                p.precision[k] = step
    # An op kind called once (a ViT's patch convolution) cannot be consistent with itself: it is
    # precision loss when other kinds established that step on this run and it sits at their level.
    for calls in kinds.values():
        if len(calls) != 1:
            continue
        p, k, le = calls[0]
        for step, levels in established.items():
            if le.steps.get(step, 0) > 0 and min(levels) / f <= le.local / le.steps[step] <= f * max(levels):
                p.precision[k] = step
                break
    return established


def _mark_outliers(pending: list[Pending], floors: Floors) -> None:
    """Calls far above their own kind's level on this run (noise_floor.outliers): one op kind
    (a kernel family counts as one), one direction, one output dtype; and beyond the
    accumulation bound of their own reduction length."""
    kinds: dict[tuple, list[tuple[tuple[Pending, int], LocalError]]] = {}
    for p in pending:
        for k, le in p.local.items():
            kinds.setdefault((op_base(p.target.op), p.target.record.direction, le.dtype, k), []).append(((p, k), le))
    for calls in kinds.values():
        sums = [floors.sums(le, p.reduce.get(k, 1)) for (p, k), le in calls]
        for i, why in outliers(calls, floors.allowed_steps(calls[0][0][0].target.op), sums).items():
            p, k = calls[i][0]
            p.outlier[k] = why


def _log(x: float) -> float:
    return math.log(x) if x > 0 else float("-inf")
