"""Write real trace dumps with xray's own DumpWriter: used by the compare tests and tools/bench_compare.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from xray.dump.model import Record, TensorMeta
from xray.dump.stats import tensor_stats
from xray.dump.tensorio import dtype_name
from xray.dump.writer import DumpWriter


@dataclass
class Op:
    """One record. ``sources`` maps input names to format-v2 sources ("op:<seq>:0", "param:w",
    "input"); ``params`` are a module record's parameters; ``save_inputs`` saves the input
    tensors too, so compare can recompute the op; ``direction`` "backward" marks backward ops."""

    op: str
    out: torch.Tensor
    module: str = "layer"
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    kind: str = "op"
    sources: dict[str, str] = field(default_factory=dict)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    save_inputs: bool = False
    direction: str = "forward"
    count: int = 1
    more_outputs: list[torch.Tensor] = field(default_factory=list)  # outputs 1, 2, ... of the same call


def meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(shape=tuple(t.shape), dtype=dtype_name(t.dtype), stride=tuple(t.stride()),
                      stats=tensor_stats(t))


def write_dump(folder: Path, ops: list[Op], save: bool = True, finish: bool = True) -> Path:
    """A trace dump of ``ops`` in order; outputs saved when ``save``. ``finish=False`` leaves it
    as a killed process would: journal and segments flushed, no dump.json."""
    w = DumpWriter(Path(folder), {"pid": 0, "rank": None, "config": {}})
    for seq, o in enumerate(ops):
        rec = Record(seq=seq, kind=o.kind, op=o.op, module=o.module, direction=o.direction, count=o.count)
        rec.inputs = {k: meta_of(v) for k, v in o.inputs.items()}
        for k, m in rec.inputs.items():
            m.source = o.sources.get(k)
            if o.save_inputs:
                m.data = w.save_tensor(rec, f"in.{k}", o.inputs[k].contiguous())
        rec.params = {k: meta_of(v) for k, v in o.params.items()}
        for k, m in rec.params.items():
            m.source = f"param:{o.module}.{k}"
            if save:
                m.data = w.save_tensor(rec, f"param.{k}", o.params[k].contiguous())
        rec.outputs = []
        for i, t in enumerate([o.out, *o.more_outputs]):
            out = meta_of(t)
            if save:
                out.data = w.save_tensor(rec, f"out.{i}", t.contiguous())
            rec.outputs.append(out)
        w.add(rec)
    if finish:
        w.close({})
    else:
        w.flush()
        w.abandon()
    return Path(folder)
