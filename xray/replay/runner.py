"""Replay a dump's ops (or modules) on a baseline and a list of backends, isolated per backend.

Order of work: pick and de-duplicate records, check their inputs can be rebuilt, then for each
backend (baseline first) run every record in that backend's persistent worker, compare with the
baseline, append a row to the matrix CSV and the outputs to that backend's replay dump.
"""
from __future__ import annotations

import fnmatch
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from ..progress import progress

from ..backends.base import ReplayStatus
from ..backends.registry import PRESETS, create, parse_spec
from ..dump.column_scan import MARK, canonical, check_records, group_rows, native_columns, skeleton_keys
from ..dump import load_dump
from ..dump.columns import DIRECTIONS, KINDS, Columns
from ..dump.model import Record, unwritten, value_to_json
from ..dump.protocol import Dump
from ..ops.nondeterminism import nondeterministic
from .isolate import Worker, safe_name
from .job import Job, JobResult, signature_hash
from .matrix import MatrixWriter, ReplayResult, MatrixRow
from .nn_layers import TORCH_NN
from .output import ReplayDumpWriter
from .configs import config_of
from .tolerance import judge_backend, judge_layout, judge_quantized


# Ops that compute nothing a backend could get wrong: tracing and autograd bookkeeping that
# returns its input (a constant lifted into the graph, an alias, a detach). Exporting one alone
# tells nothing about a backend (XNNPACK reports an empty graph as LOWER_FAIL), so they are
# never replayed and never appear in the support matrix.
NOT_REPLAYED = ("aten.lift.*", "aten.lift_fresh.*", "aten.lift_fresh_copy.*", "aten.alias.*", "aten.detach.*",
                "aten.detach_.*")


def is_not_replayed(op: str) -> bool:
    return any(fnmatch.fnmatchcase(op, p) for p in NOT_REPLAYED)


class ReplayInputError(ValueError):
    """The dump cannot be replayed as asked (no records, nothing to rebuild inputs from...)."""


@dataclass
class ReplayConfig:
    """Options of one replay run (the CLI flags map one to one)."""

    backends: list[str]
    out: Path
    baseline: str = "torch-cpu"
    factory: str = "auto"
    seed: int = 0
    timeout: float = 120.0
    repeats: int = 5
    limit: int | None = None
    ops: list[str] = field(default_factory=list)  # fnmatch patterns on op names
    seqs: list[int] = field(default_factory=list)  # only these record sequence numbers
    dedup: bool = True
    cache: bool = True
    model: str | None = None  # "pkg.module:factory": replay module records instead of ops
    modules: list[str] = field(default_factory=list)  # fnmatch patterns on module paths
    weights_const: bool = True  # recorded parameters are constants of the op module, as in the model
    threads: int = 1
    imports: list[str] = field(default_factory=list)  # modules each worker imports first (custom ops)
    progress: bool = True


def _kinds(cfg: ReplayConfig) -> set[str]:
    # A sweep's built-in torch.nn factory replays its op records and its module records together.
    return {"op", "module"} if cfg.model == TORCH_NN else ({"module"} if cfg.model else {"op"})


def select_records(records: list[Record] | Dump, cfg: ReplayConfig) -> list[Record]:
    """Forward op records (or module records with a model), filtered, de-duplicated, limited.
    ``records``: a list, or a dump (a v3 trace dump is filtered on its columns)."""
    columns = native_columns(records)
    if columns is not None:
        return [columns.record(i) for i in select_rows(columns, cfg).tolist()]
    kinds = _kinds(cfg)
    picked = [r for r in records if r.kind in kinds and r.direction == "forward" and not is_not_replayed(r.op)]
    if cfg.ops:
        picked = [r for r in picked if any(fnmatch.fnmatchcase(r.op, p) or fnmatch.fnmatchcase(r.op, f"*{p}*")
                                           for p in cfg.ops)]
    if cfg.seqs:
        wanted = set(cfg.seqs)
        picked = [r for r in picked if r.seq in wanted]
    if cfg.modules:
        picked = [r for r in picked if any(fnmatch.fnmatchcase(r.module or "", p) for p in cfg.modules)]
    picked = [r for r in picked if any(True for _ in r.output_tensors())]  # nothing to compare otherwise
    if cfg.dedup:
        seen: set[str] = set()
        unique = []
        for r in picked:
            h = signature_hash(r)
            if h not in seen:
                seen.add(h)
                unique.append(r)
        picked = unique
    return picked[: cfg.limit] if cfg.limit else picked


def select_rows(columns: Columns, cfg: ReplayConfig) -> np.ndarray:
    """``select_records`` on a columnar index: the rows of the records it would return, in
    order. Filters run once per distinct op or module name; de-duplication groups rows on the
    columns of ``job.signature`` (kind, op, module, non-tensor inputs, input shape, dtype, stride,
    offset), then hashes one Record per group: groups whose hashes agree merge, so the first
    record of each hash is the one the record path keeps."""
    check_records(columns)
    r = columns.records
    ops = canonical(r["op"], columns.strings.__getitem__)
    modules = canonical(r["module"], columns.strings.__getitem__)
    keep = np.isin(r["kind"], [KINDS.index(k) for k in _kinds(cfg)]) & (r["direction"] == DIRECTIONS.index("forward"))
    keep &= np.isin(ops, columns.ids_where(ops[keep], lambda op: not is_not_replayed(op) and (not cfg.ops or any(
        fnmatch.fnmatchcase(op, p) or fnmatch.fnmatchcase(op, f"*{p}*") for p in cfg.ops))))
    if cfg.seqs:
        keep &= np.isin(r["seq"], list(set(cfg.seqs)))
    if cfg.modules:
        keep &= np.isin(modules, columns.ids_where(modules[keep], lambda m: any(
            fnmatch.fnmatchcase(m or "", p) for p in cfg.modules), none=True))
    rows = np.flatnonzero(keep)
    sk = skeleton_keys(columns, rows, _inputs_key)
    outputs = sk.n_outputs > 0  # nothing to compare otherwise
    rows = rows[outputs]
    if cfg.dedup and len(rows):
        rows = _first_per_signature(columns, rows, ops, modules, sk.numbers[outputs], sk.n_inputs[outputs])
    return rows[: cfg.limit] if cfg.limit else rows


def _inputs_key(inputs: dict) -> str:
    """The non-tensor part of a record's inputs, as ``job.signature`` spells it (tensors as
    placeholders: their fields come from the tensor columns)."""
    return json.dumps({k: _stripped(v) for k, v in inputs.items()}, sort_keys=True, default=str)


def _stripped(v):
    if v is MARK:
        return {"t": "@"}
    if isinstance(v, list):
        return [_stripped(x) for x in v]
    return value_to_json(v)


def _first_per_signature(columns: Columns, rows: np.ndarray, ops: np.ndarray, modules: np.ndarray,
                         inputs: np.ndarray, n_inputs: np.ndarray) -> np.ndarray:
    """The first row of each distinct ``signature_hash``, in order (``inputs``, ``n_inputs``:
    the rows' skeleton keys)."""
    r = columns.records
    module_key = np.where(r["kind"][rows] == KINDS.index("module"), modules[rows], -1)
    firsts, _ = group_rows(columns, rows, [r["kind"][rows].astype(np.int64), ops[rows], module_key, inputs],
                           n_inputs, ("shape", "dtype", "stride", "offset"))
    seen: set[str] = set()
    keep = []
    for row in firsts.tolist():
        h = signature_hash(columns.record(row))
        if h not in seen:
            seen.add(h)
            keep.append(row)
    return np.array(keep, dtype=np.int64)


def import_user_modules(names: list[str]) -> None:
    """Import ``--import`` modules (e.g. ones registering custom ops) in this process."""
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure of the user's module is reported as such
            raise ReplayInputError(f"--import {name}: {type(e).__name__}: {e}") from None


def check_inputs(record: Record, dump: Dump, cfg: ReplayConfig) -> str | None:
    """Why the record's inputs cannot be rebuilt, or None. Runs in the parent for every record, so
    it reads no tensor data: each worker loads the inputs of its own jobs."""
    metas = [m for _, m in record.input_tensors()]
    if metas and all(m.stats is None and not (m.data and dump.has_data(m)) and not unwritten(m) for m in metas):
        return "no saved tensors and no statistics for its inputs (record with X_DEBUG STATS or X_DUMP_NUM > 0)"
    if record.kind == "module":
        return None
    from ..ops.rebuild import check_call

    try:
        check_call(record, dump, factory=cfg.factory)
    except Exception as e:  # noqa: BLE001 - the message is the reason to skip
        return f"{type(e).__name__}: {e}"
    return None


def replay_dump(dump_path: str | Path, cfg: ReplayConfig,
                on_row: Callable[[MatrixRow], None] | None = None) -> ReplayResult:
    """Replay ``dump_path`` as configured; write matrix.csv, per-backend dumps and the heatmap."""
    specs = [cfg.baseline] + [b for b in cfg.backends if b != cfg.baseline]
    for s in specs:
        parse_spec(s)  # unknown names fail here, before any work, listing the presets
    import_user_modules(cfg.imports)  # the parent resolves ops too: custom ones need their library
    dump = load_dump(dump_path)
    records = select_records(dump, cfg)
    if not records:
        what = "module records (record with PrecisionDebugger or X_DEBUG MODULES)" if cfg.model else "op records"
        raise ReplayInputError(f"{dump_path}: no {what} to replay"
                               + (f" matching {cfg.ops or cfg.modules}" if cfg.ops or cfg.modules else ""))
    skipped, runnable = [], []
    for r in records:
        reason = check_inputs(r, dump, cfg)
        (skipped.append((r, reason)) if reason else runnable.append(r))
    if not runnable:
        raise ReplayInputError(f"{dump_path}: none of the {len(records)} selected records can be rebuilt; "
                               f"first reason: record seq={skipped[0][0].seq} ({skipped[0][0].op}): {skipped[0][1]}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cache_dir = out / "cache" if cfg.cache else None
    source = str(Path(dump_path).resolve())  # load_dump accepts it in every form the user may give
    matrix = MatrixWriter(out / "matrix.csv")
    baseline_out: dict[int, list[torch.Tensor] | None] = {}
    uncompared = {r.seq: nondeterministic(r) for r in runnable}  # seq -> why its values are not compared
    rows: list[MatrixRow] = []
    dumps: dict[str, Path] = {}
    config = dict(dump.header.get("config", {})) if hasattr(dump, "header") else {}
    # One worker per backend file and thread count: a matrix's configurations of one backend (dynamic,
    # quant, options) share its start-up; each job names its own spec, and a crash restarts the worker.
    workers: dict[tuple[str, int], Worker] = {}
    with ExitStack() as stack:
        for spec in specs:
            backend = create(spec)
            writer = ReplayDumpWriter(out / "dumps" / safe_name(spec), spec, source, backend.options, config)
            started = time.perf_counter()
            precision_of = backend.tolerance_dtype
            name, overrides = parse_spec(spec)
            key = (PRESETS[name].module, overrides.get("threads") or cfg.threads)
            if key not in workers:
                workers[key] = stack.enter_context(Worker(spec, out / "logs", threads=key[1],
                                                          imports=tuple(cfg.imports)))
            worker = workers[key]
            where = f" [{specs.index(spec) + 1}/{len(specs)}]" if len(specs) > 2 else ""  # a matrix: which config
            for rec in progress(runnable, desc=f"replay {spec}{where}", unit="op", enabled=cfg.progress):
                job = Job(dump=source, record=rec.to_json(), backend=spec, factory=cfg.factory, seed=cfg.seed,
                          cache_dir=str(cache_dir) if cache_dir else None, repeats=cfg.repeats, model=cfg.model,
                          weights_const=cfg.weights_const)
                res = worker.run(job, cfg.timeout)
                row = _row(rec, spec, res, baseline_out, spec == cfg.baseline, precision_of, uncompared[rec.seq],
                           arguments=lambda rec=rec: _call_arguments(rec, dump, cfg))
                if res.status == ReplayStatus.OK and res.outputs:
                    writer.add(rec, res.inputs, res.output_tensors())
                matrix.add(row)
                rows.append(row)
                if on_row:
                    on_row(row)
            dumps[spec] = writer.close(time.perf_counter() - started)
    matrix.close()
    result = ReplayResult(rows, runnable, skipped, specs, cfg.baseline, out, dumps)
    from .matrix import write_heatmap, write_matrix_html

    write_heatmap(result, out)
    write_matrix_html(result, out)
    return result


def _call_arguments(rec: Record, dump: Dump, cfg: ReplayConfig) -> dict | None:
    """The arguments the workers ran ``rec`` with, by name (the same factory and seed give the
    same tensors): what a selection's indices point into. None for a module record."""
    if rec.kind != "op":
        return None
    from ..ops.rebuild import build_call, named_args

    try:
        return named_args(*build_call(rec, dump, factory=cfg.factory, seed=cfg.seed))
    except Exception:  # noqa: BLE001 -- it ran in the worker; without its inputs here, indices are judged exactly
        return None


def _row(rec: Record, spec: str, res: JobResult, baseline_out: dict, is_baseline: bool,
         precision_of: Callable[[torch.dtype], torch.dtype], uncompared: str | None = None,
         arguments: Callable[[], dict | None] | None = None) -> MatrixRow:
    """The matrix row of one job; ``uncompared`` says why the op's values cannot be compared
    (random or uninitialized outputs): then only output count, shapes and dtypes are.
    ``arguments``: the call's arguments, rebuilt on demand (a selection's indices need its input)."""
    status, error = ReplayStatus(res.status), res.error
    max_abs = max_rel = mean_abs = mean_rel = None
    if is_baseline:
        baseline_out[rec.seq] = res.output_tensors() if status == ReplayStatus.OK else None
        if status == ReplayStatus.OK and uncompared:
            status, error = ReplayStatus.NONDETERMINISTIC, f"values not compared: {uncompared}"
    elif status == ReplayStatus.OK:
        ref = baseline_out.get(rec.seq)
        if ref is None:  # it ran, but against nothing: never counted as within tolerance
            status, error = ReplayStatus.BASELINE_FAIL, "not compared: the baseline produced no outputs for this record"
        elif uncompared:  # a wrong layout is still a mismatch; differing values are expected
            cmp = judge_layout(ref, res.output_tensors())
            status = ReplayStatus.NONDETERMINISTIC if cmp.ok else ReplayStatus.MISMATCH
            error = f"values not compared: {uncompared}"
            if not cmp.ok:
                error = f"{cmp.message} ({error})"
        else:
            cmp = _judge(rec, res, ref, res.output_tensors(), precision_of, arguments)
            if res.second:  # a dynamic export at its second size, against eager at that size
                got2, ref2 = res.second_tensors()
                second = _judge(rec, res, ref2, got2, precision_of, None)
                if cmp.ok and not second.ok:
                    cmp.status = second.status
                    cmp.message = f"at the second size ({res.facts.get('second_size')}): {second.message}"
                cmp.ok = cmp.ok and second.ok
                for key in ("max_abs", "max_rel", "mean_abs", "mean_rel"):  # the worse of the two sizes
                    values = [v for v in (getattr(cmp, key), getattr(second, key)) if v is not None]
                    setattr(cmp, key, max(values) if values else None)
            max_abs, max_rel, mean_abs, mean_rel = cmp.max_abs, cmp.max_rel, cmp.mean_abs, cmp.mean_rel
            if not cmp.ok:
                status, error = cmp.status, cmp.message
    return MatrixRow(seq=rec.seq, op=rec.op, module=rec.module or "", count=rec.count, signature=signature_hash(rec),
                     backend=spec, status=int(status), max_abs_err=max_abs, max_rel_err=max_rel,
                     latency_ms=res.latency_ms, cached=res.cached, error=error, facts=res.facts,
                     mean_abs_err=mean_abs, mean_rel_err=mean_rel, config=config_of(spec, _dtype_of(rec)))


def _judge(rec: Record, res: JobResult, ref: list[torch.Tensor], got: list[torch.Tensor],
           precision_of: Callable[[torch.dtype], torch.dtype], arguments: Callable[[], dict | None] | None):
    """A quantized program by its scheme's budget (``quant_budget``), any other by the float rule."""
    allowed = res.facts.get("quant_allowed_nsr")
    if allowed is not None:
        return judge_quantized(ref, got, allowed, res.facts.get("quant_scheme") or "int8")
    dtype = ref[0].dtype if ref else torch.float32
    return judge_backend(ref, got, precision_of(dtype) if dtype.is_floating_point else None, op=rec.op,
                         arguments=arguments)


def _dtype_of(rec: Record) -> str:
    """The record's compute dtype: the first floating one of its inputs, then of its parameters
    (an Embedding's table) and outputs; else its first input's."""
    metas = [m for _, m in rec.input_tensors()]
    floats = [*metas, *(m for m in rec.params.values() if hasattr(m, "dtype")), *(m for _, m in rec.output_tensors())]
    return next((m.dtype for m in floats if "float" in m.dtype), metas[0].dtype if metas else "")
