"""The reference of a drift run: one exported program, run node by node in eager under the tracer.

Every backend gets the same program (``torch.export(..., strict=False).run_decompositions()``,
core ATen), so its node names are the one key that ties a backend's intermediates to eager
records. Running that program with a ``torch.fx.Interpreter`` under xray's tracer makes each
``call_function`` node exactly one recorded op call (its seq is noted before and after the node),
with the layer named from ``node.meta["nn_module_stack"]`` and parameters named by their
qualified names, so the eager dump reads like any recording of the model.
"""
from __future__ import annotations

import gc
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.export.graph_signature import InputKind, TensorArgument

from ..dump.folder_owner import check_output, mark_output, replace_output
from ..record.flatten import flatten_tensors

DRIFT = "xray drift"  # the command its output folders are marked with (dump.folder_owner)


class ReferenceError(RuntimeError):
    """torch.export or the eager run of the exported program failed: no backend can be compared."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage


@dataclass
class Reference:
    """The exported program, its recorded eager run, and the node <-> record map."""

    program: torch.export.ExportedProgram
    user_inputs: tuple  # the program's flat tensor user inputs, in placeholder order
    dump: Path  # the eager trace dump
    node_seq: dict[str, int]  # call_function node name -> the seq of its one record
    placeholders: dict[str, torch.Tensor]  # placeholder node name -> the value fed
    state: dict[str, str]  # "param:<fqn>" / "buffer:<fqn>" -> placeholder node name
    outputs: list[torch.Tensor]
    eager_equal: bool  # the program's outputs are bitwise the model's own eager outputs
    eager_max_diff: float
    eager_s: float  # one plain forward of the model (the fastest of four), for scale
    seconds: dict[str, float] = field(default_factory=dict)
    unmapped_nodes: list[str] = field(default_factory=list)  # nodes that did not make exactly one record
    # seq -> {input key ("self", "tensors.1"): placeholder node name}: which record inputs are
    # read straight from a placeholder (a model input, a lifted constant), by graph edge
    placeholder_args: dict[int, dict[str, str]] = field(default_factory=dict)
    values: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # node -> eager outputs
    # the program before decompositions and the model's own call (args, kwargs): what quantizers
    # (PT2E) annotate and calibrate on
    source: torch.export.ExportedProgram | None = None
    call: tuple[tuple, dict] = ((), {})

    @property
    def user_placeholders(self) -> dict[str, torch.Tensor]:
        """Placeholder name -> tensor, for the model inputs every backend is fed."""
        names = [s.arg.name for s in self.program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        return {n: self.placeholders[n] for n in names if isinstance(self.placeholders.get(n), torch.Tensor)}

    @property
    def seq_node(self) -> dict[int, str]:
        return {s: n for n, s in self.node_seq.items()}


def export_program(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.export.ExportedProgram:
    """The reference program handed to every backend: non-strict export, core ATen decompositions."""
    return export_programs(model, args, kwargs)[1]


def export_programs(model: torch.nn.Module, args: tuple,
                    kwargs: dict) -> tuple[torch.export.ExportedProgram, torch.export.ExportedProgram]:
    """(the exported program before decompositions, the reference program). Quantizers annotate
    the first (``aten.linear``, ``aten.conv2d``); the reference's nodes name it in ``from_node``."""
    source = torch.export.export(model, args, kwargs, strict=False)
    return source, source.run_decompositions()


def _layer(node: torch.fx.Node) -> list[tuple[str, str]]:
    """(path, class name) frames, outermost first, as the tracer's module stack writes them."""
    stack = node.meta.get("nn_module_stack") or {}
    frames = []
    for path, cls in stack.values():
        name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
        frames.append((path, name))
    return frames


def _flat_inputs(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> list[Any]:
    """Values for every placeholder, in order: parameters, buffers, constants, then user inputs."""
    from torch.export._tree_utils import reorder_kwargs

    # the program's in_spec orders keyword arguments as the forward's signature does
    user = torch.utils._pytree.tree_leaves((args, reorder_kwargs(kwargs, program.call_spec.in_spec)))
    user_iter = iter(user)
    values = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            # non-tensor user inputs (flags) are placeholders too; the leaves come in the same order
            values.append(next(user_iter))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            values.append(program.state_dict[spec.target] if spec.target in program.state_dict
                          else program.constants[spec.target])
        else:
            values.append(program.constants[spec.target])
    return values


def _dump_num(graph: torch.fx.Graph) -> int:
    """Enough saved tensors per record for every input and output of the widest node."""
    most = 1
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        ins = sum(1 for a in torch.utils._pytree.tree_leaves((n.args, n.kwargs))
                  if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor))
        outs = len(flatten_tensors(n.meta.get("val")))
        most = max(most, ins + outs)
    return most + 1


def _placeholder_args(node: torch.fx.Node) -> dict[str, str]:
    """Record input keys (schema names, ``name.i`` for list items, as the tracer writes them)
    whose value is a placeholder of the graph."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return {}
    out = {}
    for i, arg in enumerate(node.target._schema.arguments):
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        items = [(arg.name, value)] if not isinstance(value, (list, tuple)) else \
            [(f"{arg.name}.{j}", v) for j, v in enumerate(value)]
        for key, v in items:
            if isinstance(v, torch.fx.Node) and v.op == "placeholder":
                out[key] = v.name
    return out


class _RecordedRun(torch.fx.Interpreter):
    """Runs the graph node by node, each attributed to its ``nn_module_stack``; the recorder's
    seq counter says which record the node made."""

    def __init__(self, gm: torch.fx.GraphModule, recorder: Any) -> None:
        super().__init__(gm)
        self.recorder = recorder
        self.node_seq: dict[str, int] = {}
        self.unmapped: list[str] = []
        self.placeholder_args: dict[int, dict[str, str]] = {}
        self.values: dict[str, list[torch.Tensor]] = {}  # node -> its eager output tensors (isolated runs)

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        before = self.recorder.seq
        result = None
        try:
            with self.recorder.attributed_to(_layer(n)):
                result = super().run_node(n)
            return result
        finally:
            if result is not None:
                self.values[n.name] = flatten_tensors(result)
            made = self.recorder.seq - before
            if made == 1:
                self.node_seq[n.name] = before
                read = _placeholder_args(n)
                if read:
                    self.placeholder_args[before] = read
            elif isinstance(n.target, torch._ops.OpOverload):  # getitem makes none; an ATen op one
                self.unmapped.append(n.name)


def record_reference(model: torch.nn.Module, args: tuple, kwargs: dict, out: Path) -> Reference:
    """Export ``model``, run the program under the tracer into ``out/eager``, and compare it with eager."""
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    try:
        source, program = export_programs(model, args, kwargs)
    except Exception as e:  # noqa: BLE001 - the exporter's error is the result
        hint = ("; the model returns a KV cache: pass use_cache=False (in the example kwargs or the model's "
                "config)" if "Cache" in str(e) and "use_cache" in str(kwargs) + str(getattr(model, "config", "")) else "")
        raise ReferenceError("export", f"torch.export failed: {type(e).__name__}: {str(e)[:500]}{hint}") from e
    seconds["export"] = time.perf_counter() - start

    start = time.perf_counter()
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    by_name = {n.name: v for n, v in zip(placeholders, _flat_inputs(program, args, kwargs))}
    state = {f"{'param' if s.kind == InputKind.PARAMETER else 'buffer'}:{s.target}": s.arg.name
             for s in program.graph_signature.input_specs if s.kind in (InputKind.PARAMETER, InputKind.BUFFER)}
    user_inputs = tuple(by_name[s.arg.name] for s in program.graph_signature.input_specs
                        if s.kind == InputKind.USER_INPUT and isinstance(s.arg, TensorArgument))
    dest, outputs, runner = _record(program, [by_name[n.name] for n in placeholders], by_name, state, out)
    seconds["eager_reference"] = time.perf_counter() - start

    eager, eager_s = _eager(model, args, kwargs)
    equal, diff = _same(outputs, eager)
    return Reference(program=program, user_inputs=user_inputs, dump=dest, node_seq=runner.node_seq,
                     placeholders=by_name, state=state, outputs=outputs, eager_equal=equal, eager_max_diff=diff,
                     eager_s=eager_s, seconds=seconds, unmapped_nodes=runner.unmapped,
                     placeholder_args=runner.placeholder_args, values=runner.values, source=source,
                     call=(tuple(args), dict(kwargs)))


def _record(program: torch.export.ExportedProgram, flat: list, by_name: dict[str, Any], state: dict[str, str],
            out: Path) -> tuple[Path, list[torch.Tensor], _RecordedRun]:
    """Run the program under the tracer; the dump lands in ``out/eager``. Returns it, the
    program's user outputs, and the runner (its node -> record map)."""
    from ..record import active_session, begin_dump, end_dump

    if active_session() is not None:
        raise ReferenceError("record", "an xray dump is already active; end it before xray drift")
    staging = replace_output(out / "_recording", DRIFT)
    folder = begin_dump(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=_dump_num(program.graph), dump_dir=staging)
    session = active_session()
    if folder is None or session is None:
        raise ReferenceError("record", f"cannot write the eager dump under {staging}")
    runner = _RecordedRun(program.graph_module, session.recorder)
    try:
        for key, name in state.items():  # inputs read from a weight name it, as a model's own run does
            kind, _, fqn = key.partition(":")
            session.recorder.producers.name_state(by_name[name], kind, fqn)
        with torch.no_grad():
            results = list(runner.run(*flat, enable_io_processing=False))
    except Exception as e:  # noqa: BLE001
        end_dump()
        shutil.rmtree(staging, ignore_errors=True)
        raise ReferenceError("eager", f"running the exported program failed: {type(e).__name__}: {str(e)[:500]}") from e
    folder = end_dump()
    dest = out / "eager"
    check_output(dest, DRIFT)  # checked before the run too (drift.run): a user's folder is never deleted
    if dest.exists():
        shutil.rmtree(dest)
    shutil.move(str(folder), dest)
    mark_output(dest, DRIFT)
    shutil.rmtree(staging, ignore_errors=True)
    # the output node lists mutated buffers first, then the user outputs
    n_user = len(program.graph_signature.user_outputs)
    return dest, flatten_tensors(results[len(results) - n_user:] if n_user else []), runner


def _eager(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], float]:
    """The model's own eager outputs, and one forward's time (the fastest of four)."""
    with torch.no_grad():
        eager = flatten_tensors(model(*args, **kwargs))
        eager_s = math.inf
        gc.collect()  # export leaves ~1e6 objects: the next forwards would pay gen-2 collections (~0.3 s each)
        for _ in range(4):
            start = time.perf_counter()
            model(*args, **kwargs)
            eager_s = min(eager_s, time.perf_counter() - start)
    return eager, eager_s


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[bool, float]:
    """Bitwise equality of two output lists, and the largest absolute difference."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return False, float("inf")
    equal = all(torch.equal(x, y) for x, y in zip(a, b))
    diff = max((float((x.double() - y.double()).abs().max()) for x, y in zip(a, b) if x.numel()), default=0.0)
    return equal, diff
