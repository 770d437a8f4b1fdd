"""The eager side of a compile check: the Dynamo graphs a compile captured, run node by node in
eager under xray's tracer, on the very inputs the compiled run received.

Dynamo's graph holds the model's own torch calls before any compiler pass (no decomposition, no
post-grad pass), so its eager run is the model's eager semantics, and each post-grad node names
the Dynamo node it came from (``from_node``). Running node by node lets the tracer note which
records each Dynamo node made: the group a compiled buffer is paired within (mapping.py).
"""
from __future__ import annotations

import copy
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..record.flatten import flatten_tensors
from .capture import backward_group


def module_path(dynamo_path: str) -> str:
    """Dynamo's module path (``L['self'].layers[0]._modules['mlp']``) as the tracer writes
    module paths (``layers.0.mlp``)."""
    p = re.sub(r"^L\[['\"][^'\"]+['\"]\]\.?", "", dynamo_path)
    p = re.sub(r"getattr\(([^,]+), ['\"]([^'\"]+)['\"]\)", r"\1.\2", p)
    p = re.sub(r"\._modules\[['\"]([^'\"]+)['\"]\]", r".\1", p)
    p = re.sub(r"\[['\"]([^'\"]+)['\"]\]", r".\1", p)
    p = re.sub(r"\[(\d+)\]", r".\1", p)
    return p.strip(".")


def frames(node: torch.fx.Node) -> list[tuple[str, str]]:
    """(path, class name) frames of a Dynamo node, outermost first, without the root module."""
    out = []
    for path, cls in (node.meta.get("nn_module_stack") or {}).values():
        p = module_path(str(path))
        if p:
            out.append((p, cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]))
    return out


@dataclass
class DynamoGraphs:
    """The Dynamo graphs compiled (snapshots taken before any compiler pass) and each run's inputs."""

    graphs: list[torch.fx.GraphModule] = field(default_factory=list)
    runs: list[tuple[int, list[Any]]] = field(default_factory=list)  # (graph, inputs) in run order
    # per run: the gradient each output received in the backward (None: none, or no backward)
    tangents: list[list[torch.Tensor | None]] = field(default_factory=list)
    recording: bool = False

    def backend(self, capture: Any, compile_fn: Callable[[torch.fx.GraphModule, list], Callable]) -> Callable:
        """A torch.compile backend: snapshots each graph, compiles it with ``compile_fn``, and
        keeps each run's inputs while recording."""

        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            index = len(self.graphs)
            self.graphs.append(copy.deepcopy(gm))
            capture.dynamo = index
            try:
                compiled = compile_fn(gm, example_inputs)
            finally:
                capture.dynamo = None

            def run(*args: Any) -> Any:
                if not self.recording:
                    return compiled(*args)
                kept = [a.detach().clone().requires_grad_(a.requires_grad)
                        if isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter) else a for a in args]
                self.runs.append((index, kept))
                result = compiled(*args)
                self.tangents.append(_catch_tangents(flatten_tensors(result)))
                return result

            return run

        return compile_graph


def _catch_tangents(outputs: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """A list that the backward fills with the gradient each output receives: the compiled
    backward's inputs, which the eager reference's backward is then fed."""
    caught: list[torch.Tensor | None] = [None] * len(outputs)
    for i, t in enumerate(outputs):
        if t.requires_grad:
            def keep(grad: torch.Tensor | None, i: int = i) -> None:
                if grad is not None:  # an output the loss does not reach (GPT-2) gets an undefined gradient
                    caught[i] = grad.detach().clone()
            t.register_hook(keep)
    return caught


class _NodeRun(torch.fx.Interpreter):
    """Runs one Dynamo graph, each node attributed to its module; notes each node's records, and
    the records its autograd nodes make in the backward (group ``<node>:backward``)."""

    def __init__(self, gm: torch.fx.GraphModule, recorder: Any) -> None:
        super().__init__(gm)
        self.recorder = recorder
        self.node_seqs: dict[str, list[tuple[int, int]]] = {}  # node -> [first seq, end seq) ranges
        self.claimed: set[Any] = set()  # autograd nodes already attributed to a Dynamo node

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op not in ("call_function", "call_method", "call_module"):
            return super().run_node(n)
        before = self.recorder.seq
        with self.recorder.attributed_to(frames(n)):
            result = super().run_node(n)
        self.node_seqs.setdefault(n.name, []).append((before, self.recorder.seq))
        if torch.is_grad_enabled():
            self._claim(n.name, flatten_tensors(result))
        return result

    def _claim(self, name: str, outputs: list[torch.Tensor]) -> None:
        """The autograd nodes this Dynamo node created (reached from its outputs, not claimed by an
        earlier node) note the records they make when the backward runs them."""
        todo = [t.grad_fn for t in outputs if t.grad_fn is not None]
        group = backward_group(name)
        while todo:
            fn = todo.pop()
            if fn is None or fn in self.claimed or type(fn).__name__ == "AccumulateGrad":
                continue
            self.claimed.add(fn)
            todo.extend(f for f, _ in fn.next_functions)
            start: list[int] = []
            fn.register_prehook(lambda _g, start=start: start.append(self.recorder.seq))
            fn.register_hook(lambda _gi, _go, start=start, group=group: self.node_seqs.setdefault(group, []).append(
                (start.pop() if start else self.recorder.seq, self.recorder.seq)))


@dataclass
class EagerReference:
    dump: Path
    node_seqs: list[dict[str, list[tuple[int, int]]]]  # per run (DynamoGraphs.runs order): node -> seq ranges
    outputs: list[torch.Tensor]  # the last run's outputs, flat


def _backward(outputs: list[torch.Tensor], args: list[Any], tangents: list[torch.Tensor | None]) -> None:
    """One run's eager backward, gradients to its inputs only (no ``.grad`` is touched)."""
    pairs = [(o, g) for o, g in zip(outputs, tangents) if g is not None and o.requires_grad]
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if pairs and inputs:
        torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)


def record_eager(dynamo: DynamoGraphs, model: torch.nn.Module | None, folder: Path, *, dump_num: int,
                 backward: bool = False) -> EagerReference:
    """Run every recorded graph run in eager under the tracer into ``folder``; with ``backward``,
    then each run's backward (last run first, as autograd runs them), fed the gradients its
    compiled outputs received."""
    from ..record import active_session, begin_dump, end_dump

    if active_session() is not None:
        raise RuntimeError("an xray dump is already active; end it before a compile check")
    staging = folder.parent / f"_{folder.name}-recording"
    shutil.rmtree(staging, ignore_errors=True)
    begun = begin_dump(X_DEBUG=0x10A if backward else 0x102, X_DEDUP=False, X_DUMP_NUM=dump_num, dump_dir=staging)
    session = active_session()
    if begun is None or session is None:
        raise RuntimeError(f"cannot write the eager dump under {staging}")
    node_seqs, outputs = [], []
    try:
        if model is not None:  # inputs read from a weight name it, as a recording of the model does
            for kind, items in (("param", model.named_parameters()), ("buffer", model.named_buffers())):
                for name, t in items:
                    session.recorder.producers.name_state(t, kind, name)
        pending = []
        with torch.set_grad_enabled(backward):
            for i, (index, args) in enumerate(dynamo.runs):
                runner = _NodeRun(dynamo.graphs[index], session.recorder)
                outputs = flatten_tensors(runner.run(*args))
                node_seqs.append(runner.node_seqs)
                pending.append((outputs, args, dynamo.tangents[i] if i < len(dynamo.tangents) else []))
        for outs, args, tangents in reversed(pending if backward else []):
            _backward(outs, args, tangents)
        outputs = [t.detach() for t in outputs]
    finally:
        written = end_dump()
    if folder.exists():
        shutil.rmtree(folder)
    shutil.move(str(written), folder)
    shutil.rmtree(staging, ignore_errors=True)
    return EagerReference(folder, node_seqs, outputs)
