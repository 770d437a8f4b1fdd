"""Per layer: the worst local error (the layer's ops recomputed on the backend's own inputs, by
compare's ``local_error``) beside the worst accumulated error (backend vs eager, compare's rows).

Local error large: the layer itself computes wrongly on what it received. Local error at its
floor while the accumulated error grows: it is only fed drifted inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..compare.local import local_error
from ..compare.result import CompareRow, PairStatus
from ..dump import load_dump

_RANK = {PairStatus.PASS.value: 0, PairStatus.SKIP.value: 0, PairStatus.WARNING.value: 1,
         PairStatus.UNMATCHED.value: 0, PairStatus.FAIL.value: 2, PairStatus.NAN_INF.value: 3}


@dataclass
class LayerRow:
    """One layer (innermost module path) of one backend's run."""

    layer: str
    compared: int = 0  # output tensors compared
    worst: str = PairStatus.PASS.value
    born: int = 0  # rows compare marked as born here
    local_err: float | None = None  # max over the layer's ops; None: not measurable (inputs not captured)
    local_floor: float | None = None  # the floor of the op with that local error
    accumulated_err: float | None = None  # max |backend - eager| / max |eager| over the layer's outputs
    isolated_err: float | None = None  # the same, each op fed eager inputs on the backend (isolated run)


def layer_rows(rows: list[CompareRow], target: Path) -> list[LayerRow]:
    """Layers in execution order, from compare's rows and a local-error pass over the target dump."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny memory-bound ops: one thread, as compare_dumps runs them
    try:
        return _layer_rows(rows, target)
    finally:
        torch.set_num_threads(threads)


def _layer_rows(rows: list[CompareRow], target: Path) -> list[LayerRow]:
    dump = load_dump(target)
    # compare strips wrapper prefixes from module paths ("model."); layers keep the recorded path
    where = {rec.seq: rec.module or "<root>" for rec in dump.records}
    layers: dict[str, LayerRow] = {}
    for r in rows:
        if r.status == PairStatus.UNMATCHED.value or r.target_seq not in where:
            continue
        name = where[r.target_seq]
        row = layers.setdefault(name, LayerRow(name))
        if r.status == PairStatus.SKIP.value:  # not materialised by the backend
            continue
        row.compared += 1
        if _RANK.get(r.status, 0) > _RANK.get(row.worst, 0):
            row.worst = r.status
        row.born += r.origin == "born"
        if r.accumulated_err is not None:
            row.accumulated_err = max(row.accumulated_err or 0.0, r.accumulated_err)
    try:
        for rec in dump.records:
            row = layers.get(rec.module or "<root>")
            if row is None:
                continue
            for k, (_, meta) in enumerate(rec.output_tensors()):
                le = local_error(rec, dump, meta, k)
                if le is not None and (row.local_err is None or le.local > row.local_err):
                    row.local_err, row.local_floor = le.local, le.floor
    finally:
        dump.close()
    return list(layers.values())
