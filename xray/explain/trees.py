"""Model outputs as pytrees: the final output, errors between two runs' values, and a bench
value grafted into the shape and dtypes of the target's."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..numerics.metrics import normwise_error


def float_leaves(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]


def final_output(out: Any) -> torch.Tensor:
    """The model's first floating tensor (logits of a transformers ModelOutput), detached on CPU."""
    leaves = float_leaves(out)
    if not leaves:
        raise ValueError(f"the model returned no floating-point tensor ({type(out).__name__})")
    return leaves[0].detach().to("cpu")


def error(target: Any, bench: Any) -> float:
    """The worst normwise error (numerics.metrics.normwise_error) over matching floating leaves;
    None-like 0.0 when there is nothing to compare."""
    lt, lb = float_leaves(target), float_leaves(bench)
    worst = 0.0
    for t, b in zip(lt, lb):
        if t.shape == b.shape:
            worst = max(worst, normwise_error(t.detach().cpu(), b.detach().cpu()))
    return worst


def snapshot(tree: Any) -> Any:
    """A detached copy of every tensor (later in-place ops must not change what was seen)."""
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([t.detach().clone() if isinstance(t, torch.Tensor) else t for t in leaves], spec)


def graft(bench: Any, target: Any) -> Any:
    """``target`` with each floating tensor replaced by the bench's, cast to the target leaf's
    dtype and device (fresh copies: the run may write to them). Non-tensor leaves (a KV cache
    object) stay the target's. Returns ``target`` unchanged when the structures differ."""
    lb, _ = tree_flatten(bench)
    lt, spec = tree_flatten(target)
    if len(lb) != len(lt):
        return target
    out = []
    for b, t in zip(lb, lt):
        if (isinstance(b, torch.Tensor) and isinstance(t, torch.Tensor) and t.is_floating_point()
                and b.shape == t.shape):
            out.append(b.to(device=t.device, dtype=t.dtype, copy=True))
        else:
            out.append(t)
    return tree_unflatten(out, spec)
