"""Write one backend's replay results as an xray trace dump, so ``xray-compare`` reads it like any dump.

Each replayed record keeps the source record's identity (seq, op, module, count) and gets the
inputs the replay really used (metadata and statistics) and the backend's outputs (statistics and
saved data). Records the backend could not run are left out: they have no outputs to compare.
"""
from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import torch

from ..dump.model import Record, TensorMeta
from ..dump.stats import tensor_stats
from ..dump.tensorio import dtype_name
from ..dump.folder_owner import new_token, own_folder, release_folder
from ..dump.writer import DumpWriter


class ReplayDumpWriter:
    """A DumpWriter for one backend's replay, with the replay described in the header."""

    def __init__(self, folder: Path, backend: str, source: str, options: dict[str, Any],
                 config: dict[str, Any]) -> None:
        header = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch_version": torch.__version__,
                  "python_version": platform.python_version(), "host": platform.node(), "pid": None, "rank": None,
                  "config": config, "replay": {"backend": backend, "options": options, "source": source}}
        # The folder is this run's alone: a second replay into the same --out at the same time
        # gets its own beside it instead of deleting this one's segments.
        self.token = new_token()
        folder = own_folder(Path(folder), self.token, keep_earlier=False)
        self.writer = DumpWriter(folder, header)
        self.folder = folder
        self.count = 0
        self.saved = 0

    def add(self, source: Record, inputs: list[dict], outputs: list[torch.Tensor]) -> None:
        rec = Record(seq=source.seq, kind=source.kind, op=source.op, direction=source.direction, module=source.module,
                     module_stack=list(source.module_stack), mutates=list(source.mutates), count=source.count,
                     first_seq=source.first_seq, last_seq=source.last_seq, call_index=source.call_index,
                     step=source.step)
        rec.inputs = _inputs_like(source, inputs)
        metas = []
        for i, t in enumerate(outputs):
            m = TensorMeta(tuple(t.shape), dtype_name(t.dtype), tuple(t.stride()), 0, "cpu", stats=tensor_stats(t))
            m.data = self.writer.save_tensor(rec, f"out.{i}", t.contiguous())
            self.saved += 1
            metas.append(m)
        rec.outputs = _shape_like(source.outputs, metas)
        self.writer.add(rec)
        self.count += 1

    def close(self, seconds: float) -> Path:
        folder = self.writer.close({"op_calls": self.count, "records": self.count, "tensors_saved": self.saved,
                                    "seconds": round(seconds, 6), "error": None})
        release_folder(folder, self.token)  # a later replay of this process into --out replaces it
        return folder


def _inputs_like(source: Record, used: list[dict]) -> dict[str, Any]:
    """The source record's inputs with each tensor replaced by the one the replay used."""
    metas = iter(TensorMeta.from_json(m) for m in used)

    def swap(v: Any) -> Any:
        if isinstance(v, TensorMeta):
            return next(metas, _no_data(v))
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    if source.kind == "module":  # parameters keep their recorded metadata; they are not replay inputs
        from .modules import input_order

        keys = input_order(source)[0]
        swapped = {k: swap(source.inputs[k]) for k in keys}
        return {k: swapped.get(k, _no_data(v)) for k, v in source.inputs.items()}
    from ..ops.rebuild import resolve_op

    order = [a.name for a in resolve_op(source.op)._schema.arguments if a.name in source.inputs]
    swapped = {k: swap(source.inputs[k]) for k in order}
    return {k: swapped[k] for k in source.inputs}


def _no_data(v: Any) -> Any:
    """A recorded value without its data reference (which points into the source dump)."""
    if isinstance(v, TensorMeta):
        return TensorMeta(v.shape, v.dtype, v.stride, v.storage_offset, v.device, v.requires_grad, v.stats)
    if isinstance(v, list):
        return [_no_data(x) for x in v]
    return v


def _shape_like(template: list[Any], flat: list[TensorMeta]) -> list[Any]:
    """Put flat output tensors back in the source record's output structure (lists stay lists)."""
    n = sum(1 for _ in _leaves(template))
    if n != len(flat):
        return list(flat)
    it = iter(flat)

    def fill(v: Any) -> Any:
        if isinstance(v, TensorMeta):
            return next(it)
        if isinstance(v, list):
            return [fill(x) for x in v]
        return v

    return [fill(v) for v in template]


def _leaves(v: Any):
    if isinstance(v, TensorMeta):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from _leaves(x)
