"""Write a compiled run as an xray trace dump that compare reads against the eager one.

The dump holds one record per eager op record, in the eager order and with the eager record's
identity (seq, op, module, arguments, each input's ``src`` edge), as drift's backend dumps do:
compare's matcher then pairs every record with itself. An output that a kernel materialised
carries the kernel's buffer (statistics, and the tensor when asked); one that inductor fused
away is described by shape and dtype with a ``note``, and compare skips it. An input whose
producer was materialised carries the compiled value, so compare can recompute an extern
kernel's local error on the compiled run's own inputs; weights and model inputs are the ones
both runs were fed.

What no record column holds (the kernel, the nodes it fuses) is in ``dump.json``'s header,
``compiled.records`` keyed by seq (docs/format.md, "Compiled runs").
"""
from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import torch

from ..dump.model import Record, Source, TensorMeta, shape_only
from ..dump.stats import tensor_stats
from ..dump.tensorio import dtype_from_name, dtype_name
from ..dump.writer import DumpWriter
from ..numerics import math_settings
from ..ops.rebuild import contiguous_stride
from .capture import Described
from .mapping import Pair
from .region import Region

FUSED = "not materialised by {backend}: fused into a kernel"
REBUILT = "fused away by {backend}: recomputed in float64 from the compiled run's materialised values"


def _meta(t: Any, source: str | None = None) -> TensorMeta:
    if isinstance(t, Described):  # reduced at the probe: statistics only
        return TensorMeta(tuple(t.shape), dtype_name(t.dtype), contiguous_stride(tuple(t.shape)), 0, "cpu",
                          stats=t.stats, source=source)
    t = t.detach().cpu()
    return TensorMeta(tuple(t.shape), dtype_name(t.dtype), tuple(t.contiguous().stride()), 0, "cpu",
                      stats=tensor_stats(t), source=source)


def record_info(p: Pair) -> dict[str, Any]:
    """The header entry of one record a kernel materialised."""
    return {"kernel": p.kernel, "buffer": p.buffer, "node": p.node, "output": p.out, "graph": p.graph,
            "launch": p.launch, "fused_nodes": p.fused_nodes, "fused_ops": p.fused_ops}


def run_math(math: dict[str, Any], devices: set[str]) -> dict[str, Any]:
    """The compiled run's header ``math``: its settings (``math_settings.current()``) and, on CPU,
    the reduced-precision steps its kernels may round fp32 to. Inductor's C++ kernels compute fp32
    in fp32, so only its extern kernels' oneDNN settings can ask for a step: compare then reads an
    op whose every call errs at bf16's level as a wrong kernel, not as a bf16 one. Elsewhere
    (Triton's kernels, unprobed) the steps stay unknown."""
    out = dict(math)
    if devices == {"cpu"}:
        out[math_settings.ROUNDS_TO] = math_settings.cpu_fp32_rounding(math)
    return out


def write_compiled(folder: Path, eager: Any, pairs: list[Pair], values: dict[tuple[int, int, int], tuple], *,
                   backend: str, info: dict[str, Any], save_tensors: bool, math: dict[str, Any] | None = None) -> int:
    """Write the compiled run's dump into ``folder``; returns how many outputs carry compiled values.
    ``math``: the header's (``run_math``)."""
    got: dict[tuple[int, int], tuple[torch.Tensor, Pair]] = {}
    for p in pairs:
        got.setdefault((p.seq, p.out), (values[(p.graph, p.run, p.launch)][p.slot], p))
    records: dict[str, list[dict[str, Any]]] = {}
    for (seq, _), (_, p) in sorted(got.items()):
        records.setdefault(str(seq), []).append(record_info(p))
    header = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch_version": torch.__version__,
              "python_version": platform.python_version(), "host": platform.node(), "pid": None, "rank": None,
              "config": dict(eager.header.get("config") or {}), "math": math,
              "compiled": {"backend": backend, **info, "reference": str(eager.folder), "records": records}}
    writer = DumpWriter(folder, header)
    note = FUSED.format(backend=backend)
    started, written = time.perf_counter(), 0
    region = Region(eager, {r.seq: r for r in eager.records if r.kind == "op"},
                    {key: hit[0] for key, hit in got.items()}) if save_tensors else None
    materialised = {seq for seq, _ in got}
    for rec in eager.records:
        if rec.kind != "op":
            continue
        out = Record(seq=rec.seq, kind=rec.kind, op=rec.op, direction=rec.direction, module=rec.module,
                     module_stack=list(rec.module_stack), mutates=list(rec.mutates), count=rec.count,
                     first_seq=rec.first_seq, last_seq=rec.last_seq)
        # a record a kernel wrote is judged on its own inputs: fused-away ones rebuilt, weights saved
        rebuild = Inputs(eager, region, REBUILT.format(backend=backend)) if region and rec.seq in materialised else None
        out.inputs = {k: _input(v, k, out, writer, got, save_tensors, rebuild) for k, v in rec.inputs.items()}
        outputs = []
        for i, v in enumerate(rec.outputs):
            hit = got.get((rec.seq, i)) if isinstance(v, TensorMeta) else None
            if hit is None:
                outputs.append(shape_only(v, note))
                continue
            meta = _meta(hit[0])
            if save_tensors:
                meta.data = writer.save_tensor(out, f"out.{i}", hit[0].contiguous())
            outputs.append(meta)
            written += 1
        out.outputs = outputs
        writer.add(out)
    writer.close({"op_calls": len(eager.records), "records": len(eager.records), "tensors_saved": written,
                  "seconds": round(time.perf_counter() - started, 6), "error": None})
    return written


class Inputs:
    """Where a materialised record's inputs that the compiled run does not hold come from."""

    def __init__(self, eager: Any, region: Region, note: str) -> None:
        self.eager, self.region, self.note = eager, region, note

    def saved(self, v: TensorMeta) -> torch.Tensor | None:
        """A weight's or model input's tensor, as the eager dump saved it (both runs were fed it)."""
        if v.data is None or not self.eager.has_data(v):
            return None
        return self.eager.load_tensor(v).reshape(v.shape)


def _input(v: Any, name: str, rec: Record, writer: DumpWriter, got: dict, save: bool,
           rebuild: Inputs | None = None) -> Any:
    if isinstance(v, list):
        return [_input(x, f"{name}.{i}", rec, writer, got, save, rebuild) for i, x in enumerate(v)]
    if not isinstance(v, TensorMeta):
        return v
    try:
        src = Source.parse(v.source)
    except ValueError:
        src = None
    if src is None or src.kind != "op":  # a weight or a model input: both runs were fed it
        meta = TensorMeta(v.shape, v.dtype, v.stride, v.storage_offset, v.device, stats=v.stats, source=v.source,
                          note=v.note)
        if rebuild is not None and (t := rebuild.saved(v)) is not None:
            meta.data = writer.save_tensor(rec, f"in.{name}", t.contiguous())
        return meta
    hit = got.get((src.seq, src.index))
    if hit is None or tuple(hit[0].shape) != tuple(v.shape):
        rebuilt = rebuild.region.input_value(v) if rebuild is not None else None
        if rebuilt is None:
            return shape_only(v)
        t = rebuilt[0].to(dtype_from_name(v.dtype))
        meta = _meta(t, v.source)
        meta.note = rebuild.note
        meta.data = writer.save_tensor(rec, f"in.{name}", t.contiguous())
        return meta
    meta = _meta(hit[0], v.source)
    if save:
        meta.data = writer.save_tensor(rec, f"in.{name}", hit[0].contiguous())
    return meta
