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


def describe(error: BaseException, side: str, node: torch.fx.Node | None, code_paths: list[str]) -> Crash:
    """What a crash says about itself: the node inductor was lowering, else the output-code line
    (the kernel call) the error passed through."""
    from .reference import module_path

    crash = Crash(side, _line(innermost(error)))
    if node is not None:
        stack = node.meta.get("nn_module_stack") or {}
        trace = [line for line in (node.meta.get("stack_trace") or "").strip().splitlines()
                 if line.strip(" ^~")]  # not the caret lines under the source
        crash.node, crash.op = node.name, str(node.target)
        crash.module = module_path(str(list(stack.values())[-1][0])) if stack else ""
        crash.stack_trace = "; ".join(" ".join(line.split()) for line in trace[-2:]) if trace else None
    paths = {p for p in code_paths if p}
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename in paths:
            crash.kernel = (frame.line or "").strip() or f"{Path(frame.filename).name}:{frame.lineno}"
    return crash


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


def make_tensor(val: torch.Tensor, device: str) -> str:
    shape, dtype = list(val.shape), str(val.dtype)
    if val.dtype.is_floating_point or val.dtype.is_complex:
        return f"torch.randn({shape}, dtype={dtype}, device={device!r})"
    if val.dtype == torch.bool:
        return f"torch.randint(0, 2, {shape}, device={device!r}).bool()"
    return f"torch.randint(0, 8, {shape}, dtype={dtype}, device={device!r})"


def repro_source(node: torch.fx.Node, crash: Crash) -> str | None:
    """A standalone script: the node alone as a function of random inputs of its recorded shapes
    and dtypes, run eager and compiled with inductor; exit status 1 while the compiled side fails.
    None when the node is no ATen op or an input's shape is unknown."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return None
    inputs = node.all_input_nodes
    vals = [n.meta.get("val") for n in inputs]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    names = {n.name: f"a{i}" for i, n in enumerate(inputs)}
    params = ", ".join(names[n.name] for n in inputs)
    call = ", ".join([literal(a, names) for a in node.args] +
                     [f"{k}={literal(v, names)}" for k, v in node.kwargs.items()])
    made = "\n".join(f"    {names[n.name]} = {make_tensor(v, v.device.type)}" for n, v in zip(inputs, vals))
    op = str(node.target)
    return f'''"""xray compile-check repro: {op} (node {node.name}{f', module {crash.module}' if crash.module else ''})
fails to {crash.side} with inductor where eager runs.
    {crash.error}
Exit status 1 while the compiled side still fails, 0 once it runs."""
import sys

import torch

aten = torch.ops.aten


def f({params}):
    return torch.ops.{op}({call})


def main() -> int:
    torch.manual_seed(0)
{made}
    eager = f({params})
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


def write_repro(out: Path, node: torch.fx.Node | None, crash: Crash) -> None:
    from ..dump.atomic import write_text

    source = repro_source(node, crash) if node is not None else None
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
