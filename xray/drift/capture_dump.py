"""Write one backend's ``ModelCapture`` as an xray trace dump that ``xray-compare`` reads against the eager one.

Each record copies the eager record's identity (seq, op, layer, module stack, non-tensor
arguments, each input's ``src`` edge) and carries the backend's tensors: its outputs, and as
saved inputs the backend's own values of the producers it captured (an op output, a parameter
as the deployed graph holds it, the model input it was fed). Compare then judges the backend
with its one rule set, and its local error recomputes each op on the backend's own inputs. An
input whose producer the backend never materialised keeps shape and dtype only (no statistics,
no data): what it held there is unknown. A backend may list ``None`` among a node's values for
an output it kept no value of (ONNX LayerNormalization has no mean/rstd outputs unless they are
read); that output is described the same way.

Records of nodes the backend did not expose are still written, their outputs described without
statistics or data and with a ``note``: compare then skips them, and both dumps hold the same
records in the same order, so its matcher pairs every record with itself. (Left out, a sparse
capture let compare pair an eager ``permute`` with a later captured ``permute`` of the same
module and shape.) A value whose shape is not the node's is not the node's tensor: it is not
written, as compare never compares a reshaped pair in memory order.
"""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..backends.base import ModelCapture
from ..dump.model import Record, Source, TensorMeta, shape_only
from ..dump.stats import tensor_stats
from ..dump.tensorio import dtype_name
from ..dump.writer import DumpWriter


def _meta(t: torch.Tensor) -> TensorMeta:
    t = t.detach().cpu()
    stride = tuple(t.contiguous().stride())
    return TensorMeta(tuple(t.shape), dtype_name(t.dtype), stride, 0, "cpu", stats=tensor_stats(t))


def _fits(t: Any, meta: TensorMeta) -> bool:
    """The node's shape, or a permutation of it (a backend holding an NCHW node as NHWC): compare
    pairs those and checks the layout (export-validator's NCHW/NHWC check), never memory order."""
    if not isinstance(t, torch.Tensor):
        return False
    shape, want = tuple(t.shape), tuple(meta.shape)
    return shape == want or (len(shape) >= 3 and sorted(shape) == sorted(want) and len(set(want)) > 1)


def _usable(got: list | None, metas: list[TensorMeta]) -> bool:
    """The backend's outputs of a node (None where it kept no value: LayerNorm's unused mean and
    rstd) describe the record: the same count, and every value it kept of the node's shape (or
    a permutation of it)."""
    return bool(got) and len(got) == len(metas) and any(t is not None for t in got) and \
        all(t is None or _fits(t, m) for t, m in zip(got, metas))


class CaptureResolver:
    """Finds the backend's value behind a record's input, by graph edge only: op outputs through
    the producing record's node (``src`` ``op:<seq>:<k>``), parameters and buffers through their
    placeholder (``param:``/``buffer:<name>``), and inputs read straight from a placeholder (the
    model inputs the backend was fed, lifted constants) through the node's own argument."""

    def __init__(self, capture: ModelCapture, seq_node: dict[int, str], state: dict[str, str],
                 placeholder_args: dict[int, dict[str, str]]) -> None:
        self.values = capture.values
        self.seq_node = seq_node
        self.state = state
        self.placeholder_args = placeholder_args

    def source(self, src: str | None, seq: int, key: str) -> torch.Tensor | None:
        try:
            s = Source.parse(src)
        except ValueError:
            return None
        if s is None:
            return None
        if s.kind == "op":
            got = self.values.get(self.seq_node.get(s.seq, ""), [])
            return got[s.index] if s.index is not None and s.index < len(got) else None
        name = self.state.get(str(s), "") if s.kind in ("param", "buffer") else \
            self.placeholder_args.get(seq, {}).get(key, "")
        got = self.values.get(name, [])
        return got[0] if got else None


@dataclass
class Written:
    """What ``write_capture`` wrote: the dump, and how many eager records carry backend values."""

    folder: Path
    mapped: int  # eager records (with an output tensor) written with the backend's values
    records: int  # eager records with an output tensor
    misshapen: list[str]  # nodes whose backend value had another shape: not the node's tensor


def write_capture(folder: Path, eager: Any, capture: ModelCapture, resolver: CaptureResolver,
                  seq_node: dict[int, str], *, backend: str, options: dict[str, Any]) -> Written:
    """Write the backend's dump: one record per eager op record, in the eager order."""
    header = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch_version": torch.__version__,
              "python_version": platform.python_version(), "host": platform.node(), "pid": None, "rank": None,
              "config": dict(eager.header.get("config") or {}),
              "drift": {"backend": backend, "options": {k: repr(v) if not isinstance(v, (int, float, str, bool, type(None)))
                                                          else v for k, v in options.items()},
                        "granularity": capture.granularity, "notes": list(capture.notes),
                        "reference": str(eager.folder)}}
    writer = DumpWriter(folder, header)
    mapped = with_outputs = saved = 0
    misshapen = []
    absent = f"not materialised by {backend}"
    started = time.perf_counter()
    for rec in eager.records:
        metas = [m for _, m in rec.output_tensors()]
        if rec.kind != "op":
            continue
        with_outputs += bool(metas)
        node = seq_node.get(rec.seq, "")
        got = capture.values.get(node)
        out = Record(seq=rec.seq, kind=rec.kind, op=rec.op, direction=rec.direction, module=rec.module,
                     module_stack=list(rec.module_stack), mutates=list(rec.mutates), count=rec.count,
                     first_seq=rec.first_seq, last_seq=rec.last_seq)
        if metas and _usable(got, metas):
            out.inputs = {k: _input(v, k, out, writer, resolver) for k, v in rec.inputs.items()}
            tensors = iter(got)
            out.outputs = [_output(v, tensors, out, i, writer, absent) for i, v in enumerate(rec.outputs)]
            saved += sum(t is not None for t in got)
            mapped += 1
        else:
            if metas and got and len(got) == len(metas) and any(t is not None for t in got):
                misshapen.append(node)
            out.inputs = {k: shape_only(v) for k, v in rec.inputs.items()}
            out.outputs = [shape_only(v, absent) for v in rec.outputs]
        writer.add(out)
    writer.close({"op_calls": len(eager.records), "records": len(eager.records), "tensors_saved": saved,
                  "seconds": round(time.perf_counter() - started, 6), "error": None})
    return Written(Path(folder), mapped, with_outputs, misshapen)


def _input(v: Any, name: str, rec: Record, writer: DumpWriter, resolver: CaptureResolver) -> Any:
    if isinstance(v, list):
        return [_one_input(x, f"{name}.{i}", rec, writer, resolver) for i, x in enumerate(v)]
    return _one_input(v, name, rec, writer, resolver)


def _one_input(v: Any, name: str, rec: Record, writer: DumpWriter, resolver: CaptureResolver) -> Any:
    if not isinstance(v, TensorMeta):
        return v
    t = resolver.source(v.source, rec.seq, name)
    if t is None or not _fits(t, v):
        return shape_only(v)
    t = t.detach().cpu()
    meta = _meta(t)
    meta.source = v.source
    meta.data = writer.save_tensor(rec, f"in.{name}", t.contiguous())
    return meta


def _output(v: Any, tensors, rec: Record, i: Any, writer: DumpWriter, absent: str) -> Any:
    if isinstance(v, list):
        return [_output(x, tensors, rec, f"{i}.{j}", writer, absent) for j, x in enumerate(v)]
    if not isinstance(v, TensorMeta):
        return v
    t = next(tensors)
    if t is None:
        return shape_only(v, absent)
    t = t.detach().cpu()
    meta = _meta(t)
    meta.data = writer.save_tensor(rec, f"out.{i}", t.contiguous())
    return meta
