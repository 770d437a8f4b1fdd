"""Whole-model ExecuTorch runs with ETDump: every logged intermediate output, named by the
reference program's nodes.

The runtime logs one debug event per executed instruction (a portable kernel call, or one
delegate call), keyed by the instruction's index. The emitter writes that index into
``node.meta["debug_handle"]`` of the node it emitted, so instruction -> node of the final
ExecuTorch graph is exact; from there ``node.meta["from_node"]`` provenance leads back through
``to_edge``'s retraces to the reference program's nodes. A delegate call only logs its
outputs: its i-th output is the i-th output of the lowered subgraph, whose node carries the
same provenance.
"""
from __future__ import annotations

import operator
import os
import tempfile
import time
import warnings
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .base import BackendError, ModelCapture, ReplayStatus, flatten_tensors, short_error
from .executorch import _count_nodes

# Reference ops that ExecuTorch's memory planning turns into views of their input's memory.
_VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "alias", "squeeze", "unsqueeze"})

# Headroom over the bytes of every planned tensor: ETDump also stores program outputs, and
# the runtime aligns each entry.
_DEBUG_BUFFER_SLACK = 1 << 20


@dataclass
class _Logged:
    """One executed instruction that logged tensors: its graph node and the reference nodes it computed."""

    instruction: int
    node: torch.fx.Node
    tensors: list[torch.Tensor]
    # Per logged output: the reference node names it is the value of.
    sources: list[list[str]] = field(default_factory=list)


def run_whole_model(program: torch.export.ExportedProgram, args: tuple, partitioners: list, preset: str, *,
                    edit: Callable[[Any], Any] | None = None) -> ModelCapture:
    """Lower ``program`` (edge, partitioners, ``edit``, to_executorch), run it once with ETDump and
    a debug buffer, and map the logged outputs back to ``program``'s node names."""
    from executorch.exir import to_edge_transform_and_lower

    facts: dict[str, Any] = {"partitioner": preset}
    start = time.perf_counter()
    try:
        edge = to_edge_transform_and_lower(program, partitioner=partitioners)
    except Exception as e:  # noqa: BLE001 - the lowering error is the result
        raise BackendError(ReplayStatus.LOWER_FAIL, f"to_edge_transform_and_lower ({preset}): {short_error(e)}") from e
    facts["edge_s"] = round(time.perf_counter() - start, 4)
    if edit is not None:
        # The edge programs may share their state_dict with the reference program: an edit that
        # swaps a weight must change the deployed program only.
        for name in edge.methods:
            ep = edge.exported_program(name)
            ep._state_dict = dict(ep.state_dict)  # noqa: SLF001 - no public setter
        edge = edit(edge) or edge

    start = time.perf_counter()
    try:
        et_program = edge.to_executorch()
        pte = bytes(et_program.buffer)
    except Exception as e:  # noqa: BLE001
        raise BackendError(ReplayStatus.LOWER_FAIL, f"to_executorch ({preset}): {short_error(e)}") from e
    facts["to_executorch_s"] = round(time.perf_counter() - start, 4)
    final = et_program.exported_program().graph_module
    delegated, undelegated = _count_nodes(final)
    facts.update(delegated_nodes=delegated, undelegated_nodes=undelegated, pte_bytes=len(pte))

    start = time.perf_counter()
    outputs, etdump, debug_buffer = _run_with_etdump(pte, args, _debug_buffer_size(final))
    facts["run_s"] = round(time.perf_counter() - start, 4)

    start = time.perf_counter()
    events = _logged_outputs(etdump, debug_buffer)
    logged = _match_instructions(final, events)
    ref_graph = program.graph
    for entry in logged:
        entry.sources = _output_sources(final, entry.node, id(ref_graph), {n.name for n in ref_graph.nodes})
    values = _assign(ref_graph, logged)
    facts["map_s"] = round(time.perf_counter() - start, 4)

    notes = _coverage_notes(final, ref_graph, logged, values, facts, preset)
    facts["logged_instructions"] = len(events)
    return ModelCapture(outputs=outputs, values=values,
                        granularity="delegate boundaries" if facts["delegated_nodes"] else "every node",
                        notes=notes, facts=facts)


def _coverage_notes(final: torch.fx.GraphModule, ref_graph: torch.fx.Graph, logged: list[_Logged],
                    values: dict[str, list[torch.Tensor]], facts: dict[str, Any], preset: str) -> list[str]:
    """What share of the reference nodes was captured, and why the rest was not; counts go to ``facts``."""
    # Nodes without a tensor output (_assert_tensor_metadata) have nothing to capture.
    ref_calls = [n for n in ref_graph.nodes if n.op == "call_function" and _tensor_outputs(n)]
    captured = [n.name for n in ref_calls if n.name in values]
    inside, boundary = _delegate_coverage(final, id(ref_graph), {n.name for n in ref_graph.nodes}, logged)
    boundary &= inside & set(values)
    facts.update(reference_nodes=len(ref_calls), captured_nodes=len(captured),
                 capture_share=round(len(captured) / max(len(ref_calls), 1), 4),
                 nodes_inside_delegates=len(inside), delegate_boundary_nodes=len(boundary))
    notes = [f"{len(captured)} of {len(ref_calls)} reference nodes with tensor outputs captured "
             f"({100.0 * len(captured) / max(len(ref_calls), 1):.0f}%)"]
    if facts["delegated_nodes"]:
        notes.append(f"{len(inside)} reference nodes ran inside {facts['delegated_nodes']} {preset} delegate "
                     f"call(s) and are visible only at the delegate boundaries: {len(boundary)} of them produce a "
                     f"delegate output and are captured, the other {len(inside - boundary)} are not (a delegate "
                     f"call logs its inputs and outputs, nothing inside)")
    missing = [n for n in ref_calls if n.name not in values and n.name not in inside]
    views = [n for n in missing if _op_name(n) in _VIEW_OPS]
    if views:
        notes.append(f"{len(views)} views not captured: ExecuTorch plans them as memory views (memory.view), "
                     f"which run no instruction and log nothing")
    others = [n for n in missing if _op_name(n) not in _VIEW_OPS]
    if others:
        kinds = Counter(_op_name(n) for n in others).most_common(6)
        notes.append(f"{len(others)} other reference nodes not captured (removed or folded by lowering, or "
                     f"their value differs in shape or dtype): " + ", ".join(f"{k} x{c}" for k, c in kinds))
    return notes


def _debug_buffer_size(gm: torch.fx.GraphModule) -> int:
    """Bytes of every tensor the graph produces: each is logged once into the debug buffer."""
    total = 0
    for node in gm.graph.nodes:
        for t in flatten_tensors(node.meta.get("val")):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size() + 64
    return total + _DEBUG_BUFFER_SLACK


def _run_with_etdump(pte: bytes, args: tuple, buffer_size: int) -> tuple[list[torch.Tensor], bytes, bytes]:
    from executorch.runtime import Runtime

    try:
        loaded = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=buffer_size)
        method = loaded.load_method("forward")
        if method is None:
            raise RuntimeError("no method 'forward'")
    except Exception as e:  # noqa: BLE001
        raise BackendError(ReplayStatus.RUN_FAIL, f"ExecuTorch could not load the program: {short_error(e)}") from e
    try:
        raw = method.execute([a.contiguous() if isinstance(a, torch.Tensor) else a for a in args])
    except Exception as e:  # noqa: BLE001
        raise BackendError(ReplayStatus.RUN_FAIL, f"ExecuTorch execution failed: {short_error(e)}") from e
    outputs = [o.clone() for o in raw if isinstance(o, torch.Tensor)]
    with tempfile.TemporaryDirectory(prefix="xray-etdump-") as tmp:
        etdump_path, buffer_path = os.path.join(tmp, "run.etdp"), os.path.join(tmp, "debug.bin")
        try:
            loaded.write_etdump_result_to_file(etdump_path, buffer_path)
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.RUN_FAIL, f"ExecuTorch wrote no ETDump (is this build's event tracer "
                                                      f"enabled?): {short_error(e)}") from e
        with open(etdump_path, "rb") as f:
            etdump = f.read()
        with open(buffer_path, "rb") as f:
            debug_buffer = f.read()
    return outputs, etdump, debug_buffer


def _logged_outputs(etdump: bytes, debug_buffer: bytes) -> dict[int, tuple[str, list[torch.Tensor]]]:
    """Instruction index -> (event name, logged tensors) of the one execution in ``etdump``."""
    from executorch.devtools import Inspector

    with tempfile.TemporaryDirectory(prefix="xray-etdump-") as tmp:
        buffer_path = os.path.join(tmp, "debug.bin")
        with open(buffer_path, "wb") as f:
            f.write(debug_buffer)
        with warnings.catch_warnings():
            # torch.frombuffer over the read-only debug buffer warns once per tensor; we clone them.
            warnings.simplefilter("ignore", UserWarning)
            inspector = Inspector(etdump_data=etdump, debug_buffer_path=buffer_path)
    logged: dict[int, tuple[str, list[torch.Tensor]]] = {}
    for block in inspector.event_blocks:
        if block.name != "Execute":
            continue
        for event in block.events:
            instruction = event._instruction_id  # noqa: SLF001 - the key the runtime logged, not exposed otherwise
            if instruction is None or event.is_delegated_op or not event.debug_data or instruction in logged:
                continue
            tensors = [t.clone() for t in event.debug_data if isinstance(t, torch.Tensor)]
            if tensors:
                logged[instruction] = (event.name, tensors)
    return logged


def _match_instructions(final: torch.fx.GraphModule, events: dict[int, tuple[str, list[torch.Tensor]]]) -> list[_Logged]:
    """Pair each logged instruction with the node the emitter emitted for it.

    Nodes it did not emit (getitem, views) keep their edge-time debug handle, which can equal
    an instruction index: the operator named by the event must be the node's."""
    out = []
    for node in final.graph.nodes:
        if node.op != "call_function":
            continue
        handle = node.meta.get("debug_handle")
        if not isinstance(handle, int) or handle not in events:
            continue
        name, tensors = events[handle]
        if name != _event_name(node):
            continue
        if _is_delegate(node):
            # A delegate call logs every runtime argument: its inputs, then its outputs.
            tensors = tensors[len(tensors) - _delegate_output_count(final, node):]
        out.append(_Logged(handle, node, tensors))
    return out


def _event_name(node: torch.fx.Node) -> str | None:
    """The name ExecuTorch's runtime gives the event of this node's instruction (None: not a kernel)."""
    if _is_delegate(node):
        return "DELEGATE_CALL"
    schema = getattr(node.target, "_schema", None)
    if schema is None:  # memory.alloc, memory.view (a view is planned memory, not an instruction), getitem
        return None
    return f"native_call_{schema.name.split('::')[-1]}.{schema.overload_name or 'default'}"


def _is_delegate(node: torch.fx.Node) -> bool:
    return "executorch_call_delegate" in getattr(node.target, "__name__", str(node.target))


def _op_name(node: torch.fx.Node) -> str:
    """``add`` for aten.add.out / aten::add.Tensor / edge ops: the part event names spell too."""
    schema = getattr(node.target, "_schema", None)
    name = schema.name if schema is not None else getattr(node.target, "__name__", str(node.target))
    return name.split("::")[-1].split(".")[0]


def _delegate_outputs(final: torch.fx.GraphModule, node: torch.fx.Node) -> list[Any]:
    """The output nodes of the subgraph a delegate call runs, in output order."""
    lowered = getattr(final, node.args[0].target)
    outs = lowered.original_module.graph.output_node().args[0]
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _delegate_output_count(final: torch.fx.GraphModule, node: torch.fx.Node) -> int:
    return len(_delegate_outputs(final, node))


def _output_sources(final: torch.fx.GraphModule, node: torch.fx.Node, ref_graph_id: int,
                    ref_names: set[str]) -> list[list[str]]:
    """Reference node names behind each tensor output of ``node`` (delegates: each subgraph output)."""
    if not _is_delegate(node):
        return [_provenance(node, ref_graph_id, ref_names)]
    return [_provenance(o, ref_graph_id, ref_names) if isinstance(o, torch.fx.Node) else [] for o in _delegate_outputs(final, node)]


def _provenance(node: torch.fx.Node, ref_graph_id: int, ref_names: set[str]) -> list[str]:
    """Reference node names ``node`` was derived from, through ``from_node`` (all branches).

    A path stops at its first node of the reference graph: ids of freed graphs get reused, so a
    deeper entry with the reference graph's id may be an older, unrelated graph."""
    found: list[str] = []
    queue = deque(node.meta.get("from_node") or [])
    seen = 0
    while queue and seen < 10_000:
        source = queue.popleft()
        seen += 1
        if source.graph_id == ref_graph_id and source.name in ref_names:
            if source.name not in found:
                found.append(source.name)
            continue
        queue.extend(source.from_node or [])
    return found


def _assign(ref_graph: torch.fx.Graph, logged: list[_Logged]) -> dict[str, list[torch.Tensor]]:
    """Reference node name -> its output tensors, as ExecuTorch computed them.

    Several instructions can descend from one reference node (a decomposition); the last one
    whose tensors have the node's shapes and dtypes holds its value. A getitem of a captured
    multi-output node takes that output."""
    ref_nodes = {n.name: n for n in ref_graph.nodes}
    candidates: dict[str, list[torch.Tensor]] = {}
    for entry in logged:  # in execution order
        if len(entry.sources) == 1 and len(entry.tensors) != 1:
            # one node, several outputs (native_layer_norm, max.dim)
            groups = [(entry.sources[0], list(entry.tensors))]
        else:
            groups = [(names, [t]) for names, t in zip(entry.sources, entry.tensors)]
        for names, tensors in groups:
            for name in names:
                if _fits(ref_nodes[name], tensors):
                    candidates[name] = tensors
    for node in ref_graph.nodes:
        if node.op == "call_function" and node.name not in candidates and node.target is operator.getitem:
            parent, index = node.args
            got = candidates.get(getattr(parent, "name", None))
            if got is not None and isinstance(index, int) and index < len(got) and _fits(node, [got[index]]):
                candidates[node.name] = [got[index]]
    return {n.name: candidates[n.name] for n in ref_graph.nodes if n.name in candidates}


def _tensor_outputs(node: torch.fx.Node) -> list[torch.Tensor]:
    return [t for t in flatten_tensors(node.meta.get("val")) if isinstance(t, torch.Tensor)]


def _fits(ref_node: torch.fx.Node, tensors: list[torch.Tensor]) -> bool:
    """The tensors have the reference node's output count, shapes and dtypes."""
    expected = _tensor_outputs(ref_node)
    if len(expected) != len(tensors):
        return False
    return all(tuple(e.shape) == tuple(t.shape) and e.dtype == t.dtype for e, t in zip(expected, tensors))


def _delegate_coverage(final: torch.fx.GraphModule, ref_graph_id: int, ref_names: set[str],
                       logged: list[_Logged]) -> tuple[set[str], set[str]]:
    """(reference nodes computed inside delegates, reference nodes a delegate call logged)."""
    inside: set[str] = set()
    for node in final.graph.nodes:
        if node.op == "call_function" and _is_delegate(node):
            lowered = getattr(final, node.args[0].target)
            for inner in lowered.original_module.graph.nodes:
                if inner.op == "call_function":
                    inside.update(_provenance(inner, ref_graph_id, ref_names))
    boundary = {name for entry in logged if _is_delegate(entry.node) for names in entry.sources for name in names}
    return inside, boundary
