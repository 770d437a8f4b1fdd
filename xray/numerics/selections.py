"""Index outputs of selections (sort, topk, argmax, max pooling...): right up to the order of ties.

Where candidates hold equal values, which index a kernel returns is its own choice: a stable
sort, a vectorised max, ONNX's TopK and a GPU's radix sort each break ties their way, and none
is wrong. So two index outputs of one call agree when the values they pick from the call's input
agree. Compare (an index output's local error) and replay (a backend against the baseline) both
judge index outputs by this one rule; it needs the input, never a guess from the outputs alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .kernel_families import packet


@dataclass(frozen=True)
class Selection:
    """How an op's index output points into its input ``self``."""

    indices: int  # the output that holds the indices
    dim: int | None  # ``dim``'s default; None: the whole input, flattened (argmax without a dim)
    spatial: int = 0  # pooling: indices count over this many trailing dims, flattened
    permutation: bool = False  # each position along ``dim`` exactly once (sort, argsort)


SELECTIONS: dict[str, Selection] = {
    "aten.sort": Selection(1, -1, permutation=True),
    "aten.argsort": Selection(0, -1, permutation=True),
    "aten.topk": Selection(1, -1),
    "aten.kthvalue": Selection(1, -1),
    "aten.mode": Selection(1, -1),
    "aten.max": Selection(1, None),  # max.dim; max.default and max.other return no indices
    "aten.min": Selection(1, None),
    "aten.median": Selection(1, None),  # median.dim; median.default returns the value only
    "aten.nanmedian": Selection(1, None),
    "aten.cummax": Selection(1, None),
    "aten.cummin": Selection(1, None),
    "aten.argmax": Selection(0, None),
    "aten.argmin": Selection(0, None),
    "aten.max_pool1d_with_indices": Selection(1, None, spatial=1),
    "aten.max_pool2d_with_indices": Selection(1, None, spatial=2),
    "aten.max_pool3d_with_indices": Selection(1, None, spatial=3),
    "aten.adaptive_max_pool1d": Selection(1, None, spatial=1),
    "aten.adaptive_max_pool2d": Selection(1, None, spatial=2),
    "aten.adaptive_max_pool3d": Selection(1, None, spatial=3),
}


def selection_of(op: str, k: int) -> Selection | None:
    """The selection whose index output is output ``k`` of ``op``, or None."""
    s = SELECTIONS.get(packet(op)) if op else None
    return s if s is not None and s.indices == k else None


def has_index_output(op: str) -> bool:
    """``op`` may return indices into its input (whether this overload does: ``selection_of``)."""
    return bool(op) and packet(op) in SELECTIONS


def differing_picks(op: str, k: int, arguments: Mapping[str, Any], ref: torch.Tensor,
                    got: torch.Tensor) -> torch.Tensor | None:
    """Per element of index output ``k``: True where ``got`` picks another value of the input
    than ``ref`` does (or an index out of range, or, for a sort, not each position once); False
    where both pick equal values, however the ties were broken. ``arguments``: the call's
    arguments by schema name (``self``, ``dim``). None when output ``k`` is no selection's
    indices or the tensors do not fit the call."""
    sel = selection_of(op, k)
    source = arguments.get("self")
    if sel is None or not isinstance(source, torch.Tensor) or ref.shape != got.shape:
        return None
    if ref.dtype.is_floating_point or got.dtype.is_floating_point or ref.dtype == torch.bool:
        return None
    dim = arguments.get("dim", sel.dim)
    source = source.detach().cpu()
    try:
        mine, valid = _picks(sel, source, dim, ref.cpu())
        theirs, fits = _picks(sel, source, dim, got.cpu())
    except (RuntimeError, IndexError, TypeError):
        return None
    differ = ~(valid & fits & _same(mine, theirs))
    if sel.permutation and dim is not None and ref.dim():
        d = dim % ref.dim()
        differ |= ref.sort(dim=d).values.cpu() != got.sort(dim=d).values.cpu()
    return differ


def _picks(sel: Selection, source: torch.Tensor, dim: int | None,
           idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The values of ``source`` that ``idx`` points at (shaped like ``idx``), and where ``idx`` is
    in range (out-of-range indices pick position 0, and are marked)."""
    idx = idx.long()
    if sel.spatial:
        flat, where = source.flatten(-sel.spatial), idx.flatten(-sel.spatial)
        size = flat.shape[-1]
        valid = (where >= 0) & (where < size)
        return flat.gather(-1, where.where(valid, 0)).reshape(idx.shape), valid.reshape(idx.shape)
    if dim is None or source.dim() == 0:
        flat = source.flatten()
        valid = (idx >= 0) & (idx < flat.numel())
        return flat[idx.where(valid, 0)], valid
    d = dim % source.dim()
    where = idx if idx.dim() == source.dim() else idx.unsqueeze(d)  # keepdim=False dropped it
    valid = (where >= 0) & (where < source.shape[d])
    return source.gather(d, where.where(valid, 0)).reshape(idx.shape), valid.reshape(idx.shape)


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Equal values, NaN equal to NaN (sort puts NaNs last, in an order of its own)."""
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same |= a.isnan() & b.isnan()
    return same
