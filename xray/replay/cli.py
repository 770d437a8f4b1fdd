"""``xray-replay``: replay a dump's ops (or modules) on deployment backends; write a support matrix.

    xray-replay DUMP --backend onnxrt-cpu --backend executorch-xnnpack --out replay/
    xray-replay --spec sweep.yaml --backend onnxrt-cpu --out replay/     (a declarative sweep)
    xray-replay --matrix matrix.yaml --out replay/     (flows x dtypes x shapes x quant x threads)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..console import closed_pipe_is_quiet


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xray-replay", description=__doc__.split("\n")[0],
                                epilog="example:\n  xray-replay dumps/llama-dedup --backend onnxrt-cpu --backend executorch-xnnpack "
                                       "--out replay/\n  xray-replay --spec common --backend onnxrt-cpu --out sweep/   (built-in sweep of common ops)"
                                       "\n\nBackend presets take overrides: onnxrt-cpu:opset=18, coreml:fp16=true. "
                                       "See --list-backends and docs/replay.md.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dump", nargs="?", help="trace dump folder (or its dump.json), or a PrecisionDebugger .h5")
    p.add_argument("--spec", metavar="SWEEP.yaml",
                   help="replay a declarative sweep of ops and torch.nn modules instead of a dump "
                        "('common': the built-in one); see docs/replay.md, Sweeps")
    p.add_argument("--max-cases", type=int, default=None, metavar="N",
                   help="with --spec: refuse a sweep that expands to more than N combinations (default 2000)")
    p.add_argument("--matrix", metavar="MATRIX.yaml",
                   help="a configuration matrix: flows (backend presets) x dtypes x shapes (static, batch, seq) "
                        "x quant (none, int8, int8-dynamic, int4) x threads; see docs/replay.md, Configuration matrix")
    p.add_argument("-b", "--backend", action="append", default=[], metavar="PRESET",
                   help="backend preset to replay on (repeatable)")
    p.add_argument("--baseline", default="torch-cpu", metavar="PRESET", help="reference backend (default torch-cpu)")
    p.add_argument("-o", "--out", default="replay", help="output folder (default ./replay)")
    p.add_argument("--factory", choices=("auto", "load", "random"), default="auto",
                   help="inputs: saved tensors (load), random from statistics (random), or saved where present (auto)")
    p.add_argument("--seed", type=int, default=0, help="seed of regenerated inputs")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per (op, backend) before it is TIMEOUT")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per op for the median latency")
    p.add_argument("--limit", type=int, default=None, help="replay at most N (de-duplicated) records")
    p.add_argument("--op", action="append", default=[], metavar="PATTERN",
                   help="only ops matching this glob or substring (repeatable), e.g. 'aten.mm*' or softmax")
    p.add_argument("--seq", type=int, action="append", default=[], metavar="N",
                   help="only the record with this sequence number (repeatable)")
    p.add_argument("--no-dedup", action="store_true", help="replay every record, not one per signature")
    p.add_argument("--no-cache", action="store_true", help="export every op again (ignore OUT/cache)")
    p.add_argument("--model", metavar="PKG.MODULE:FACTORY",
                   help="replay module records; the factory builds the model (called without arguments)")
    p.add_argument("--module", action="append", default=[], metavar="PATTERN",
                   help="with --model: only modules whose path matches this glob (repeatable); "
                        "with --spec: only combinations whose label matches, e.g. '*bfloat16*'")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="module every worker imports first, e.g. one registering custom ops (repeatable)")
    p.add_argument("--weights-as-inputs", action="store_true",
                   help="pass recorded parameters (requires_grad tensors) as inputs instead of constants")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per backend worker (default 1)")
    p.add_argument("--list-backends", action="store_true", help="print the backend presets and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    return p


@closed_pipe_is_quiet
def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    args = _parser().parse_args(argv)
    from ..quiet import one_line, quiet_third_party

    quiet_third_party()
    from tabulate import tabulate  # torch and the backends: only once a command runs

    from ..backends.registry import UnknownBackendError, describe, parse_spec

    if args.list_backends:
        print(tabulate(describe(), headers=["preset", "what"]))
        return 0
    matrix = None
    if args.matrix:
        from .configs import MatrixSpecError, load_matrix

        try:
            matrix = load_matrix(args.matrix)
        except MatrixSpecError as e:
            print(f"xray-replay: error: {one_line(e)}", file=sys.stderr)
            return 2
        args.backend = list(dict.fromkeys([*args.backend, *matrix.specs()]))
        if not args.dump and not args.spec:
            args.spec = matrix.sweep
        if matrix.dtypes and not args.spec:
            print(f"xray-replay: error: {one_line(args.matrix)}: 'dtypes' sets a sweep's dtypes; give a --spec "
                  "(or 'sweep:' in the matrix), or drop 'dtypes' to replay a dump at its recorded dtypes",
                  file=sys.stderr)
            return 2
    if bool(args.dump) == bool(args.spec):
        what = "give a dump or a --spec, not both" if args.dump else "give a dump to replay, or a --spec sweep"
        print(f"xray-replay: error: {what} (or --list-backends)", file=sys.stderr)
        return 2
    if args.spec and args.model:
        print("xray-replay: error: --model replays a dump's module records; a --spec builds its torch.nn "
              "modules itself (drop --model)", file=sys.stderr)
        return 2
    if not args.backend:
        print("xray-replay: error: give at least one --backend (see --list-backends)", file=sys.stderr)
        return 2
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        print(f"xray-replay: error: -o {one_line(args.out)} exists and is not a folder; pass a folder",
              file=sys.stderr)
        return 2
    from ..dump import DumpFormatError
    from .matrix import summary_table
    from .modules import ModelSpecError, factory_spec
    from .runner import ReplayConfig, ReplayInputError, replay_dump
    from .sweep import MAX_CASES, SweepError, replay_sweep

    try:
        for spec in [args.baseline, *args.backend]:
            parse_spec(spec)
        model = factory_spec(args.model) if args.model else None
        cfg = ReplayConfig(backends=args.backend, out=Path(args.out), baseline=args.baseline, factory=args.factory,
                           seed=args.seed, timeout=args.timeout, repeats=args.repeats, limit=args.limit, ops=args.op,
                           seqs=args.seq,
                           dedup=not args.no_dedup, cache=not args.no_cache, model=model, modules=args.module,
                           threads=args.threads, imports=args.imports,
                           weights_const=not args.weights_as_inputs, progress=not args.quiet)
        if args.spec:
            sweep, result = replay_sweep(args.spec, cfg, max_cases=args.max_cases or MAX_CASES,
                                         dtypes=matrix.dtypes if matrix else None)
        else:
            result = replay_dump(args.dump, cfg)
    except (UnknownBackendError, DumpFormatError, ReplayInputError, ModelSpecError, SweepError) as e:
        print(f"xray-replay: error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, an unwritable --out (DumpWriteError, OutputWriteError...)
        print(f"xray-replay: error: {one_line(e)}", file=sys.stderr)
        return 1
    if args.spec:
        print(f"sweep {sweep.name}: {len(sweep.cases)} combinations from {sweep.entries} entries"
              + (f"; {len(sweep.left_out)} left out (shapes that do not fit), first: {sweep.left_out[0][:200]}"
                 if sweep.left_out else ""))
    print(summary_table(result))
    out = Path(args.out)
    print(f"\nmatrix: {out / 'matrix.csv'}, {out / 'matrix.html'}  heatmap: {out / 'heatmap.png'}, "
          f"{out / 'heatmap.html'}")
    print("replay dumps (open with xray-compare): " + ", ".join(str(p) for p in result.dumps.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
