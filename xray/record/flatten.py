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
    # Exact types first: isinstance(x, torch.Tensor) is fast for tensors but ~250 ns for any
    # other object (torch's metaclass), and this runs on every module call's arguments and results.
    kind = type(value)
    if kind in PLAIN_TENSORS:  # the common cases, without the walk: one tensor,
        return [value]
    if kind in _NO_TENSORS:  # an absent optional argument or a flag,
        return []
    if kind is tuple and len(value) == 1 and type(value[0]) in PLAIN_TENSORS:
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
        kind = type(value)
        if kind in PLAIN_TENSORS:
            pairs.append((keyword, value))
        elif kind not in _NO_TENSORS:
            pairs += [(keyword, t) for t in flatten_tensors(value)]
    return pairs


# The exact types taken as tensors without an isinstance check (also the C wrappers' list).
PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
_NO_TENSORS = frozenset({type(None), bool, int, float, str})


def _walk(v: Any, out: list) -> None:
    kind = type(v)
    if kind in PLAIN_TENSORS:
        out.append(v)
    elif kind in _NO_TENSORS:
        pass
    elif isinstance(v, torch.Tensor):  # subclasses
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _walk(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _walk(x, out)
