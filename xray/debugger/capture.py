"""Turn one captured tensor into an index row (statistics now, data copied now when saving).

Statistics are cached per tensor object and version counter: a module's output is usually the
next module's input, and q/k/v projections share one input, so each value is reduced once.
Parameters keep their cached statistics across steps until an optimizer bumps their version.
"""
from __future__ import annotations

import functools
import json
import math
from typing import Callable, NamedTuple

import torch

from ..dump.model import Stats
from ..dump.stats import StatsCache, tensor_stats
from ..dump.tensorio import dtype_name
from ..dump.summary_csv import csv_head_cells, csv_number_cells
from ..dump.module_layout import module_prefix, prefixed_name
from ..dump.module_writer import ModuleDumpWriter


class CallKey(NamedTuple):
    """One module call in one direction: the unit that becomes one Record. (A NamedTuple: one
    is built per module call, cheaper than a frozen dataclass.)"""

    step: int
    seq: int
    path: str
    cls: str
    call_index: int
    direction: str  # "forward" | "backward"


# Built from one tuple through tuple.__new__, skipping the NamedTuple's Python-level __new__.
call_key = functools.partial(tuple.__new__, CallKey)


# The (dtype, shape, device) cells and the CSV's Dtype,Shape text, memoised: a step writes
# hundreds of rows that share a handful of them.
_META_TEXT: dict[tuple, tuple[tuple[str, str, str], str]] = {}


def _meta_cells(t: torch.Tensor) -> tuple[tuple[str, str, str], str]:
    key = (t.dtype, t.shape, t.device)
    text = _META_TEXT.get(key)
    if text is None:
        if len(_META_TEXT) > 4096:  # dynamic shapes: keep the memo bounded
            _META_TEXT.clear()
        meta = (dtype_name(t.dtype), json.dumps(list(t.shape)), str(t.device))
        text = _META_TEXT[key] = (meta, csv_head_cells(meta[0], meta[1]))
    return text


class Cells(NamedTuple):
    """What a tensor version contributes to every row that names it, computed once: the many
    rows that re-name a tensor (a module's input is the output before it; parameters recur
    every step) build none of it again. Cached per tensor version with the statistics."""

    stats: Stats
    meta: tuple[str, str, str]  # the dtype, shape and device cells
    numbers: tuple  # min, max, mean, std (NaN: no finite element), nan, posinf, neginf, numel
    csv: str  # the summary CSV's Dtype..Numel cells
    finite: bool  # stats.finite, read per row on the hot path


def _tensor_cells(t: torch.Tensor) -> Cells:
    s = tensor_stats(t)
    meta, csv_head = _meta_cells(t)
    if s.min is None:  # NaN in the table means "no finite element"
        numbers = (math.nan,) * 4 + (s.nan, s.posinf, s.neginf, s.numel)
    else:
        numbers = (s.min, s.max, s.mean, s.std, s.nan, s.posinf, s.neginf, s.numel)
    return Cells(s, meta, numbers, f"{csv_head},{csv_number_cells(numbers)}", s.finite)


class TensorCapture:
    def __init__(self, writer: ModuleDumpWriter, *, save_data: bool, overflow_only: bool,
                 on_overflow: Callable[[CallKey, str, Stats], None] | None = None) -> None:
        self.writer = writer
        self.save_data = save_data
        self.overflow_only = overflow_only
        self.on_overflow = on_overflow
        self.stats_cache = StatsCache(_tensor_cells)  # per tensor version: its Cells
        self._saved_params: dict[tuple[int, int], str] = {}  # (step, id(param)) -> dataset path
        self._call: CallKey | None = None  # the last call named, its name prefix and step rows
        self._prefix = ""
        self._rows: list[tuple] = []

    def capture(self, call: CallKey, role: str, key: str, t: torch.Tensor, source: str = "",
                keyword: str = "") -> None:
        """Add ``t``'s row to its step's index (``source``: "param:<name>" or "buffer:<name>" for
        the module's own state, saved once per step; ``keyword``: the keyword argument it came
        from). Positional, for the hot path."""
        cells = self.stats_cache.get(t)
        if self.overflow_only and cells.finite:
            return
        if call is not self._call:  # a call's tensors come in a run: look its step up once
            self._call, self._prefix = call, module_prefix(call.path, call.cls, call.call_index)
            self._rows = self.writer.step_rows(call.step)
        name = prefixed_name(self._prefix, role, key)
        data = ""
        if self.save_data and t.layout == torch.strided and not t.is_meta:
            pkey = (call.step, id(t))
            data = self._saved_params.get(pkey, "") if source else ""
            if not data:
                data = self.writer.write_tensor(call.step, name, t)
                if source:
                    self._saved_params[pkey] = data
        self._rows.append((call, name, role, key, cells, t.requires_grad, data, keyword, source))
        if not cells.finite and self.on_overflow is not None and role in ("forward_output", "backward_output"):
            self.on_overflow(call, name, cells.stats)

    def new_step(self) -> None:
        self._saved_params.clear()
        self.stats_cache.forget_parameters()
        self._call = None

    def end_step(self, step: int) -> None:
        """The step's capture is over: seal its rows (ModuleDumpWriter.seal) and drop the cache
        entries of tensors that died, while both are still young garbage."""
        self.writer.seal(step)
        self.stats_cache.sweep()
