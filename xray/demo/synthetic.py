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
    op: str
    out: torch.Tensor
    module: str = "layer"
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    kind: str = "op"


def meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(shape=tuple(t.shape), dtype=dtype_name(t.dtype), stride=tuple(t.stride()),
                      stats=tensor_stats(t))


def write_dump(folder: Path, ops: list[Op], save: bool = True, finish: bool = True) -> Path:
    """A trace dump of ``ops`` in order; outputs saved when ``save``. ``finish=False`` leaves it
    as a killed process would: journal and segments flushed, no dump.json."""
    w = DumpWriter(Path(folder), {"pid": 0, "rank": None, "config": {}})
    for seq, o in enumerate(ops):
        rec = Record(seq=seq, kind=o.kind, op=o.op, module=o.module)
        rec.inputs = {k: meta_of(v) for k, v in o.inputs.items()}
        out = meta_of(o.out)
        if save:
            out.data = w.save_tensor(rec, "out.0", o.out.contiguous())
        rec.outputs = [out]
        w.add(rec)
    if finish:
        w.close({})
    else:
        w.flush()
        w.abandon()
    return Path(folder)
