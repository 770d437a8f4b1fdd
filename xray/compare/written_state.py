"""Module state at its first read in a run, for telling state the run wrote from state that came
in different (causality._Graph.written_by_the_run). The recorder keeps a parameter's or buffer's
name across the run's writes to it (a batch norm's running statistics in training, an optimizer
step's update), so a later read of such state may differ by what the run computed, not by what
it was given: both runs held the same values at its first read, and the target's changed since."""
from __future__ import annotations

import numpy as np

from ..dump.columns import INPUT, SRC_BUFFER, SRC_PARAM
from ..dump.model import TensorMeta


def first_reads(columns) -> dict[str, TensorMeta]:
    """Each parameter's and buffer's TensorMeta at its first read as an input, by its source
    (``"buffer:bn.running_mean"``), from a dump's columns in one pass (records in seq order)."""
    t, r = columns.tensors, columns.records
    rows = np.flatnonzero(np.isin(t["src_kind"], (SRC_PARAM, SRC_BUFFER)) & (t["role"] == INPUT))
    if not len(rows):
        return {}
    rows = rows[np.argsort(r["seq"][t["record"][rows]], kind="stable")]
    key = t["src_kind"][rows].astype(np.int64) << 32 | t["src_name"][rows].astype(np.int64)
    _, first = np.unique(key, return_index=True)
    metas = (columns.tensor_meta(int(j)) for j in rows[first])
    return {m.source: m for m in metas}
