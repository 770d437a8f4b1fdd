"""A standalone pytest file for the kernel a numerical divergence is born in: the post-grad ATen
nodes the kernel fuses, rebuilt as one function, run eager, in fp64 and compiled with inductor on
the values the compiled run fed the kernel, judged by ``torch._dynamo.utils.same`` (the compiled
error vs fp64 may not exceed eager's by more than its multiplier).

The inputs are recorded values, saved beside the test as ``.pt``: a buffer another launch wrote,
or a forward graph's input (a weight, the model's input: the Dynamo graph's inputs of the first
recorded run, in order, when their shapes and dtypes are the compiled graph's). Any other input is
random of its recorded shape, uniform in [0, 1) so that a domain-limited op (rsqrt of a variance)
stays defined."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from ..dump.atomic import write_text
from .capture import CompiledGraph

PREFIX = "test_repro_"


def _tensor(shape: tuple, dtype: str) -> str:
    return f"torch.rand({list(shape)}, dtype={dtype})" if "float" in dtype or "complex" in dtype else \
        f"torch.randint(0, 2, {list(shape)}).bool()" if dtype == "torch.bool" else \
        f"torch.randint(0, 8, {list(shape)}, dtype={dtype})"


def recorded(graph: CompiledGraph, launch: int, name: str, values: dict) -> torch.Tensor | None:
    """The value node ``name`` had in the first recorded run: the last buffer holding it that a
    launch before ``launch`` wrote."""
    found = None
    for earlier in graph.launches:
        if earlier.index >= launch:
            break
        kept = values.get((graph.index, 0, earlier.index)) or ()
        for buffer, value in zip(earlier.outputs, kept):
            if graph.buffer_node.get(buffer) == name and isinstance(value, torch.Tensor):
                found = value
    return found


def graph_inputs(graph: CompiledGraph, fed: list) -> dict[str, torch.Tensor]:
    """A forward graph's placeholders -> the values the Dynamo graph was fed (AOT autograd keeps
    their order), only when every shape and dtype agrees; {} otherwise (a backward graph's inputs
    are saved activations and gradients)."""
    tensors = [a for a in fed if isinstance(a, torch.Tensor)]
    if graph.backward or len(tensors) != len(graph.inputs) or len(tensors) != len(fed):
        return {}
    metas = graph.inputs.values()
    if any(tuple(t.shape) != shape or str(t.dtype) != dtype for t, (shape, dtype) in zip(tensors, metas)):
        return {}
    return {name: t.detach() for name, t in zip(graph.inputs, tensors)}


def source(graph: CompiledGraph, launch: int, title: str, values: dict,
           fed: dict[str, torch.Tensor]) -> tuple[str, dict[str, Any]] | None:
    """The test's source; None when the kernel's nodes cannot be rebuilt (a node that is no ATen
    call, an input that is not one tensor of known shape)."""
    fused = set(graph.fused.get(launch, []))
    ordered = [graph.nodes[n] for n in graph.nodes if n in fused]
    if not ordered or any(not n.call for n in ordered):
        return None
    inputs: dict[str, tuple[tuple, str]] = {}
    for n in ordered:
        for a in n.args:
            if a in fused or a in inputs:
                continue
            known = graph.nodes.get(a)
            meta = (known.shape, known.dtype) if known is not None else graph.inputs.get(a)
            if meta is None or meta[0] is None or meta[1] is None:
                return None
            inputs[a] = meta
    outputs = [n.name for n in ordered if n.shape is not None and n.dtype is not None]
    if not outputs:
        return None
    saved = {}
    for a, (shape, dtype) in inputs.items():
        value = fed.get(a) if a in fed else recorded(graph, launch, a, values)
        if value is not None and tuple(value.shape) == tuple(shape) and str(value.dtype) == dtype:
            saved[a] = value
    params = ", ".join(inputs)
    body = "\n".join(f"    {n.name} = {n.call}" for n in ordered)
    made = ", ".join(f"saved[{a!r}]" if a in saved else _tensor(*meta) for a, meta in inputs.items())
    return f'''"""xray compile-check repro: {title}.
The kernel's fused ATen nodes on the buffers the compiled run fed it ({len(saved)} of {len(inputs)} inputs recorded,
the rest random of their shapes): the test fails while the compiled result's error vs fp64 exceeds
eager fp32's beyond torch._dynamo.utils.same's multiplier."""
import operator
from pathlib import Path

import torch
from torch._dynamo.utils import rmse, same

aten = torch.ops.aten


def kernel({params}):
{body}
    return ({", ".join(outputs)},)


def test_kernel_matches_eager_within_fp32():
    torch._dynamo.reset()
    torch.manual_seed(0)
    saved = torch.load(Path(__file__).with_suffix(".pt")) if Path(__file__).with_suffix(".pt").exists() else {{}}
    xs = [{made}]
    eager = kernel(*xs)
    high = kernel(*[x.double() if x.is_floating_point() else x for x in xs])
    with torch._inductor.config.patch(fx_graph_cache=False):  # compile now, not a cached kernel
        compiled = torch.compile(kernel, backend="inductor", fullgraph=True)(*xs)
    torch._dynamo.reset()
    for name, e, h, c in zip({outputs!r}, eager, high, compiled):
        if e.is_floating_point():
            assert same(e, c, h, log_error=lambda *a, **k: None), (
                f"{{name}}: compiled rmse vs fp64 {{rmse(h, c).item():.3g}}, eager {{rmse(h, e).item():.3g}}")
''', saved


def write(out: Path, graph: CompiledGraph, launch: int, kernel: str, title: str, values: dict,
          fed: dict[str, torch.Tensor]) -> str | None:
    """Write ``out/test_repro_<kernel>.py`` (and its inputs, ``.pt``); its name, or None when the
    kernel cannot be rebuilt."""
    made = source(graph, launch, title, values, fed)
    if made is None:
        return None
    name = f"{PREFIX}{re.sub(r'[^0-9A-Za-z_]', '_', kernel)}.py"
    if made[1]:
        torch.save(made[1], out / name.replace(".py", ".pt"))
    write_text(out / name, made[0])
    return name
