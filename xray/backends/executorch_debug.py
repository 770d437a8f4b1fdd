"""Whole-model ExecuTorch runs with ETDump: every logged intermediate output, named by the
reference program's nodes.

The runtime logs one debug event per executed instruction (a portable kernel call, or one
delegate call), keyed by the instruction's index. The emitter writes that index into
``node.meta["debug_handle"]`` of the node it emitted, so instruction -> node of the final
ExecuTorch graph is exact; from there ``node.meta["from_node"]`` provenance leads back through
``to_edge``'s retraces to the reference program's nodes. A delegate call logs its arguments
only (inputs, then outputs), nothing computed inside: its i-th output is the i-th output of the
lowered subgraph, whose node carries the same provenance.

Only the instruction index is taken from the ETDump: Inspector's own debug handles (through an
ETRecord) name the source node an instruction came from, shared by every node a decomposition
made of it, so they cannot tell a matmul's expand, view and bmm apart.
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
                    edit: Callable[[Any], Any] | None = None, quant: str | None = None,
                    source: tuple | None = None, keep_float: tuple[str, ...] = ()) -> ModelCapture:
    """Lower ``program`` (edge, partitioners, ``edit``, to_executorch), run it once with ETDump and
    a debug buffer, and map the logged outputs back to ``program``'s node names.

    ``quant`` (a PT2E scheme): ``source`` = (the program before core-ATen decompositions, the model's args,
    kwargs) is quantized with PT2E (``quantize.pt2e_quantize``, run on those, ``keep_float`` modules
    left float), ``edit`` gets the converted module, and
    the quantized program is lowered instead; its values map back through the source's node names."""
    from executorch.exir import to_edge_transform_and_lower

    facts: dict[str, Any] = {"partitioner": preset}
    via: tuple[int, dict[str, list[str]]] | None = None
    lowered = program
    if quant is not None:
        from .quantize import pt2e_quantize, source_to_reference

        if source is None:
            raise BackendError(ReplayStatus.EXPORT_FAIL, "quant needs the program before decompositions (source)")
        try:
            import executorch.kernels.quantized  # noqa: F401 - registers the quantized ops' out variants
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.LOWER_FAIL, f"ExecuTorch quantized kernels: {short_error(e)}") from e
        source_program, call_args, call_kwargs = source
        converted, carries = pt2e_quantize(source_program, call_args, call_kwargs, facts, quant, keep_float)
        if edit is not None:
            converted = edit(converted) or converted
            edit = None
        try:
            lowered = torch.export.export(converted, tuple(call_args), dict(call_kwargs), strict=False)
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"torch.export of the quantized program: "
                               f"{short_error(e)}") from e
        to_ref = source_to_reference(program)
        via = (id(converted.graph), {name: to_ref.get(src, []) for name, src in carries.items()})
    start = time.perf_counter()
    try:
        edge = to_edge_transform_and_lower(lowered, partitioner=partitioners)
    except Exception as e:  # noqa: BLE001 - the lowering error is the result
        raise BackendError(ReplayStatus.LOWER_FAIL, f"to_edge_transform_and_lower ({preset}): {short_error(e)}") from e
    facts["edge_s"] = round(time.perf_counter() - start, 4)
    if edit is not None:
        _own_weights(edge)
        replaced = edit(edge)
        edge = edge if replaced is None else replaced

    start = time.perf_counter()
    try:
        et_program = edge.to_executorch()
        pte = bytes(et_program.buffer)
    except Exception as e:  # noqa: BLE001
        raise BackendError(ReplayStatus.LOWER_FAIL, f"to_executorch ({preset}): {short_error(e)}") from e
    facts["to_executorch_s"] = round(time.perf_counter() - start, 4)
    final = et_program.exported_program().graph_module
    delegated, undelegated = count_nodes(final)
    facts.update(delegated_nodes=delegated, undelegated_nodes=undelegated, pte_bytes=len(pte))

    start = time.perf_counter()
    facts["debug_buffer_bytes"] = _debug_buffer_size(final)
    outputs, events = _run_with_etdump(pte, args, facts["debug_buffer_bytes"])
    facts["run_etdump_s"] = round(time.perf_counter() - start, 4)

    start = time.perf_counter()
    logged = _match_instructions(final, events)
    ref_graph = program.graph
    ref_names = {n.name for n in ref_graph.nodes}
    for entry in logged:
        entry.sources = _output_sources(final, entry.node, id(ref_graph), ref_names, via)
    if via is not None:
        _narrow_groups(final, ref_graph, logged, via)
    values = _assign(ref_graph, logged, outputs)
    if via is None:
        values.update(_deployed_state(program, edge))
    facts["map_s"] = round(time.perf_counter() - start, 4)

    notes = _coverage_notes(final, ref_graph, logged, values, facts, preset, via)
    facts["logged_instructions"] = len(events)
    return ModelCapture(outputs=outputs, values=values,
                        granularity="delegate boundaries" if facts["delegated_nodes"] else "every node",
                        notes=notes, facts=facts)


def _coverage_notes(final: torch.fx.GraphModule, ref_graph: torch.fx.Graph, logged: list[_Logged],
                    values: dict[str, list[torch.Tensor]], facts: dict[str, Any], preset: str,
                    via: tuple[int, dict[str, list[str]]] | None = None) -> list[str]:
    """What share of the reference nodes was captured, and why the rest was not; counts go to ``facts``."""
    # Nodes without a tensor output (_assert_tensor_metadata) have nothing to capture.
    ref_calls = [n for n in ref_graph.nodes if n.op == "call_function" and _tensor_outputs(n)]
    captured = [n.name for n in ref_calls if n.name in values]
    inside, boundary = _delegate_coverage(final, id(ref_graph), {n.name for n in ref_graph.nodes}, logged, via)
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


def _deployed_state(program: torch.export.ExportedProgram, edge: Any) -> dict[str, list[torch.Tensor]]:
    """Reference placeholder -> the parameter, buffer or constant the edge program serialised
    (after ``edit``), matched by qualified name, as ONNX Runtime's capture gives its initializers.

    Without them compare cannot recompute a weight's consumer (local error "not measurable") nor
    say a drift is born of a wrong ``parameter``. Weights an XNNPACK delegate took into its blob
    are no longer in the edge program and stay absent."""
    from torch.export.graph_signature import InputKind

    ep = edge.exported_program()
    tables = {**ep.state_dict, **ep.constants}
    out: dict[str, list[torch.Tensor]] = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT and spec.target in tables:
            value = tables[spec.target]
            if isinstance(value, torch.Tensor):
                out[spec.arg.name] = [value.detach().clone()]
    return out


def _own_weights(edge: Any) -> None:
    """Give the edge programs their own copies of weights and constants before ``edit`` runs.

    to_edge keeps the reference program's tensors (the model's parameters themselves): a fault
    injected in place would otherwise change the reference too. One copy of the weights, paid
    only by edited runs."""
    for method in edge.methods:
        ep = edge.exported_program(method)
        for table in (ep.state_dict, ep.constants):
            for key, value in list(table.items()):
                if isinstance(value, torch.nn.Parameter):
                    table[key] = torch.nn.Parameter(value.detach().clone(), requires_grad=value.requires_grad)
                elif isinstance(value, torch.Tensor):
                    table[key] = value.clone()


def _debug_buffer_size(gm: torch.fx.GraphModule) -> int:
    """Bytes the debug buffer needs: every kernel's outputs, every delegate call's arguments
    (inputs and outputs), the program's outputs, each entry aligned; doubled, because the
    runtime aborts the process (not the run) when the buffer runs out."""
    total = 0
    for node in gm.graph.nodes:
        logged = [node.meta.get("val")] if node.op == "call_function" else []
        if node.op == "output" or (node.op == "call_function" and _is_delegate(node)):
            logged += [a.meta.get("val") for a in node.all_input_nodes]
        for t in flatten_tensors(logged):
            if isinstance(t, torch.Tensor):
                total += int(t.numel()) * t.element_size() + 64
    return 2 * total + _DEBUG_BUFFER_SLACK


def _run_with_etdump(pte: bytes, args: tuple,
                     buffer_size: int) -> tuple[list[torch.Tensor], dict[int, tuple[str, list[torch.Tensor]]]]:
    """Run ``forward`` once with ETDump on: (program outputs, instruction -> (event name, logged tensors))."""
    from executorch.runtime import Runtime

    from ..quiet import executorch_logs

    try:
        with executorch_logs():
            loaded = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=buffer_size)
            method = loaded.load_method("forward")
        if method is None:
            raise RuntimeError("no method 'forward'")
    except Exception as e:  # noqa: BLE001
        raise BackendError(ReplayStatus.RUN_FAIL, f"ExecuTorch could not load the program: {short_error(e)}") from e
    try:
        with executorch_logs():
            raw = method.execute([a.contiguous() if isinstance(a, torch.Tensor) else a for a in args])
    except Exception as e:  # noqa: BLE001
        raise BackendError(ReplayStatus.RUN_FAIL, f"ExecuTorch execution failed: {short_error(e)}") from e
    outputs = [o.clone() for o in raw if isinstance(o, torch.Tensor)]
    with tempfile.TemporaryDirectory(prefix="xray-etdump-") as tmp:
        etdump, buffer = os.path.join(tmp, "run.etdp"), os.path.join(tmp, "debug.bin")
        try:
            loaded.write_etdump_result_to_file(etdump, buffer)
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.RUN_FAIL, f"ExecuTorch wrote no ETDump (is this build's event tracer "
                                                      f"on?): {short_error(e)}") from e
        return outputs, _logged_outputs(etdump, buffer)


def _logged_outputs(etdump: str, debug_buffer: str) -> dict[int, tuple[str, list[torch.Tensor]]]:
    """Instruction index -> (event name, logged tensors) of the one execution in the ETDump."""
    from executorch.devtools import Inspector

    with warnings.catch_warnings():
        # torch.frombuffer over the read-only debug buffer warns once per tensor; they are cloned.
        warnings.simplefilter("ignore", UserWarning)
        inspector = Inspector(etdump_path=etdump, debug_buffer_path=debug_buffer)
    logged: dict[int, tuple[str, list[torch.Tensor]]] = {}
    for block in inspector.event_blocks:
        if block.name != "Execute":
            continue
        for event in block.events:
            # The instruction index the runtime logged (see the module docstring).
            instruction = event._instruction_id  # noqa: SLF001
            if instruction is None or event.is_delegated_op or not event.debug_data or instruction in logged:
                continue
            tensors = [t.clone() for t in event.debug_data if isinstance(t, torch.Tensor)]
            if tensors:
                logged[instruction] = (event.name, tensors)
    return logged


def _match_instructions(final: torch.fx.GraphModule,
                        events: dict[int, tuple[str, list[torch.Tensor]]]) -> list[_Logged]:
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
            count = _delegate_output_count(final, node)
            if len(tensors) < count:
                continue
            tensors = tensors[len(tensors) - count:]
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


def _narrow_groups(final: torch.fx.GraphModule, ref_graph: torch.fx.Graph, logged: list[_Logged],
                   via: tuple[int, dict[str, list[str]]]) -> None:
    """A quantized run's provenance names a whole group: every reference node decomposed from one
    source node (``linear`` -> view, permute, mm, view); a node of one kind in the group is that
    reference node. Several nodes of one kind in a group (two ``expand`` of a ``matmul``) are
    told apart by the source nodes their inputs come from; when that does not single one out the
    value is left unmapped (a wrong pairing would read as a quantization error). A dequantize
    stands for the value leaving the group, its last node."""
    order = {n.name: i for i, n in enumerate(ref_graph.nodes)}
    kind = {n.name: _op_name(n).removesuffix("_copy") for n in ref_graph.nodes if n.op == "call_function"}
    ref_names = set(order)
    ref_nodes = {n.name: n for n in ref_graph.nodes}
    source_of = {n.name: (n.meta.get("from_node") or [n])[0].name for n in ref_graph.nodes}
    for entry in logged:
        nodes = _delegate_outputs(final, entry.node) if _is_delegate(entry.node) else [entry.node]
        narrowed = []
        for node, names in zip(nodes, entry.sources):
            group = sorted(names, key=lambda n: order.get(n, -1))
            if not isinstance(node, torch.fx.Node) or not group:
                narrowed.append([])
                continue
            op = _op_name(node).removesuffix("_copy")
            if op.startswith("dequantize"):
                narrowed.append(group[-1:])
                continue
            same = [n for n in group if kind.get(n) == op]
            if len(same) > 1:  # tell them apart by where their inputs come from, or leave it unmapped
                mine = [frozenset(source_of.get(r, r) for r in _provenance(a, id(ref_graph), ref_names, via))
                        for a in node.all_input_nodes]
                by_inputs = [n for n in same if _input_sources(ref_nodes[n], source_of) == mine]
                narrowed.append(by_inputs if len(by_inputs) == 1 and all(mine) else [])
                continue
            narrowed.append(same)
        entry.sources = narrowed


def _input_sources(node: torch.fx.Node, source_of: dict[str, str]) -> list[frozenset]:
    """Per input of a reference node: the source node it was decomposed from (a placeholder: itself)."""
    return [frozenset({source_of.get(a.name, a.name)}) for a in node.all_input_nodes]


def _delegate_outputs(final: torch.fx.GraphModule, node: torch.fx.Node) -> list[Any]:
    """The output nodes of the subgraph a delegate call runs, in output order."""
    lowered = getattr(final, node.args[0].target)
    outs = lowered.original_module.graph.output_node().args[0]
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _delegate_output_count(final: torch.fx.GraphModule, node: torch.fx.Node) -> int:
    return len(_delegate_outputs(final, node))


def _output_sources(final: torch.fx.GraphModule, node: torch.fx.Node, ref_graph_id: int,
                    ref_names: set[str], via: tuple[int, dict[str, list[str]]] | None = None) -> list[list[str]]:
    """Reference node names behind each tensor output of ``node`` (delegates: each subgraph output)."""
    if not _is_delegate(node):
        return [_provenance(node, ref_graph_id, ref_names, via)]
    return [_provenance(o, ref_graph_id, ref_names, via) if isinstance(o, torch.fx.Node) else []
            for o in _delegate_outputs(final, node)]


def _provenance(node: torch.fx.Node, ref_graph_id: int, ref_names: set[str],
                via: tuple[int, dict[str, list[str]]] | None = None) -> list[str]:
    """Reference node names ``node`` was derived from, through ``from_node`` (all branches).

    A path stops at its first node of the reference graph: ids of freed graphs get reused, so a
    deeper entry with the reference graph's id may be an older, unrelated graph. ``via`` (a
    quantized run): (the converted graph's id, its node name -> reference node names); a path
    stops there instead."""
    found: list[str] = []
    queue = deque(node.meta.get("from_node") or [])
    seen = 0
    while queue and seen < 10_000:
        source = queue.popleft()
        seen += 1
        if via is not None and source.graph_id == via[0]:
            for name in via[1].get(source.name, []):
                if name not in found:
                    found.append(name)
            continue
        if via is None and source.graph_id == ref_graph_id and source.name in ref_names:
            if source.name not in found:
                found.append(source.name)
            continue
        queue.extend(source.from_node or [])
    return found


def _assign(ref_graph: torch.fx.Graph, logged: list[_Logged],
            outputs: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """Reference node name -> its output tensors, as ExecuTorch computed them.

    Several instructions can descend from one reference node (a decomposition); the last one
    whose tensors have the node's shapes and dtypes holds its value. A getitem of a captured
    multi-output node takes that output; a node the program returns (often a view, which logs
    nothing) takes the program's output."""
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
    returned = _returned_nodes(ref_graph.output_node().args[0])
    if len(returned) == len(outputs):
        for node, tensor in zip(returned, outputs):
            if (node is not None and node.op == "call_function" and node.name not in candidates
                    and _fits(node, [tensor])):
                candidates[node.name] = [tensor]
    return {n.name: candidates[n.name] for n in ref_graph.nodes if n.name in candidates}


def _returned_nodes(value: Any) -> list[torch.fx.Node | None]:
    """The output node's arguments in the order the program returns them (None: not a node)."""
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _returned_nodes(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _returned_nodes(v)]
    return [value if isinstance(value, torch.fx.Node) else None]


def _tensor_outputs(node: torch.fx.Node) -> list[torch.Tensor]:
    return [t for t in flatten_tensors(node.meta.get("val")) if isinstance(t, torch.Tensor)]


def _fits(ref_node: torch.fx.Node, tensors: list[torch.Tensor]) -> bool:
    """The tensors have the reference node's output count, shapes and dtypes."""
    expected = _tensor_outputs(ref_node)
    if len(expected) != len(tensors):
        return False
    return all(tuple(e.shape) == tuple(t.shape) and e.dtype == t.dtype for e, t in zip(expected, tensors))


def _delegate_coverage(final: torch.fx.GraphModule, ref_graph_id: int, ref_names: set[str],
                       logged: list[_Logged], via: tuple[int, dict[str, list[str]]] | None = None,
                       ) -> tuple[set[str], set[str]]:
    """(reference nodes computed inside delegates, reference nodes a delegate call logged)."""
    inside: set[str] = set()
    for node in final.graph.nodes:
        if node.op == "call_function" and _is_delegate(node):
            lowered = getattr(final, node.args[0].target)
            for inner in lowered.original_module.graph.nodes:
                if inner.op == "call_function":
                    inside.update(_provenance(inner, ref_graph_id, ref_names, via))
    boundary = {name for entry in logged if _is_delegate(entry.node) for names in entry.sources for name in names}
    return inside, boundary


def count_nodes(gm: torch.fx.GraphModule) -> tuple[int, int]:
    """(delegate calls, ops left to the portable kernels) in the lowered edge graph."""
    delegated = undelegated = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if "executorch_call_delegate" in name:
            delegated += 1
        elif name != "getitem":
            undelegated += 1
    return delegated, undelegated
