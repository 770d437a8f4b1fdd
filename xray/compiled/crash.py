"""A compiled model that crashes where eager runs: which side failed (compiling or running), at
which post-grad FX node or kernel, torch's one-line error, and a standalone repro of that node.

The failing node is the one inductor was lowering when the error left ``GraphLowering.run_node``
(capture.py notes it, with its metadata: op, module, source line); a run-side failure is placed at
the output-code line (the kernel call) the error came through.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPRO = "repro.py"


@dataclass
class Crash:
    side: str  # "compile" or "run"
    error: str  # torch's one-line error (the innermost exception)
    node: str | None = None  # the post-grad FX node
    op: str | None = None  # its target ("aten.frexp.Tensor")
    module: str | None = None  # innermost nn_module_stack path, as the tracer writes paths
    stack_trace: str | None = None  # the model's source line that made the node
    kernel: str | None = None  # run side: the output-code line of the kernel call that failed
    repro: str | None = None  # the repro file written, relative to OUT

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}

    def verdict(self) -> str:
        where = f" at {self.op} in {self.module or '<root>'} (node {self.node})" if self.node else \
            f" in {self.kernel}" if self.kernel else ""
        return f"crash: the compiled model fails to {self.side} where eager runs{where}: {self.error}"


def innermost(error: BaseException) -> BaseException:
    """The error torch wrapped (Dynamo's ``BackendCompilerFailed``, inductor's ``LoweringException``
    keep the original as ``inner_exception`` or ``__cause__``)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "inner_exception", None) or error.__cause__
        if not isinstance(inner, BaseException):
            break
        error = inner
    return error


def _line(error: BaseException) -> str:
    from ..quiet import one_line

    text = str(error).strip().splitlines()
    return one_line(f"{type(error).__name__}: {text[0] if text else ''}", 400)


def describe(error: BaseException, side: str, node: torch.fx.Node | None, graphs: list) -> Crash:
    """What a crash says about itself: the node inductor was lowering, else the kernel launch of the
    output code the error passed through and the node that kernel computes."""
    from .reference import module_path

    crash = Crash(side, _line(innermost(error)))
    if node is not None:
        stack = node.meta.get("nn_module_stack") or {}
        trace = [line for line in (node.meta.get("stack_trace") or "").strip().splitlines()
                 if line.strip(" ^~")]  # not the caret lines under the source
        crash.node, crash.op = node.name, str(node.target)
        crash.module = module_path(str(list(stack.values())[-1][0])) if stack else ""
        crash.stack_trace = "; ".join(" ".join(line.split()) for line in trace[-2:]) if trace else None
    by_path = {g.path: g for g in graphs if g.path}
    for frame in traceback.extract_tb(error.__traceback__):
        graph = by_path.get(frame.filename)
        if graph is None:
            continue
        launch = next((la for la in graph.launches if la.line == frame.lineno), None)
        crash.kernel = launch.kernel if launch else (frame.line or "").strip()
        own = [graph.nodes[n] for n in (graph.fused.get(launch.index, []) if launch else [])
               if n in graph.nodes and graph.nodes[n].target != "getitem"]
        if node is None and len(own) == 1:
            info = own[0]
            crash.node, crash.op, crash.module = info.name, info.target, module_path(info.module)
            lines = [line for line in info.stack_trace.strip().splitlines() if line.strip(" ^~")]
            crash.stack_trace = "; ".join(" ".join(line.split()) for line in lines[-2:]) if lines else None
    return crash


def make_tensor(shape: tuple, dtype: str, device: str = "cpu") -> str:
    shape = list(shape)
    if "float" in dtype or "complex" in dtype:
        return f"torch.randn({shape}, dtype={dtype}, device={device!r})"
    if dtype == "torch.bool":
        return f"torch.randint(0, 2, {shape}, device={device!r}).bool()"
    return f"torch.randint(0, 8, {shape}, dtype={dtype}, device={device!r})"


def node_repro(node: torch.fx.Node, crash: Crash) -> str | None:
    """``repro_source`` for a node of a graph being lowered."""
    from .source import call_source

    vals = {n.name: n.meta.get("val") for n in node.all_input_nodes}
    if not all(isinstance(v, torch.Tensor) for v in vals.values()):
        return None
    return repro_source(str(node.target), node.name, call_source(node),
                        {k: (tuple(v.shape), str(v.dtype), v.device.type) for k, v in vals.items()}, crash)


def info_repro(graph: Any, name: str, crash: Crash) -> str | None:
    """``repro_source`` for a node of a compiled graph (capture.NodeInfo), inputs from the graph's metadata."""
    info = graph.nodes[name]
    inputs = {}
    for a in info.args:
        known = graph.nodes.get(a)
        meta = (known.shape, known.dtype) if known is not None else graph.inputs.get(a)
        if meta is None or meta[0] is None or meta[1] is None:
            return None
        inputs[a] = (meta[0], meta[1], "cpu")
    return repro_source(info.target, name, info.call, inputs, crash)


def repro_source(op: str, node: str, call: str, inputs: dict[str, tuple[tuple, str, str]], crash: Crash) -> str | None:
    """A standalone script: the node alone (``call``, Python source naming its inputs) as a
    function of random inputs of their recorded shapes and dtypes, run eager and compiled with
    inductor; exit status 1 while the compiled side fails (2: eager fails too). None when the call cannot be written."""
    if not call or not call.startswith("torch.ops."):
        return None
    params = ", ".join(inputs)
    made = "\n".join(f"    {k} = {make_tensor(*meta)}" for k, meta in inputs.items())
    return f'''"""xray compile-check repro: {op} (node {node}{f', module {crash.module}' if crash.module else ''})
fails to {crash.side} with inductor where eager runs.
    {crash.error}
Exit status 1 while the compiled side still fails, 0 once it runs, 2 if eager fails too."""
import sys

import torch

aten = torch.ops.aten


def f({params}):
    return {call}


def main() -> int:
    torch.manual_seed(0)
{made}
    try:
        eager = f({params})
    except Exception as e:  # not a compiler inconsistency of this node alone
        print(f"eager fails too: {{type(e).__name__}}: {{str(e).strip().splitlines()[0] if str(e).strip() else ''}}")
        return 2
    try:
        with torch._inductor.config.patch(fx_graph_cache=False):  # compile now, not a cached kernel
            compiled = torch.compile(f, backend="inductor", fullgraph=True)({params})
    except Exception as e:  # the crash being reproduced
        print(f"compiled fails: {{type(e).__name__}}: {{str(e).strip().splitlines()[0] if str(e).strip() else ''}}")
        return 1
    finally:
        torch._dynamo.reset()
    print("compiled runs; eager and compiled outputs:", type(eager).__name__, type(compiled).__name__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def write_repro(out: Path, node: torch.fx.Node | None, graphs: list, crash: Crash) -> None:
    """OUT/repro.py for the failing node: the node being lowered, else the one the failing kernel computes."""
    from ..dump.atomic import write_text

    graph = next((g for g in graphs if crash.node in g.nodes), None) if crash.node else None
    source = node_repro(node, crash) if node is not None else \
        info_repro(graph, crash.node, crash) if graph is not None else None
    if source is not None:
        write_text(out / REPRO, source)
        crash.repro = REPRO


def summary(crash: Crash, backend: str, mode: str | None) -> dict[str, Any]:
    """compare's summary shape for a crash: the verdict, the crashing node as the first divergence."""
    first = {"op": crash.op, "module": crash.module, "node": crash.node, "kernel": crash.kernel,
             "origin": "crash", "side": crash.side, "stack_trace": crash.stack_trace} \
        if crash.node or crash.kernel else None
    return {"verdict_kind": "crash", "verdict": crash.verdict(), "first_divergence": first,
            "crash": crash.to_json(), "compiled": {"backend": backend, "mode": mode}}
