"""Turn one captured tensor into an index row (statistics now, data copied now when saving).

Statistics are cached per tensor object and version counter: a module's output is usually the
next module's input, and q/k/v projections share one input, so each value is reduced once.
Parameters keep their cached statistics across steps until an optimizer bumps their version.
"""
from __future__ import annotations

import json
import math
from typing import Callable, NamedTuple

import torch

from ..dump.model import Stats
from ..dump.stats import StatsCache, tensor_stats
from ..dump.tensorio import dtype_name
from .layout import module_prefix, prefixed_name
from .writer import ModuleDumpWriter


class CallKey(NamedTuple):
    """One module call in one direction: the unit that becomes one Record. (A NamedTuple: one
    is built per module call, and a frozen dataclass costs several times more to construct.)"""

    step: int
    seq: int
    path: str
    cls: str
    call_index: int
    direction: str  # "forward" | "backward"


def _f(x: float | None) -> float:
    return math.nan if x is None else x  # NaN in the table means "no finite element"


# The dtype, shape and device cells, memoised: a step writes hundreds of rows that share a
# handful of each, and formatting them afresh was a visible part of the per-step cost.
_CELL_TEXT: dict = {}


def _cell(v: torch.dtype | torch.Size | torch.device) -> str:
    text = _CELL_TEXT.get(v)
    if text is None:
        if len(_CELL_TEXT) > 4096:  # dynamic shapes: keep the memo bounded
            _CELL_TEXT.clear()
        text = _CELL_TEXT[v] = (dtype_name(v) if isinstance(v, torch.dtype)
                                else json.dumps(list(v)) if isinstance(v, torch.Size) else str(v))
    return text


def _tensor_cells(t: torch.Tensor) -> tuple[Stats, tuple, tuple]:
    """What a tensor version contributes to every row that names it: its statistics, its
    (dtype, shape, device) cells and its numeric cells. Cached per tensor version with the
    statistics, so the many rows that re-name a tensor (a module's input is the output before
    it; parameters recur every step) build none of it again."""
    s = tensor_stats(t)
    return (s, (_cell(t.dtype), _cell(t.shape), _cell(t.device)),
            (_f(s.min), _f(s.max), _f(s.mean), _f(s.std), s.nan, s.posinf, s.neginf, s.numel))


class TensorCapture:
    def __init__(self, writer: ModuleDumpWriter, *, save_data: bool, overflow_only: bool,
                 on_overflow: Callable[[CallKey, str, Stats], None] | None = None) -> None:
        self.writer = writer
        self.save_data = save_data
        self.overflow_only = overflow_only
        self.on_overflow = on_overflow
        self._cells = StatsCache(_tensor_cells)
        self._saved_params: dict[tuple[int, int], str] = {}  # (step, id(param)) -> dataset path
        self._call: CallKey | None = None  # the last call named, and its name prefix
        self._prefix = ""

    def capture(self, call: CallKey, role: str, key: str, t: torch.Tensor, param: bool = False,
                keyword: str = "") -> None:
        """Add ``t``'s row to its step's index (``param``: a parameter, saved once per step;
        ``keyword``: the keyword argument it came from). Positional, for the hot path."""
        s, meta, numbers = self._cells.get(t)
        if self.overflow_only and s.finite:
            return
        if call is not self._call:  # a call's tensors mostly come in a run: prefix it once
            self._call, self._prefix = call, module_prefix(call.path, call.cls, call.call_index)
        name = prefixed_name(self._prefix, role, key)
        data = ""
        if self.save_data and t.layout == torch.strided and not t.is_meta:
            pkey = (call.step, id(t))
            data = self._saved_params.get(pkey, "") if param else ""
            if not data:
                data = self.writer.write_tensor(call.step, name, t)
                if param:
                    self._saved_params[pkey] = data
        self.writer.step_rows(call.step).append((call.seq, name, call.path, call.cls, call.call_index, call.direction, role, key, *meta,
                     t.requires_grad, *numbers, data, keyword))
        if (s.nan or s.posinf or s.neginf) and self.on_overflow is not None \
                and role in ("forward_output", "backward_output"):
            self.on_overflow(call, name, s)

    def new_step(self) -> None:
        self._saved_params.clear()
        self._call = None
