"""``xray explain FACTORY --target SPEC`` and ``xray fix FACTORY --target SPEC --max-error E``."""
from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

FACTORY_HELP = ("pkg.module:function or path/to/file.py:function returning (model, example_args[, example_kwargs]) "
                "(as xray drift's MODEL)")
SPEC_HELP = "device[:mode], mode one of fp32 bf16 fp16 tf32 bf16-cast fp16-cast (e.g. cpu:bf16, cuda:tf32)"


def add_parsers(sub) -> None:
    ex = sub.add_parser("explain", help="how much of the final error each module and op explains",
                        description="Run FACTORY's model on --bench and --target, then rerun the target with the "
                                    "bench's values grafted in, module by module and then call by call inside the "
                                    "worst modules, and measure how much of the final output's error each graft "
                                    "removes. Writes explain.json and explain.html into --out. docs/explain.md.")
    _common(ex)
    ex.add_argument("--out", default="xray-explain", help="output folder (default: xray-explain)")
    ex.add_argument("--op-modules", type=int, default=3, help="op-level grafts inside this many top modules (0: none)")
    ex.add_argument("--top", type=int, default=10, help="rows per terminal table (default 10)")
    ex.add_argument("--search", choices=("all", "tree"), default="all",
                    help="all: measure every module (about 5 forwards each); tree: the top-level modules first, "
                         "descending only where a module makes most of its parent's share (deep models)")
    fx = sub.add_parser("fix", help="the fewest modules to keep in fp32 for the final error to fall under a bound",
                        description="Rank modules as explain does, bisect for the fewest fp32 islands (autocast off, "
                                    "float32 weights and inputs) whose run brings the final error under --max-error, "
                                    "and print ready-to-paste code with the error before and after.")
    _common(fx)
    fx.add_argument("--max-error", type=float, required=True, help="bound on the final normwise relative error")
    fx.add_argument("--out", default=None, help="also write fix.json and fix.py into this folder")


def _common(p) -> None:
    p.add_argument("factory", help=FACTORY_HELP)
    p.add_argument("--target", required=True, help=SPEC_HELP)
    p.add_argument("--bench", default="cpu", help="the trusted run's SPEC (default: cpu, i.e. fp32)")
    p.add_argument("--inject", default=None, metavar="OP#CALL+OFFSET",
                   help="rehearsal: make one call of the target wrong, e.g. aten.mm.default#5+0.05 or ...#5*1.01")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads meanwhile (0: torch's setting)")


def parse_inject(text: str | None):
    """``aten.mm.default#5+0.05`` -> a callable returning a fresh InjectFault (None for None)."""
    if not text:
        return None
    m = re.fullmatch(r"([\w.]+)#(\d+)([+*])([-+0-9.eE]+)", text.strip())
    if not m:
        raise ValueError(f"--inject {text!r}: write OP#CALL+OFFSET or OP#CALL*SCALE, e.g. aten.mm.default#5+0.05")
    from ..demo.inject import FaultSpec, InjectFault

    op, call, how, value = m.group(1), int(m.group(2)), m.group(3), float(m.group(4))
    spec = FaultSpec(op=op, call=call, scale=value if how == "*" else 1.0, offset=value if how == "+" else 0.0)
    return lambda: InjectFault(spec)


def _check_out(out: str | None) -> None:
    """Refuse an --out that cannot be a folder now, before minutes of analysis."""
    if out is not None and os.path.lexists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} exists and is not a folder; pass a folder")


def _check_arguments(args) -> None:
    """Everything the command line alone can get wrong, refused before the factory builds a model."""
    from .spec import check_available, parse_spec

    for flag in ("op_modules", "top", "threads"):
        value = getattr(args, flag, None)
        if value is not None and value < 0:
            raise ValueError(f"--{flag.replace('_', '-')} {value}: give a count >= 0")
    for flag in ("bench", "target"):
        check_available(parse_spec(getattr(args, flag)))
    parse_inject(args.inject)
    _check_out(args.out)


def _load(args):
    import torch

    from ..drift.load import load_model

    model, margs, mkwargs = load_model(args.factory)
    if not isinstance(model, torch.nn.Module):  # e.g. (function, args): grafts need modules
        raise ValueError(f"{args.factory} returned a {type(model).__name__} as the model; explain and fix "
                         "need (torch.nn.Module, example_args[, example_kwargs])")
    options = dict(target=args.target, bench=args.bench, target_context=parse_inject(args.inject),
                   threads=args.threads or None)
    return model, margs, mkwargs, options


def run_explain(args) -> int:
    from . import report
    from .analysis import explain

    try:
        _check_arguments(args)
        model, margs, mkwargs, options = _load(args)
        x = explain(model, margs, mkwargs, op_modules=args.op_modules, search=args.search, **options)
    except ValueError as e:
        return _refuse("explain", e)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(x, out / "explain.json")
    report.write_html(x, out / "explain.html")
    print(report.terminal(x, args.top))
    print(f"\nxray explain: {out / 'explain.json'}, {out / 'explain.html'}", file=sys.stderr)
    return 0


def run_fix(args) -> int:
    from . import report
    from .search import fix

    try:
        if not (math.isfinite(args.max_error) and args.max_error > 0):
            raise ValueError(f"--max-error {args.max_error}: give a positive finite bound on the relative error, "
                             "e.g. 1e-2")
        _check_arguments(args)
        model, margs, mkwargs, options = _load(args)
        f = fix(model, margs, mkwargs, max_error=args.max_error, **options)
    except ValueError as e:
        return _refuse("fix", e)
    print(report.fix_text(f))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report.write_fix_json(f, out / "fix.json")
        if f.code:
            (out / "fix.py").write_text(f.code)
        if f.op_code:
            (out / "fix_ops.py").write_text(f.op_code)
    return 0 if f.found else 1


def _refuse(cmd: str, e: Exception) -> int:
    from ..quiet import one_line

    print(f"xray {cmd}: {one_line(e)}", file=sys.stderr)
    return 2
