"""Flatten module arguments and results to tensors with stable indices.

Only tensors count; tuples, lists and dicts (transformers' ModelOutput is an OrderedDict) are
walked in order, so the same structure always yields the same numbering. Other objects
(caches, configs) are skipped.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _walk(value, out)
    return out


def _walk(v: Any, out: list) -> None:
    if isinstance(v, torch.Tensor):
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _walk(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _walk(x, out)


def map_tensors(value: Any, fn: Callable[[int, torch.Tensor], torch.Tensor], start: int = 0) -> tuple[Any, int]:
    """Rebuild ``value`` with ``fn(index, tensor)`` in place of each tensor; indices follow
    ``flatten_tensors``. Containers of other types than plain tuple/list/dict are kept as they
    are (their tensors still advance the index), so numbering never shifts."""
    counter = [start]

    def go(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            i = counter[0]
            counter[0] += 1
            return fn(i, v)
        if type(v) in (list, tuple):
            return type(v)(go(x) for x in v)
        if type(v) is dict:
            return {k: go(x) for k, x in v.items()}
        if isinstance(v, (list, tuple, dict)):
            counter[0] += len(flatten_tensors(v))
        return v

    result = go(value)
    return result, counter[0]
