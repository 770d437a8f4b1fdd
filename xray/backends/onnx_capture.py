"""Tie an exported ONNX graph's values back to the reference program's nodes, and mark them as outputs.

torch.onnx's dynamo exporter (onnxscript 0.7) first decomposes the program again with its own
table (``onnx_program.exported_program`` is that graph: its nodes are renamed, ``unsqueeze_17``
there may be ``unsqueeze_20`` here). It names the value each of *its* nodes produces after the
node, names parameters' initializers by their qualified names and graph inputs by their
placeholders, and stamps every ONNX node with the graph node it came from (metadata
``pkg.torch.onnx.fx_node``, ``"%permute_3 : [num_users=1] = call_function[...]"``).

So a value is tied to a reference node in two exact steps: the ONNX value -> the exporter's node
(same name, and the ONNX node producing it carries that node in ``fx_node``, or a folded
initializer of that name), then the exporter's node -> the reference node through
``node.meta["from_node"]``, the provenance torch.fx keeps through every decomposition, at the
entry whose ``graph_id`` is the reference graph's. When a reference node became several
exporter nodes, its value is the one whose result leaves the group (same shape and dtype).
The helper values an ONNX function expands into (``val_12``) belong to no node.
"""
from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.export.graph_signature import InputKind, TensorArgument

from ..dump.tensorio import from_numpy

FX_NODE = "pkg.torch.onnx.fx_node"


@dataclass
class Plan:
    """The marked model, the values to fetch, and which program node each value stands for."""

    marked: Any  # onnx.ModelProto with every mapped value as a graph output
    fetch: list[str]
    node_values: dict[str, list[str | None]]  # program node -> ONNX value names, in output order (None: none)
    unmapped: list[str] = field(default_factory=list)  # call_function nodes with no value of their own


def _elem_type(dtype: torch.dtype) -> int | None:
    from onnx import TensorProto

    return {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16, torch.bfloat16: TensorProto.BFLOAT16,
            torch.float64: TensorProto.DOUBLE, torch.int64: TensorProto.INT64, torch.int32: TensorProto.INT32,
            torch.int16: TensorProto.INT16, torch.int8: TensorProto.INT8, torch.uint8: TensorProto.UINT8,
            torch.bool: TensorProto.BOOL}.get(dtype)


def _node_outputs(node: torch.fx.Node) -> list[str | None] | None:
    """The names carrying a node's output tensors, in order: its own, or for a tuple result its
    getitem users' (None for an output nothing reads: the exporter gives it no value of its own).
    None when the node returns no tensor."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return [node.name]
    if isinstance(val, (tuple, list)):
        names: list[str | None] = [None] * len(val)
        for user in node.users:
            if user.target is operator.getitem and isinstance(user.args[1], int):
                names[user.args[1]] = user.name
        tensors = [n for n, v in zip(names, val) if isinstance(v, torch.Tensor)]
        return tensors or None
    return None


def _origin(node: torch.fx.Node, graph_id: int) -> str | None:
    """The reference node ``node`` was decomposed from: its ``from_node`` entry in graph ``graph_id``."""
    todo = list(node.meta.get("from_node") or [])
    while todo:
        src = todo.pop(0)
        if getattr(src, "graph_id", None) == graph_id:
            return src.name
        todo.extend(getattr(src, "from_node", None) or [])
    return None


def provenance(exported: torch.export.ExportedProgram, program: torch.export.ExportedProgram) -> dict[str, str]:
    """Reference node name -> the exporter's node carrying its value."""
    ref_vals = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "call_function"}
    groups: dict[str, list[torch.fx.Node]] = {}
    for n in exported.graph.nodes:
        if n.op != "call_function":
            continue
        origin = _origin(n, id(program.graph))
        if origin in ref_vals:
            groups.setdefault(origin, []).append(n)
    out = {}
    for origin, nodes in groups.items():
        members = set(nodes)
        want = ref_vals[origin]
        if isinstance(want, (tuple, list)):  # the tuple's producer; its getitems join the group
            fitting = [n for n in nodes if _same_kind(n.meta.get("val"), want)]
        else:
            leaving = [n for n in nodes if not n.users or any(u not in members for u in n.users)]
            fitting = [n for n in leaving if _same_kind(n.meta.get("val"), want)]
        if fitting:
            out[origin] = fitting[-1].name
    return out


def _same_kind(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_kind(x, y) for x, y in zip(a, b))
    return False


def plan(proto: Any, program: torch.export.ExportedProgram, exported: torch.export.ExportedProgram) -> Plan:
    """Which ONNX values stand for which program nodes, and a copy of ``proto`` that outputs them.
    ``exported`` is the exporter's own decomposed program (``onnx_program.exported_program``)."""
    from onnx import helper

    g = proto.graph
    producer: dict[str, Any] = {o: n for n in g.node for o in n.output}
    initializers = {i.name for i in g.initializer}
    info = {v.name: v for v in list(g.value_info) + list(g.output)}
    theirs = {n.name: n for n in exported.graph.nodes}
    vals = {n.name: n.meta.get("val") for n in exported.graph.nodes}
    carrier = provenance(exported, program)

    def owned(value: str, node: str) -> bool:
        if value in initializers:  # a constant the exporter folded, kept under the node's name
            return True
        onnx_node = producer.get(value)
        if onnx_node is None:
            return False
        stamp = next((p.value for p in onnx_node.metadata_props if p.key == FX_NODE), "")
        return stamp.startswith(f"%{node} ")

    node_values: dict[str, list[str | None]] = {}
    unmapped = []
    for node in program.graph.nodes:
        # getitem is no op call (no record): it only names one output of a tuple-returning node
        if node.op != "call_function" or node.target is operator.getitem or _node_outputs(node) is None:
            continue
        their = theirs.get(carrier.get(node.name, ""))
        names = _node_outputs(their) if their is not None else None
        if names is not None and isinstance(their.meta.get("val"), torch.Tensor):
            names = [their.name if owned(their.name, their.name) else None]
        elif names is not None:  # a getitem's value, made by the ONNX node of the tuple's producer
            names = [v if v is not None and (owned(v, their.name) or owned(v, v)) else None for v in names]
        if names is None or all(v is None for v in names):
            unmapped.append(node.name)
        else:
            node_values[node.name] = names
    marked = copy.deepcopy(proto)
    outputs = {o.name for o in g.output}
    fetch = []
    for names in node_values.values():
        for v in names:
            if v is None or v in initializers:
                continue
            fetch.append(v)
            if v in outputs:
                continue
            if v in info:
                marked.graph.output.append(copy.deepcopy(info[v]))
                continue
            val = vals.get(v)
            elem = _elem_type(val.dtype) if isinstance(val, torch.Tensor) else None
            if elem is None:
                fetch.pop()
                continue
            marked.graph.output.append(helper.make_tensor_value_info(v, elem, [int(s) for s in val.shape]))
    for o in g.output:
        if o.name not in fetch:
            fetch.append(o.name)
    return Plan(marked, fetch, node_values, unmapped)


def tensor_inputs(program: torch.export.ExportedProgram) -> list[str]:
    """Placeholder names of the program's tensor user inputs, in order: the ``args`` drift passes
    (flags such as ``use_cache=False`` are baked into the program)."""
    return [s.arg.name for s in program.graph_signature.input_specs
            if s.kind == InputKind.USER_INPUT and isinstance(s.arg, TensorArgument)]


def feed(session: Any, program: torch.export.ExportedProgram, args: tuple,
         extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """ONNX inputs by name: the graph's inputs are the program's tensor user inputs, same names
    (and, in a cut model, the ``extra`` reference values)."""
    names = tensor_inputs(program)
    by_name = dict(zip(names, args))
    out = dict(extra or {})
    for i in session.get_inputs():
        if i.name in out:
            continue
        if i.name not in by_name:
            from .base import BackendError, ReplayStatus

            raise BackendError(ReplayStatus.RUN_FAIL, f"ONNX input {i.name!r} is not a user input of the program "
                               f"({', '.join(names)})")
        out[i.name] = by_name[i.name].detach().contiguous().numpy()
    return out


def values(p: Plan, fetched: dict[str, Any], proto: Any, program: torch.export.ExportedProgram,
           args: tuple) -> dict[str, list[torch.Tensor | None]]:
    """Program node -> the tensors ONNX Runtime computed for it (None for an output it has no
    value for); placeholders get the initializers the ONNX graph holds (edited ones included)
    and the inputs it was fed."""
    from onnx import numpy_helper

    def tensor(a: Any) -> torch.Tensor:
        arr = np.array(a)  # a writable copy: ORT's buffers are read-only
        return from_numpy(arr, str(arr.dtype)).clone()

    inits = {i.name: i for i in proto.graph.initializer}
    out: dict[str, list[torch.Tensor]] = {}
    for node, names in p.node_values.items():
        got = [None if v is None else tensor(fetched[v]) if v in fetched else
               tensor(numpy_helper.to_array(inits[v])) if v in inits else None for v in names]
        if any(t is not None for t in got):
            out[node] = got
    for name, value in zip(tensor_inputs(program), args):
        out[name] = [value]
    for spec in program.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT and spec.target in inits:
            out[spec.arg.name] = [tensor(numpy_helper.to_array(inits[spec.target]))]
    return out


def cut(p: Plan, program: torch.export.ExportedProgram,
        reference: dict[str, list[torch.Tensor]]) -> tuple[Any, dict[str, np.ndarray]]:
    """The marked model with every captured edge cut: each consumer of a captured value reads a
    new graph input ``<value>__ref`` instead, fed the reference's value of that node. Each value
    is then computed by its own ONNX nodes from reference inputs (and the graph's own weights)."""
    model = copy.deepcopy(p.marked)
    g = model.graph
    initializers = {i.name for i in g.initializer}
    info = {v.name: v for v in list(g.value_info) + list(g.output)}
    feed: dict[str, np.ndarray] = {}
    for node, names in p.node_values.items():
        ref = reference.get(node) or []
        for k, v in enumerate(names):
            if v is None or v in initializers or k >= len(ref) or v not in info:
                continue
            t = ref[k].detach().contiguous()
            if t.dtype == torch.bfloat16:  # numpy has no bfloat16: leave that edge uncut
                continue
            feed[f"{v}__ref"] = t.numpy()
    for n in g.node:
        for i, name in enumerate(n.input):
            if f"{name}__ref" in feed:
                n.input[i] = f"{name}__ref"
    for name in feed:
        vi = copy.deepcopy(info[name[:-len("__ref")]])
        vi.name = name
        g.input.append(vi)
    return model, feed
