"""``xray compile-check FACTORY``: where inside a torch.compile'd program it diverges from eager."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = ("Compile FACTORY's model with inductor, record the compiled run kernel by kernel (each generated kernel's "
        "and extern kernel's written buffers, the ATen nodes it fuses, their modules) and the same graphs in "
        "eager, compare the two with xray-compare's engine, and name the first divergence down to the kernel "
        "and its fused ops. Writes OUT/summary.json, OUT/compare.csv, OUT/report.html and both dumps. A compiled "
        "side that crashes where eager runs is the result: its side, FX node and error, and OUT/repro.py. "
        "See docs/compile.md.")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile-check", help="find where a torch.compile'd model diverges from eager, kernel by kernel",
                       description=HELP)
    p.add_argument("factory", metavar="FACTORY", help="pkg.module:function or path/to/file.py:function returning "
                                                      "(model, example_args[, example_kwargs])")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (only inductor today)")
    p.add_argument("--mode", default=None, help="torch.compile mode, e.g. max-autotune-no-cudagraphs")
    p.add_argument("--out", default="xray-compile", help="output folder (default: xray-compile)")
    p.add_argument("--backward", action="store_true",
                   help="also run a backward (fixed random output gradients) and check AOT autograd's compiled backward")
    p.add_argument("--statistics-only", action="store_true",
                   help="keep statistics of the compiled buffers, not the tensors (smaller dumps, coarser verdicts)")


def run(args: argparse.Namespace) -> int:
    from ..drift.load import ModelSpecError, load_model
    from ..dump.folder_owner import OutputFolderError
    from ..quiet import one_line
    from .check import BACKENDS, CompileCheckError, _check_out, compile_check

    try:
        if args.backend not in BACKENDS:
            raise CompileCheckError(f"backend {args.backend!r}: only {', '.join(BACKENDS)} is supported")
        _check_out(Path(args.out))
        model, margs, mkwargs = load_model(args.factory)
        result = compile_check(model, margs, mkwargs, args.out, backend=args.backend, mode=args.mode,
                               save_tensors=not args.statistics_only, backward=args.backward,
                               progress=lambda s: print(f"xray compile-check: {s}", file=sys.stderr, flush=True))
    except (ModelSpecError, CompileCheckError, OutputFolderError) as e:
        print(f"xray compile-check: {one_line(e)}", file=sys.stderr)
        return 2
    print(report(result))
    return 0


def report(result) -> str:
    """A few lines: what was probed and paired, the first divergence with its kernel, the verdict."""
    s, c = result.summary, result.summary.get("compiled", {})
    if result.crash is not None:
        k = result.crash
        lines = [f"crash: the {k.side} side fails where eager runs: {k.error}"]
        if k.node:
            where = f"; {k.stack_trace}" if k.stack_trace else ""
            lines.append(f"  node {k.node}: {k.op} in {k.module or '<root>'}{where}")
        if k.kernel:
            lines.append(f"  kernel call: {k.kernel}")
        repro = f", {k.repro} (exits 1 while it still fails)" if k.repro else ""
        lines.append(f"wrote {result.out}/summary.json{repro}")
        return "\n".join(lines)
    lines = [f"kernel launches probed: {result.kernels}; compiled buffers paired with an eager record: {result.paired}",
             f"pairs: pass / warning / fail / nan-inf / skip  {s.get('passed')} / {s.get('warned')} / "
             f"{s.get('failed')} / {s.get('nan_inf')} / {s.get('skipped')}"]
    if not c.get("outputs_equal", True):
        lines.append("WARNING: the recorded compiled run's outputs differ from its plain run's")
    fd = result.first
    if fd:
        lines.append(f"first divergence: {fd.get('op')} in {fd.get('module') or '<root>'} (eager record "
                     f"#{fd.get('bench_seq')}, {fd.get('origin')})")
        if fd.get("kernel"):
            lines.append(f"  kernel: {fd['kernel']} (launch {fd.get('launch')}), writes {fd.get('buffer')} = node "
                         f"{fd.get('node')}; fuses {', '.join(fd.get('kernel_ops') or [])}")
    if c.get("repro"):
        lines.append(f"  standalone test of that kernel: {result.out}/{c['repro']} (fails while it diverges)")
    lines.append(f"verdict: {result.verdict}")
    lines.append(f"wrote {result.out}/summary.json, compare.csv, report.html")
    return "\n".join(lines)
