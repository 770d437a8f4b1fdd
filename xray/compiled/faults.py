"""Compiler faults to inject into inductor, for the tests and tools/bench_compile_faults.py.

Five kinds, all inside the compiler so that the eager reference stays right:
- ``ScaleNode``: a post-grad pass (``post_grad_custom_post_pass``) that multiplies one node's
  value by ``1 + eps``, in the forward graph or in AOT autograd's backward graph; the multiply is
  named ``xray_fault`` so a report can be checked against it;
- ``wrong_decompositions``: a decomposition table with one op decomposed wrongly;
- ``wrong_lowering``: inductor's lowering of one op replaced, while compiling, by one whose result
  is ``1 + eps`` times too large;
- ``failing_lowering``: inductor's lowering of one op replaced by one that raises (a compile crash);
- ``FailAtRun``: a post-grad pass that routes one node through an op that raises when run.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

FAULT_NODE = "xray_fault"
aten = torch.ops.aten


def candidates(graph: torch.fx.Graph, backward: bool = False) -> list[torch.fx.Node]:
    """Post-grad nodes a scale fault may hit: ATen ops with one floating-point tensor output that
    came from a model call (a Dynamo node) or, with ``backward``, from its backward formula, in
    graph order. A node that reads no tensor (a fill: ``select_backward``'s zeros) is a constant,
    not a computation: scaling a zero fill would change nothing."""
    from .capture import backward_node

    out = []
    for n in graph.nodes:
        val = n.meta.get("val")
        came = backward_node(n) and n.meta.get("seq_nr") is not None if backward else \
            bool(n.meta.get("from_node")) and not backward_node(n)
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and \
                isinstance(val, torch.Tensor) and val.is_floating_point() and val.numel() > 1 and \
                came and n.users and n.all_input_nodes and not torch.Tag.view_copy in n.target.tags and \
                n.target not in (aten.view.default, aten.reshape.default, aten.permute.default, aten.expand.default,
                                 aten.clone.default, aten.slice.Tensor, aten.select.int, aten.unsqueeze.default,
                                 aten.squeeze.dim, aten.t.default, aten.transpose.int, aten.alias.default):
            out.append(n)
    return out


class ScaleNode(CustomGraphPass):
    """Multiply the ``index``-th candidate node's value by ``1 + eps`` (``index`` modulo the count;
    with ``op``, among the candidates of that ATen op only), in the forward graphs or, with
    ``backward``, in the backward graphs only (the pass sees both)."""

    def __init__(self, index: int, eps: float, op: Any = None, backward: bool = False) -> None:
        self.index, self.eps, self.op, self.backward = index, eps, op, backward
        self.hit: str = ""  # the node scaled
        self.hit_op: str = ""

    def __call__(self, graph: torch.fx.Graph) -> None:
        # the backward graph is the one fed tangents: the partitioner may also place backward
        # nodes that need only forward values in the forward graph
        backward = any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes)
        if self.hit or backward != self.backward:
            return
        nodes = [n for n in candidates(graph, self.backward) if self.op is None or n.target == self.op]
        if not nodes:
            return
        node = nodes[self.index % len(nodes)]
        with graph.inserting_after(node):
            scaled = graph.call_function(aten.mul.Tensor, (node, 1.0 + self.eps))
        node.replace_all_uses_with(scaled, delete_user_cb=lambda u: u is not scaled)
        scaled.meta = dict(node.meta)
        scaled._rename(FAULT_NODE)
        self.hit, self.hit_op = node.name, str(node.meta.get("original_aten") or node.target)

    def uuid(self) -> Any:
        return None  # never cached


def _gelu_tanh(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def _silu_off(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x * 1.01)


def _rsqrt_off(x: torch.Tensor) -> torch.Tensor:
    return 1.001 / torch.sqrt(x)


def _tanh_pade(x: torch.Tensor) -> torch.Tensor:
    x = x.clamp(-3.0, 3.0)
    return x * (27 + x * x) / (27 + 9 * x * x)


def _relu_leaky(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, 0.01 * x)


WRONG: dict[str, tuple[Any, Callable]] = {
    "gelu": (aten.gelu.default, _gelu_tanh),  # the tanh approximation for the exact (erf) GELU
    "silu": (aten.silu.default, _silu_off),  # sigmoid of 1.01 x
    "rsqrt": (aten.rsqrt.default, _rsqrt_off),  # 0.1 % high
    "relu": (aten.relu.default, _relu_leaky),
    "tanh": (aten.tanh.default, _tanh_pade),  # a Pade approximant, 2 % off near |x| = 1  # a leaky ReLU's slope for the negative half
}


def wrong_decompositions(name: str) -> dict:
    """Inductor's decomposition table with ``name`` (a key of ``WRONG``) decomposed wrongly."""
    from torch._inductor.decomposition import select_decomp_table

    op, fn = WRONG[name]
    return {**select_decomp_table(), op: fn}


@contextlib.contextmanager
def wrong_lowering(op: Any, eps: float = 1e-3) -> Iterator[list[int]]:
    """While inside, inductor lowers ``op`` (an OpOverload) to its own lowering times ``1 + eps``;
    yields a one-item list counting the nodes lowered so (0: the op never reached lowering)."""
    from torch._inductor import lowering as L

    original = L.lowerings[op]
    applied = [0]

    def lower(*args: Any, **kwargs: Any) -> Any:
        applied[0] += 1
        return L.lowerings[aten.mul.Tensor](original(*args, **kwargs), 1.0 + eps)

    L.lowerings[op] = lower
    try:
        yield applied
    finally:
        L.lowerings[op] = original


@contextlib.contextmanager
def failing_lowering(op: Any) -> Iterator[None]:
    """While inside, inductor's lowering of ``op`` raises, as a lowering bug does: the compile
    crashes at that op's node where eager runs."""
    from torch._inductor import lowering as L

    original = L.lowerings.get(op)

    def lower(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"xray fault: no lowering for {op}")

    L.lowerings[op] = lower
    try:
        yield
    finally:
        if original is None:
            L.lowerings.pop(op, None)
        else:
            L.lowerings[op] = original


@torch.library.custom_op("xray_fault::fail_at_run", mutates_args=())
def _fail_at_run(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("xray fault: this kernel fails at run time")


@_fail_at_run.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class FailAtRun(CustomGraphPass):
    """A post-grad pass that passes the first candidate node's value through an op that compiles
    (inductor calls it as a fallback kernel) and raises when run: a run-side crash."""

    def __init__(self) -> None:
        self.hit: str = ""

    def __call__(self, graph: torch.fx.Graph) -> None:
        nodes = candidates(graph)
        if self.hit or not nodes:
            return
        node = nodes[0]
        with graph.inserting_after(node):
            failing = graph.call_function(torch.ops.xray_fault.fail_at_run.default, (node,))
        node.replace_all_uses_with(failing, delete_user_cb=lambda u: u is not failing)
        failing.meta = dict(node.meta)
        failing._rename(FAULT_NODE)
        self.hit = node.name

    def uuid(self) -> Any:
        return None
