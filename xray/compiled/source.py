"""Python source for an FX node's call, over its inputs' names: the repros rebuild a node from
it once the compiled graph is gone (capture.py keeps it per kernel; crash.py writes it)."""
from __future__ import annotations

import operator
from typing import Any

import torch


def literal(value: Any, names: dict[str, str]) -> str:
    """Python source for one argument of the node: a node is its input's name."""
    if isinstance(value, torch.fx.Node):
        return names.get(value.name, value.name)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(literal(v, names) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return f"float({str(value)!r})"
    return repr(value)


def call_source(node: torch.fx.Node) -> str:
    """The node's call as Python source over its inputs' names (repros rebuild nodes from it once
    the graph is gone); "" when it is no ATen op or ``getitem``."""
    args = [literal(a, {}) for a in node.args] + [f"{k}={literal(v, {})}" for k, v in node.kwargs.items()]
    target = f"torch.ops.{node.target}" if isinstance(node.target, torch._ops.OpOverload) else \
        "operator.getitem" if node.target is operator.getitem else ""
    return f"{target}({', '.join(args)})" if target else ""
