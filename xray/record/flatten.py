"""Flatten module arguments and results to tensors with stable indices.

The one numbering of ``forward_input.<i>``/``forward_output.<i>``: the debugger names tensors
with it, the tracer's module records and replay's module outputs follow it, so their indices
always agree. Only tensors count; tuples, lists and dicts (transformers' ModelOutput is an OrderedDict) are
walked in order, so the same structure always yields the same numbering. Other objects
(caches, configs) are skipped.
"""
from __future__ import annotations

from typing import Any

import torch


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):  # the common cases, without the walk: one tensor,
        return [value]
    if value is None:  # an absent optional argument,
        return []
    if type(value) is tuple and len(value) == 1 and isinstance(value[0], torch.Tensor):
        return [value[0]]  # and a module's usual positional arguments
    out: list[torch.Tensor] = []
    _walk(value, out)
    return out


def flatten_kwargs(kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """(keyword, tensor) for each tensor of a call's keyword arguments, in the order (and so
    with the numbering) ``flatten_tensors(kwargs)`` gives them. One call per module call: most
    keyword values (None, flags, caches) hold no tensor."""
    pairs: list[tuple[str, torch.Tensor]] = []
    for keyword, value in kwargs.items():
        if type(value) not in _NO_TENSORS:
            pairs += [(keyword, t) for t in flatten_tensors(value)]
    return pairs


_NO_TENSORS = frozenset({type(None), bool, int, float, str})


def _walk(v: Any, out: list) -> None:
    if isinstance(v, torch.Tensor):
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _walk(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _walk(x, out)

