"""One (record, backend) replay as it runs inside an isolated worker: build, export (cached), run.

Jobs and results are plain data (JSON-able dicts and numpy arrays) so they cross the process
boundary without pickling live torch objects. Comparison with the baseline happens in the parent.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..backends.base import Artifact, Backend, BackendError, ReplayStatus, flatten_tensors, short_error
from ..dump.model import Record, TensorMeta
from ..dump.stats import tensor_stats
from ..dump.tensorio import dtype_name, from_numpy, to_numpy


@dataclass
class Job:
    """Replay ``record`` (JSON) from the dump at ``dump`` on the backend spec ``backend``."""

    dump: str
    record: dict
    backend: str
    factory: str = "auto"
    seed: int = 0
    cache_dir: str | None = None
    repeats: int = 5
    model: str | None = None  # "pkg.module:factory" for module records
    weights_const: bool = True  # recorded parameters become module constants, not inputs


@dataclass
class JobResult:
    status: int
    error: str | None = None
    outputs: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (dtype name, bits)
    inputs: list[dict] = field(default_factory=list)  # TensorMeta JSON (with stats) of the inputs used
    facts: dict[str, Any] = field(default_factory=dict)
    latency_ms: float | None = None
    cached: bool = False
    # a dynamic export run again at its second size (``xray.backends.shapes``): the backend's
    # outputs there and the eager module's, computed in the worker
    second: list[tuple[str, np.ndarray]] = field(default_factory=list)
    second_reference: list[tuple[str, np.ndarray]] = field(default_factory=list)

    def output_tensors(self) -> list[torch.Tensor]:
        return [from_numpy(a, d) for d, a in self.outputs]

    def second_tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return [from_numpy(a, d) for d, a in self.second], [from_numpy(a, d) for d, a in self.second_reference]


def signature(record: Record | dict) -> dict:
    """What determines an exported program: op, input shapes/dtypes/strides and non-tensor values
    (statistics and saved-data references stripped)."""
    rec = record if isinstance(record, dict) else record.to_json()

    def strip(v: Any) -> Any:
        if isinstance(v, dict) and v.get("t") == "tensor":
            return {k: v.get(k) for k in ("shape", "dtype", "stride", "offset")}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return {"kind": rec["kind"], "op": rec["op"], "module": rec.get("module") if rec["kind"] == "module" else None,
            "inputs": {k: strip(v) for k, v in rec.get("inputs", {}).items()}}


def signature_hash(record: Record | dict) -> str:
    return hashlib.sha256(json.dumps(signature(record), sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_key(job: Job, backend: Backend, module: torch.nn.Module) -> str:
    """The export's identity: the call's signature, the backend, and the values of the module's
    parameters and buffers, which exporters bake into the artifact as constants (two calls of
    one signature with different weights must not share an export)."""
    weights = hashlib.sha256()
    for name, t in module.state_dict().items():
        weights.update(name.encode())
        weights.update(to_numpy(t).tobytes())
    blob = {"sig": signature(job.record), "kind": backend.kind, "options": backend.options,
            "versions": backend.versions(), "model": job.model, "weights_const": job.weights_const,
            "weights": weights.hexdigest()}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:24]


# -- cache ------------------------------------------------------------------------------------------

def _cache_load(folder: Path, key: str) -> tuple[Artifact | None, BackendError | None]:
    meta_path = folder / f"{key}.json"
    if not meta_path.exists():
        return None, None
    meta = json.loads(meta_path.read_text())
    if meta.get("status") is not None:  # a cached failure: don't pay for the export again
        return None, BackendError(ReplayStatus(meta["status"]), meta.get("error") or "")
    data = None
    if meta.get("suffix") and (folder / f"{key}{meta['suffix']}").exists():
        data = (folder / f"{key}{meta['suffix']}").read_bytes()
    elif meta.get("has_data"):
        return None, None  # data file lost: export again
    return Artifact(data=data, suffix=meta.get("suffix") or ".bin", facts=meta.get("facts", {}),
                    unsupported_reason=meta.get("unsupported_reason")), None


def _cache_store(folder: Path, key: str, artifact: Artifact | None, error: BackendError | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if error is not None:
        meta = {"status": int(error.status), "error": str(error)}
    else:
        meta = {"suffix": artifact.suffix if artifact.data is not None else None, "has_data": artifact.data is not None,
                "facts": artifact.facts, "unsupported_reason": artifact.unsupported_reason}
        if artifact.data is not None:
            tmp = folder / f"{key}{artifact.suffix}.tmp"
            tmp.write_bytes(artifact.data)
            tmp.replace(folder / f"{key}{artifact.suffix}")
    tmp = folder / f"{key}.json.tmp"
    tmp.write_text(json.dumps(meta, default=str))
    tmp.replace(folder / f"{key}.json")


# -- execution --------------------------------------------------------------------------------------

class JobContext:
    """Per-worker state: open dumps, backends and built models, reused across jobs."""

    def __init__(self) -> None:
        self.dumps: dict[str, Any] = {}
        self.backends: dict[str, Backend] = {}
        self.models: dict[str, torch.nn.Module] = {}

    def dump(self, path: str):
        if path not in self.dumps:
            from ..dump import load_dump

            self.dumps[path] = load_dump(path)
        return self.dumps[path]

    def backend(self, spec: str) -> Backend:
        if spec not in self.backends:
            from ..backends.registry import create

            self.backends[spec] = create(spec)
        return self.backends[spec]


def build_module(job: Job, ctx: JobContext
                 ) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The module to replay, its tensor inputs, and every tensor argument in order (inputs and
    baked-in constants: the replay dump describes them all). Same seed -> same tensors anywhere."""
    record = Record.from_json(job.record)
    dump = ctx.dump(job.dump)
    if record.kind == "module":
        from .modules import module_call

        module, inputs = module_call(record, dump, job.model, ctx.models, factory=job.factory, seed=job.seed)
        return module, inputs, inputs
    from ..ops.rebuild import build_call
    from .opmodule import op_module, parameter_flags

    op, args, kwargs = build_call(record, dump, factory=job.factory, seed=job.seed)
    return op_module(op, args, kwargs, parameter_flags(record, op) if job.weights_const else None)


def execute(job: Job, ctx: JobContext) -> JobResult:
    """Run one job; every failure becomes a status with its error text, never an exception. An op
    record whose arguments give other output shapes or dtypes than it records (an edited size or
    repeat count) is a MISMATCH, found by its meta kernels before anything is allocated; so is a
    run whose outputs differ from the record's."""
    record = None
    try:
        if job.record.get("kind") == "op":
            from ..ops.rebuild import output_mismatch

            record = Record.from_json(job.record)
            why = output_mismatch(record)
            if why is not None:
                return JobResult(int(ReplayStatus.MISMATCH), f"not run: {why}")
        backend = ctx.backend(job.backend)
        module, inputs, every = build_module(job, ctx)
    except Exception as e:  # noqa: BLE001 - reported as the job's result
        return JobResult(int(ReplayStatus.EXPORT_FAIL), f"cannot rebuild the call: {short_error(e)}")
    if backend.contiguous_inputs:
        inputs = tuple(t.contiguous() for t in inputs)
    input_metas = [_meta(t) for t in every]
    artifact, error, cached = None, None, False
    folder = Path(job.cache_dir) if job.cache_dir and backend.cacheable else None
    key = cache_key(job, backend, module) if folder else ""
    if folder:
        artifact, error = _cache_load(folder, key)
        cached = artifact is not None or error is not None
    if not cached:
        from .peak_memory import PeakRss

        start = time.perf_counter()
        try:
            with PeakRss() as peak:
                artifact = backend.export(module, inputs)
            artifact.facts.update(aot_s=round(time.perf_counter() - start, 4), aot_peak_mb=peak.added_mb)
        except BackendError as e:
            error = e
        except Exception as e:  # noqa: BLE001
            error = BackendError(ReplayStatus.EXPORT_FAIL, short_error(e))
        if folder:
            _cache_store(folder, key, artifact, error)
    if error is not None:
        return JobResult(int(error.status), str(error), inputs=input_metas, cached=cached)
    facts = dict(artifact.facts)
    try:
        runner = backend.load(artifact, module, inputs)
        facts = dict(artifact.facts)  # load may add facts (torch.compile's lower_s)
        outputs = runner(inputs)
        times = []
        for _ in range(max(job.repeats, 0)):
            start = time.perf_counter()
            runner(inputs)
            times.append((time.perf_counter() - start) * 1000)
    except BackendError as e:
        return JobResult(int(e.status), str(e), inputs=input_metas, facts=facts, cached=cached)
    except Exception as e:  # noqa: BLE001
        return JobResult(int(ReplayStatus.RUN_FAIL), short_error(e), inputs=input_metas, facts=facts, cached=cached)
    if record is not None:
        from ..ops.rebuild import output_mismatch

        why = output_mismatch(record, [(tuple(t.shape), dtype_name(t.dtype)) for t in outputs])
        if why is not None:
            return JobResult(int(ReplayStatus.MISMATCH), f"outputs are not the recorded ones: {why}",
                             inputs=input_metas, facts=facts, cached=cached)
    result = JobResult(int(ReplayStatus.OK), None, outputs=_arrays(outputs), inputs=input_metas, facts=facts,
                       latency_ms=statistics.median(times) if times else None, cached=cached)
    if facts.get("quantized"):
        from .quant_budget import allowed_nsr

        with torch.no_grad():
            facts["quant_scheme"] = backend.options.get("quant")
            facts["quant_allowed_nsr"] = allowed_nsr(module, inputs, list(flatten_tensors(module(*inputs))),
                                                     facts["quant_scheme"])
    if facts.get("dynamic"):
        _second_size(result, module, inputs, runner)
    return result


def _arrays(tensors: list[torch.Tensor]) -> list[tuple[str, np.ndarray]]:
    return [(dtype_name(t.dtype), to_numpy(t)) for t in tensors]


def _second_size(result: JobResult, module: torch.nn.Module, inputs: tuple, runner: Any) -> None:
    """Run a dynamic export again at its second size, beside the eager module at that size; a
    failure there is the job's status (the program was meant to take that size)."""
    from ..backends.shapes import second_inputs

    second, what = second_inputs(inputs, result.facts)
    result.facts["second_size"] = what if second is not None else f"none: {what}"
    if second is None:
        return
    try:
        result.second = _arrays(runner(second))
    except Exception as e:  # noqa: BLE001
        result.status, result.error = int(getattr(e, "status", ReplayStatus.RUN_FAIL)), \
            f"at the second size ({what}): {short_error(e)}"
        return
    with torch.no_grad():
        result.second_reference = _arrays(list(flatten_tensors(module(*second))))


def _meta(t: torch.Tensor) -> dict:
    return TensorMeta(tuple(t.shape), dtype_name(t.dtype), tuple(t.stride()), t.storage_offset(), str(t.device),
                      stats=tensor_stats(t)).to_json()
