"""``compile_check``: record a model eager and compiled, pair the compiled kernels' buffers with
the eager records, and let compare name the first divergence, down to the kernel and its ops.

Verdicts are compare's (``xray.compare.compare_dumps``): its rules, its first divergence, its
one-line verdict; this module only records, pairs and reports.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..dump.atomic import write_text
from ..dump.folder_owner import check_output, mark_output, replace_output
from ..numerics import math_settings
from ..record.flatten import flatten_tensors
from .capture import Capture, capturing
from .crash import REPRO
from .dump import run_math, write_compiled
from .mapping import pair_runs
from .reference import DynamoGraphs, record_eager

COMMAND = "xray compile-check"
BACKENDS = ("inductor",)
SUMMARY, CSV, HTML = "summary.json", "compare.csv", "report.html"


class CompileCheckError(RuntimeError):
    """The check cannot run: a bad argument, no inductor graph, or a model that fails in eager too
    (one line). A compiled side that fails where eager runs is a result (``CompileCheckResult.crash``)."""


@dataclass
class CompileCheckResult:
    """What a compile check found; ``out/summary.json`` holds ``summary``."""

    out: Path
    summary: dict[str, Any]  # compare's summary JSON, with ``compiled`` facts and the kernel at the first divergence
    verdict: str  # compare's one-line verdict
    kernels: int  # kernel launches probed
    paired: int  # compiled buffers paired with an eager record output
    unpaired: dict[str, int] = field(default_factory=dict)
    outputs_equal: bool = True  # the recorded compiled run's outputs are bitwise its plain run's
    eager_equal: bool = True  # the eager reference's outputs are bitwise the model's own eager outputs
    seconds: dict[str, float] = field(default_factory=dict)
    outputs: list[torch.Tensor] = field(default_factory=list)  # the compiled model's outputs, flat (plain run)
    crash: Any = None  # crash.Crash: the compiled side failed where eager runs (no comparison made)

    @property
    def first(self) -> dict[str, Any] | None:
        return self.summary.get("first_divergence")


def _check_out(out: Path) -> None:
    for folder in (out, out / "eager", out / "compiled"):
        check_output(folder, COMMAND)


def compile_check(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, out: str | Path = "xray-compile",
                  *, backend: str = "inductor", mode: str | None = None, config_patches: dict | None = None,
                  decompositions: dict | None = None, save_tensors: bool = True, dump_num: int = 8,
                  backward: bool = False, progress: Callable[[str], None] | None = None) -> CompileCheckResult:
    """Compile ``model`` with inductor, run it once recorded and its Dynamo graphs once in eager,
    and compare the two runs kernel by kernel.

    ``mode`` is torch.compile's (``max-autotune-no-cudagraphs``...); ``config_patches`` and
    ``decompositions`` go to inductor's ``compile_fx`` (tests and the fault benchmark inject
    compiler faults this way). ``save_tensors`` keeps each compiled buffer paired with an eager
    record (compare judges on tensors, not only statistics); ``dump_num`` is the eager run's
    ``X_DUMP_NUM``."""
    if backend not in BACKENDS:
        raise CompileCheckError(f"backend {backend!r}: only {', '.join(BACKENDS)} is supported")
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    try:
        options = dict(list_mode_options(mode) if mode else {})
    except Exception as e:  # noqa: BLE001 - torch's own message names the valid modes
        raise CompileCheckError(f"mode {mode!r}: {e}") from e
    options.update(config_patches or {})
    out = Path(out)
    _check_out(out)
    say = progress or (lambda _: None)
    kwargs = dict(kwargs or {})
    seconds: dict[str, float] = {}

    capture, dynamo = Capture(keep_tensors=save_tensors), DynamoGraphs()

    def compile_fn(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        try:
            return compile_fx(gm, example_inputs, inner_compile=capture.inner_compile(capture.dynamo),
                              config_patches=options, decompositions=decompositions)
        except Exception:
            capture.compile_failed = True
            raise

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=dynamo.backend(capture, compile_fn), dynamic=False)
    step = Step(compiled, model, args, kwargs, backward)
    say("compile")
    try:
        with torch.set_grad_enabled(backward):
            t0 = time.perf_counter()
            with capturing(capture):
                step()
            seconds["compile"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            plain = step()
            seconds["compiled_run"] = time.perf_counter() - t0
            say("recorded compiled run")
            math = math_settings.current()
            capture.recording = dynamo.recording = True
            t0 = time.perf_counter()
            try:
                recorded = step()
            finally:
                capture.recording = dynamo.recording = False
            seconds["recorded_run"] = time.perf_counter() - t0
            seconds["probe"] = capture.probe_seconds
    except Exception as e:  # noqa: BLE001 - the compiler's or the model's error is the result
        torch._dynamo.reset()
        return _crashed(e, capture, step, out, backend, mode)
    finally:
        torch._dynamo.reset()
    if not capture.graphs:
        raise CompileCheckError("torch.compile made no inductor graph for this model (nothing was compiled)")
    outputs_equal = len(plain) == len(recorded) and all(torch.equal(a, b) for a, b in zip(plain, recorded))

    say("eager reference")
    out.mkdir(parents=True, exist_ok=True)
    mark_output(out, COMMAND)
    t0 = time.perf_counter()
    ref = record_eager(dynamo, model, out / "eager", dump_num=dump_num, backward=backward)
    mark_output(out / "eager", COMMAND)
    seconds["eager_reference"] = time.perf_counter() - t0
    with torch.no_grad():
        own = flatten_tensors(model(*args, **kwargs))
    eager_equal = _found_in(own, ref.outputs)

    from ..dump import load_dump

    eager = load_dump(ref.dump)
    try:
        by_seq = {r.seq: r for r in eager.records if r.kind == "op"}
        pairing = pair_runs(capture.graphs, [g for g, _ in dynamo.runs], ref.node_seqs, by_seq, capture.values)
        folder = replace_output(out / "compiled", COMMAND)
        info = {"mode": mode, "graphs": len(capture.graphs), "kernel_launches": pairing.kernels,
                "paired": len(pairing.pairs), "unpaired": pairing.unpaired,
                "output_code": [g.path for g in capture.graphs], "kernels": kernel_table(capture.graphs)}
        devices = {t.device.type for t in flatten_tensors((args, kwargs)) + list(model.parameters())}
        write_compiled(folder, eager, pairing.pairs, capture.values, backend=backend, info=info,
                       save_tensors=save_tensors, math=run_math(math, devices))
    finally:
        eager.close()
    values = dict(capture.values)  # the kernel repro reads the buffers fed to the blamed kernel
    capture.values.clear()

    say("compare")
    t0 = time.perf_counter()
    summary, verdict = _compare(out, folder)
    seconds["compare"] = time.perf_counter() - t0
    repro = _kernel_repro(out, capture.graphs, summary, values, dynamo)
    values.clear()
    summary["compiled"] = {"backend": backend, "mode": mode, "graphs": len(capture.graphs),
                           "kernel_launches": pairing.kernels, "paired": len(pairing.pairs),
                           "unpaired": pairing.unpaired, "outputs_equal": outputs_equal, "eager_equal": eager_equal,
                           "seconds": {k: round(v, 4) for k, v in seconds.items()}, "repro": repro}
    write_text(out / SUMMARY, json.dumps(summary, indent=2, default=str) + "\n")
    (out / REPRO).unlink(missing_ok=True)  # a previous check's crash repro is not this one's
    return CompileCheckResult(out, summary, verdict, pairing.kernels, len(pairing.pairs), pairing.unpaired,
                              outputs_equal, eager_equal, seconds, plain)


def _crashed(error: Exception, capture: Capture, step: Step, out: Path, backend: str,
             mode: str | None) -> CompileCheckResult:
    """The compiled model failed: if eager runs, that is the result (crash.py): OUT/summary.json
    names the side, node and error, OUT/repro.py rebuilds the failing node alone."""
    from .crash import describe, summary, write_repro

    crash = describe(error, "compile" if capture.compile_failed else "run", capture.failed_node, capture.graphs)
    try:
        with torch.set_grad_enabled(step.backward):
            Step(step.model, step.model, step.args, step.kwargs, step.backward)()
    except Exception as e:  # noqa: BLE001 - not an inconsistency of the compiler
        raise CompileCheckError(f"the model fails in eager too, not only compiled ({crash.side}): "
                                f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                                ) from e
    out.mkdir(parents=True, exist_ok=True)
    mark_output(out, COMMAND)
    for stale in (CSV, HTML):  # a previous check's comparison is not this one's
        (out / stale).unlink(missing_ok=True)
    write_repro(out, capture.failed_node, capture.graphs, crash)
    s = summary(crash, backend, mode)
    write_text(out / SUMMARY, json.dumps(s, indent=2, default=str) + "\n")
    return CompileCheckResult(out, s, s["verdict"], 0, 0, crash=crash)


def _kernel_repro(out: Path, graphs: list, summary: dict[str, Any], values: dict,
                  dynamo: DynamoGraphs) -> str | None:
    """For a divergence born in a kernel, OUT/test_repro_<kernel>.py (kernel_repro.py); a previous
    check's repro files are removed."""
    from . import kernel_repro

    for stale in [*out.glob(f"{kernel_repro.PREFIX}*.py"), *out.glob(f"{kernel_repro.PREFIX}*.pt")]:
        stale.unlink()
    fd = summary.get("first_divergence") or {}
    if fd.get("origin") != "born" or not fd.get("kernel") or fd.get("graph") is None:
        return None
    graph = next((g for g in graphs if g.index == fd["graph"]), None)
    title = f"kernel {fd['kernel']} (graph {fd['graph']}, launch {fd.get('launch')}), where {fd.get('op')} in " \
            f"{fd.get('module') or '<root>'} diverges from eager"
    if graph is None:
        return None
    fed = next((args for index, args in dynamo.runs if index == graph.dynamo), None)
    return kernel_repro.write(out, graph, fd["launch"], fd["kernel"], title, values,
                              kernel_repro.graph_inputs(graph, fed or []))


def _found_in(own: list[torch.Tensor], reference: list[torch.Tensor]) -> bool:
    """Every tensor of the model's own eager output is bitwise one of the reference's outputs. A
    Dynamo graph also returns the state it updates (a KV cache, which the model's output may hold
    in an object whose tensors are not read), so the reference may hold more, in another order."""
    return len(own) <= len(reference) and all(
        any(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for b in reference) for a in own)


class Step:
    """One run of the compiled model: its outputs, and with ``backward`` the gradients a fixed
    random output gradient gives its parameters and inputs (the same gradient every run, so two
    runs' results compare bitwise)."""

    def __init__(self, compiled: Callable, model: torch.nn.Module, args: tuple, kwargs: dict, backward: bool) -> None:
        self.compiled, self.model, self.args, self.kwargs, self.backward = compiled, model, args, kwargs, backward
        self.seeds: list[torch.Tensor] | None = None

    def __call__(self) -> list[torch.Tensor]:
        outputs = flatten_tensors(self.compiled(*self.args, **self.kwargs))
        if not self.backward:
            return outputs
        live = [o for o in outputs if o.requires_grad and o.is_floating_point()]
        if self.seeds is None:
            g = torch.Generator().manual_seed(0)
            self.seeds = [torch.randn(o.shape, generator=g).to(o.dtype) for o in live]
        leaves = [p for p in self.model.parameters() if p.requires_grad] + \
            [a for a in flatten_tensors(self.args) if a.requires_grad]
        for p in leaves:
            p.grad = None
        if live:
            torch.autograd.backward(live, self.seeds)
        grads = [p.grad for p in leaves if p.grad is not None]
        for p in leaves:
            p.grad = None
        return [o.detach() for o in outputs] + grads


def kernel_table(graphs: list) -> list[dict[str, Any]]:
    """Every probed launch in call order: the kernel, the post-grad nodes it computes, the ATen
    ops they were traced from (``ops``) and are (``targets``), and the FX node each written
    buffer holds (None: none known)."""
    from .mapping import base_op

    rows = []
    for g in graphs:
        for launch in g.launches:
            nodes = g.fused.get(launch.index, [])
            ops = sorted({base_op(g.nodes[n].original_aten or g.nodes[n].target) for n in nodes if n in g.nodes})
            targets = sorted({base_op(g.nodes[n].target) for n in nodes if n in g.nodes})
            rows.append({"graph": g.index, "backward": g.backward, "launch": launch.index, "kernel": launch.kernel,
                         "nodes": nodes, "ops": ops, "targets": targets,
                         "buffers": {b: g.buffer_node.get(b) for b in launch.outputs}})
    return rows


def _compare(out: Path, compiled: Path) -> tuple[dict[str, Any], str]:
    """Compare's summary JSON (with the kernel named at the first divergence) and verdict line."""
    from ..compare import compare_dumps
    from ..compare.report import write_csv, write_html
    from ..dump import load_dump

    result = compare_dumps(out / "eager", compiled, progress=False)
    write_csv(result, out / CSV)
    write_html(result, out / HTML)
    summary = result.summary.to_json()
    fd = summary.get("first_divergence")
    if fd and fd.get("bench_seq") is not None:
        dump = load_dump(compiled)
        try:
            entries = ((dump.header.get("compiled") or {}).get("records") or {}).get(str(fd["bench_seq"])) or []
        finally:
            close = getattr(dump, "close", None)
            if callable(close):
                close()
        if entries:
            e = entries[0]
            fd.update(kernel=e["kernel"], kernel_ops=e["fused_ops"], kernel_nodes=e["fused_nodes"], node=e["node"],
                      buffer=e["buffer"], graph=e["graph"], launch=e["launch"])
    verdict = result.summary.verdict
    if fd and fd.get("kernel") and fd.get("origin") == "born":
        ops = ", ".join(op.split(".")[1] if op.startswith("aten.") else op for op in fd.get("kernel_ops") or [])
        verdict += f"; kernel {fd['kernel']} (launch {fd.get('launch')}, fused ops: {ops})"
        summary["verdict"] = verdict
    return summary, f"{result.summary.verdict_kind}: {verdict}"
