"""Capture a compiled run at the grain it runs: each kernel launch's written buffers, and what
inductor knows about them (the post-grad FX node each buffer holds, the nodes each kernel fuses).

A context manager patches ``GraphLowering.compile_to_module`` for its duration: after inductor
generated a graph's module, the graph's buffer table and post-grad graph are read while they
exist (they are gone once compilation returns), and the module handed back is
``instrument``'s probing copy. Compilation must happen inside the context, so caches that would
skip code generation (FX graph cache, AOT autograd cache) are switched off there.
"""
from __future__ import annotations

import contextlib
import functools
import operator
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from ..dump.stats import tensor_stats
from .instrument import Instrumented, Launch, instrument
from .source import call_source


@dataclass
class NodeInfo:
    """What one post-grad FX node says about itself."""

    name: str
    target: str  # "aten.mul.Tensor", "getitem"
    original_aten: str  # the ATen op it was traced from ("aten.native_layer_norm.default")
    root: str  # the Dynamo graph node it came from (the end of ``from_node``), "" when none
    module: str  # innermost nn_module_stack path as Dynamo wrote it ("L['self'].layers[0]")
    users: list[str]
    args: list[str]  # the nodes it reads
    index: int | None  # for getitem: which output of ``args[0]``
    arguments: dict[int | str, str]  # node arguments: position or keyword -> the node passed
    shape: tuple | None
    dtype: str | None
    stack_trace: str = ""
    call: str = ""  # Python source of the call: ``torch.ops.aten.mul.Tensor(addmm, 1.0)`` (kernel_repro.py)


@dataclass
class CompiledGraph:
    """One inductor graph: its post-grad nodes, buffers and probed launches."""

    index: int
    dynamo: int | None  # the Dynamo graph it compiles (see check.Recorder), None when unknown
    nodes: dict[str, NodeInfo]
    buffer_node: dict[str, str]  # buffer name -> the FX node it holds exactly (inductor's origin_node)
    buffer_origins: dict[str, list[str]]  # buffer name -> every FX node computed into it
    launches: list[Launch] = field(default_factory=list)
    # launch index -> the post-grad nodes its kernel computes (inductor's provenance tracking)
    fused: dict[int, list[str]] = field(default_factory=dict)
    kernel_sources: dict[str, str] = field(default_factory=dict)
    path: str = ""  # the output-code file
    instrumented: bool = False
    backward: bool = False  # AOT autograd's backward graph of the Dynamo graph
    inputs: dict[str, tuple[tuple, str]] = field(default_factory=dict)  # placeholder -> (shape, dtype)


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__name__", str(target))


def _root(node: torch.fx.Node) -> str:
    src = (node.meta.get("from_node") or [None])[0]
    name = ""
    while src is not None:
        name = src.name
        src = src.from_node[0] if src.from_node else None
    return name


def backward_node(node: torch.fx.Node) -> bool:
    """A node of autograd's backward formulas (not a forward node the partitioner recomputes in the
    backward graph, which keeps its forward metadata)."""
    return "fwd_nn_module_stack" in node.meta or "fwd_source_fn_stack" in node.meta


def _fwd_source(node: torch.fx.Node) -> str:
    """The Dynamo node of a backward node's forward op as its ``fwd_source_fn_stack`` names it:
    for a forward op that inductor's joint-graph passes replaced before the forward graph is read
    (a ``mul`` folded into a softmax pattern keeps no ``seq_nr`` there)."""
    stack = node.meta.get("fwd_source_fn_stack") or []
    last = stack[-1] if stack else None
    return str(last[0]) if isinstance(last, (tuple, list)) and last and isinstance(last[0], str) else ""


def backward_group(root: str) -> str:
    """The group of records the backward of Dynamo node ``root`` made (reference.py names it alike)."""
    return f"{root}:backward"


def _node_info(node: torch.fx.Node, seq_roots: dict[int, str] | None = None) -> NodeInfo:
    val = node.meta.get("val")
    stack = node.meta.get("nn_module_stack") or {}
    module = list(stack.values())[-1][0] if stack else ""
    orig = node.meta.get("original_aten")
    index = node.args[1] if node.target is operator.getitem and len(node.args) > 1 else None
    arguments: dict[int | str, str] = {i: a.name for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node)}
    arguments.update({k: a.name for k, a in node.kwargs.items() if isinstance(a, torch.fx.Node)})
    root = _root(node)
    if backward_node(node):  # its forward op's Dynamo node, through the autograd sequence number
        fwd = (seq_roots or {}).get(node.meta.get("seq_nr")) or _fwd_source(node)
        root = backward_group(fwd) if fwd else ""
    return NodeInfo(node.name, _op_name(node.target), str(orig) if orig is not None else "", root,
                    str(module), [u.name for u in node.users],
                    [a.name for a in node.all_input_nodes], index if isinstance(index, int) else None, arguments,
                    tuple(val.shape) if isinstance(val, torch.Tensor) else None,
                    str(val.dtype) if isinstance(val, torch.Tensor) else None, node.meta.get("stack_trace") or "",
                    call_source(node))


@dataclass
class Described:
    """A probed buffer kept as its description only (statistics-only checks): what the dump and
    the pairing read of a tensor, without holding its memory."""

    shape: tuple
    dtype: torch.dtype
    stats: Any


class Capture:
    """Collects compiled graphs while active, and the buffers each launch writes when recording.
    ``keep_tensors=False`` reduces each buffer to its statistics at the probe (memory stays flat)."""

    def __init__(self, keep_tensors: bool = True) -> None:
        self.keep_tensors = keep_tensors
        self.graphs: list[CompiledGraph] = []
        self.dynamo: int | None = None  # set by the caller around each Dynamo graph's compilation
        self.backward = False  # the graph being compiled is AOT autograd's backward graph
        # Dynamo graph -> autograd sequence number -> the Dynamo node whose forward op took it
        self.seq_roots: dict[int, dict[int, str]] = {}
        self.recording = False
        self.calls: dict[int, int] = {}  # graph -> runs seen while recording
        # (graph, run, launch) -> the written buffers, copied to the CPU
        self.values: dict[tuple[int, int, int], tuple[torch.Tensor, ...]] = {}
        self.probe_seconds = 0.0
        self.compile_failed = False  # an error left a graph's compilation (not its run)
        self.failed_node: torch.fx.Node | None = None  # the post-grad node whose lowering raised

    def probe(self, graph: int, launch: int, buffers: tuple) -> None:
        if not self.recording:
            return
        if launch == 0:  # the first probed launch opens a run of the graph
            self.calls[graph] = self.calls.get(graph, 0) + 1
        run = max(self.calls.get(graph, 1) - 1, 0)
        t0 = time.perf_counter()
        # no grad mode needed: a kernel's buffers never require grad, and detach() makes sure
        if self.keep_tensors:
            kept = tuple(b.detach().to("cpu", copy=True) if isinstance(b, torch.Tensor) else None for b in buffers)
        else:
            kept = tuple(Described(tuple(b.shape), b.dtype, tensor_stats(b.detach()))
                         if isinstance(b, torch.Tensor) else None for b in buffers)
        self.values[(graph, run, launch)] = kept
        self.probe_seconds += time.perf_counter() - t0

    def inner_compile(self, dynamo: int | None) -> Callable[..., Any]:
        """inductor's ``compile_fx_inner`` for the graphs of Dynamo graph ``dynamo``. AOT autograd
        compiles the backward graph lazily, at the first backward, long after the Dynamo backend
        returned: this tells the capture which Dynamo graph it belongs to. The forward graph is
        read before inductor's passes: each op's autograd sequence number and Dynamo node, which
        the backward nodes carry (``seq_nr``) in place of a Dynamo node of their own."""
        from torch._inductor.compile_fx import compile_fx_inner

        def compile_inner(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
            backward = bool(kwargs.get("is_backward"))
            if not backward and dynamo is not None:
                roots = self.seq_roots.setdefault(dynamo, {})
                for n in gm.graph.nodes:
                    seq, root = n.meta.get("seq_nr"), _root(n)
                    if seq is not None and root and n.op == "call_function":
                        roots.setdefault(seq, root)
            saved = self.dynamo, self.backward
            self.dynamo, self.backward = dynamo, backward
            try:
                return compile_fx_inner(gm, example_inputs, **kwargs)
            except Exception:
                self.compile_failed = True
                raise
            finally:
                self.dynamo, self.backward = saved

        return compile_inner

    def _graph_done(self, lowering: Any, module: Any, provenance: dict[str, list[str]]) -> Any:
        index = len(self.graphs)
        roots = self.seq_roots.get(self.dynamo, {}) if self.dynamo is not None else {}
        nodes = {n.name: _node_info(n, roots) for n in lowering.graph.nodes if n.op == "call_function"}
        buffer_node, origins = {}, {}
        for name, buf in lowering.name_to_buffer.items():
            origin = getattr(buf, "origin_node", None)
            if origin is not None:
                buffer_node[name] = origin.name
            origins[name] = sorted(o.name for o in getattr(buf, "origins", ()) if o.op == "call_function")
        graph = CompiledGraph(index, self.dynamo, nodes, buffer_node, origins, path=getattr(module, "__file__", "") or "",
                              backward=self.backward)
        graph.inputs = {n.name: (tuple(n.meta["val"].shape), str(n.meta["val"].dtype)) for n in lowering.graph.nodes
                        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)}
        self.graphs.append(graph)
        done: Instrumented | None = instrument(module, functools.partial(self.probe, index))
        if done is None:
            return module
        graph.launches, graph.kernel_sources, graph.instrumented = done.launches, done.kernel_sources, True
        graph.fused = _fused_nodes(done.launches, provenance, nodes)
        _arguments_of_fallbacks(graph)
        return done.module


def _fused_nodes(launches: list[Launch], provenance: dict[str, list[str]],
                 nodes: dict[str, NodeInfo]) -> dict[int, list[str]]:
    """Launch index -> the post-grad nodes its kernel computes. Inductor keys its provenance by
    ``<kernel>:<handle>``, one entry per kernel code-generated, in generation order; a kernel
    shared by several sites (deduplicated code) has one entry per site, in call order. A
    fallback's entry (``torch.ops.aten.X``) also lists the nodes inlined into its inputs, which
    other kernels compute: it keeps only its own op's nodes (and their ``getitem``s)."""
    per_kernel: dict[str, list[list[str]]] = {}
    for key, names in sorted(provenance.items(), key=lambda kv: int(kv[0].rpartition(":")[2] or 0)):
        per_kernel.setdefault(key.rpartition(":")[0], []).append(list(names))
    out, seen = {}, {}
    for launch in launches:
        if launch.owner is not None:  # one output of a multi-output fallback: the fallback's nodes
            if launch.owner in out:
                out[launch.index] = out[launch.owner]
            continue
        k = seen.get(launch.kernel, 0)
        entries = per_kernel.get(launch.kernel, [])
        if k < len(entries):
            names = entries[k]
            if launch.kernel.startswith("torch.ops."):
                op = launch.kernel.removeprefix("torch.ops.")
                own = {n for n in names if n in nodes and nodes[n].target == op}
                names = [n for n in names if n in own or (n in nodes and nodes[n].target == "getitem"
                                                          and nodes[n].args[:1] and nodes[n].args[0] in own)]
            out[launch.index] = names
            seen[launch.kernel] = k + 1
    return out


def _arguments_of_fallbacks(graph: CompiledGraph) -> None:
    """A buffer inductor made only to pass a value to a fallback kernel (a copy in the stride
    order the kernel needs: the rotary-embedded query handed to attention) has no ``origin_node``;
    the fallback's FX node says which node's value that argument is."""
    for launch in graph.launches:
        if not launch.kernel.startswith("torch.ops.") or launch.owner is not None:
            continue
        own = [n for n in graph.fused.get(launch.index, []) if graph.nodes[n].target != "getitem"]
        if len(own) != 1:
            continue
        node = graph.nodes[own[0]]
        for key, buf in launch.arguments.items():
            value = node.arguments.get(key)
            if buf not in graph.buffer_node and value in graph.nodes:
                graph.buffer_node[buf] = value


@contextlib.contextmanager
def capturing(capture: Capture) -> Iterator[Capture]:
    """Compile inside: every inductor graph compiled here is read and instrumented by ``capture``."""
    from torch._inductor import config as inductor_config
    from torch._inductor.graph import GraphLowering

    original, original_run_node = GraphLowering.compile_to_module, GraphLowering.run_node

    def compile_to_module(self: Any) -> Any:
        # inductor's kernel -> post-grad nodes map (trace.provenance_tracking_level) is a module
        # global: emptied here so that what it holds after code generation is this graph's
        provenance = torch._inductor.debug._inductor_triton_kernel_to_post_grad_node_info
        provenance.clear()
        module = original(self)
        return capture._graph_done(self, module, dict(provenance))

    def run_node(self: Any, n: torch.fx.Node) -> Any:
        try:
            return original_run_node(self, n)
        except Exception:
            if capture.failed_node is None:  # the innermost node: a lowering may lower others
                capture.failed_node = n
            raise

    GraphLowering.compile_to_module, GraphLowering.run_node = compile_to_module, run_node
    try:
        # the C++ kernel cache stays on: a cached kernel is still generated code, only not rebuilt
        with inductor_config.patch({"fx_graph_cache": False, "fx_graph_remote_cache": False,
                                    "trace.provenance_tracking_level": 1}), \
                torch._functorch.config.patch(enable_autograd_cache=False, enable_remote_autograd_cache=False):
            yield capture
    finally:
        GraphLowering.compile_to_module, GraphLowering.run_node = original, original_run_node
