"""The ``xray`` command: ``xray demo``, ``xray record script.py``, ``xray info DUMP``, ``xray drift MODEL``."""
from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import threading
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .console import closed_pipe_is_quiet

EXAMPLES = """examples:
  xray demo --out xray-demo                 # the whole workflow on a small real Llama
  xray record -o dumps/run -- train.py --lr 1e-3   # dump a script without editing it
  xray info xray_debug/proc_1234            # what a dump holds
  xray drift xray.drift.examples:tiny_llama -b onnxrt-cpu -b torch-compile --out drift/
  xray explain xray.explain.examples:demo_llama --target cpu:bf16 --inject aten.mm.default#5+0.05
  xray compile-check xray.drift.examples:tiny_llama --out compile-check/
  xray fix xray.explain.examples:t5_fp16_overflow --target cpu:fp16 --max-error 1e-2
"""


def _info(path: str, top: int) -> int:
    from .dump import DumpFormatError, load_dump

    try:  # a version-3 index is read (and checked) on first use: inside info_text
        dump = load_dump(path)
        text = info_text(dump, top)
    except DumpFormatError as e:
        print(f"xray info: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0


def info_text(dump, top: int = 15) -> str:
    """A short human summary of a dump: what was recorded, top ops, where non-finite values are."""
    from tabulate import tabulate

    from .dump.column_scan import native_columns
    from .dump.model import printable

    columns = native_columns(dump)
    n_ops, calls, first = _op_calls(dump) if columns is None else _op_calls_columns(columns)
    lines = [f"{dump!r}",
             f"records: {len(dump.records)} ({n_ops} op records covering {sum(calls.values())} calls, "
             f"{len(dump.records) - n_ops} module records), distinct ops: {len(calls)}"]
    program = (getattr(dump, "summary", None) or {}).get("program")
    if isinstance(program, dict) and program.get("failure"):
        lines.append(f"INCOMPLETE RUN: the recorded script {program.get('script')} {program['failure']}; "
                     "the records stop there")
    if first is not None:
        lines.append(f"first NaN/Inf output: #{first.seq} {first.op} in {first.module or '<no module>'}")
    lines.append(tabulate(calls.most_common(top), headers=["op", "calls"], tablefmt="github"))
    if columns is not None and (len(columns.folds) or columns.folds_refused or columns.folds_problem):
        lines.append(f"de-dup folds: {len(columns.folds)} calls with no record of their own keep their record and "
                     "first argument's producer" + (f"; {columns.folds_refused} fold rows refused at load"
                                                     if columns.folds_refused else "")
                     + (f"; folds table left out at load: {columns.folds_problem}" if columns.folds_problem else ""))
    refused = getattr(dump, "refused", [])
    if refused:  # the validator left these out; everything above is the rest of the dump
        lines.append(f"refused records: {len(refused)} (left out at load; the rest opened)")
        lines.append(tabulate([(x.row, x.seq, x.op or "?", x.reason) for x in refused],
                              headers=["row", "seq", "op", "why"], tablefmt="github"))
    return printable("\n".join(lines), keep="\n")  # module and op names come from the dump


def _op_calls(dump) -> tuple[int, Counter, object]:
    """(op records, calls per op in order of first record, the first record with a NaN/Inf
    output or None), from the records."""
    ops = [r for r in dump.records if r.kind == "op"]
    calls = Counter()
    for r in ops:
        calls[r.op] += r.count
    nonfinite = (r for r in dump.records for _, m in r.output_tensors() if m.stats and not m.stats.finite)
    return len(ops), calls, next(nonfinite, None)


def _op_calls_columns(columns) -> tuple[int, Counter, object]:
    """``_op_calls`` of a columnar index: counts summed per op name with numpy, one Record built."""
    import numpy as np

    from .dump.column_scan import check_records, op_call_counts
    from .dump.columns import OUTPUT

    check_records(columns)
    t = columns.tensors
    calls = op_call_counts(columns)
    # outputs by the role column, as summary reads them (load_dump has checked it against the skeletons)
    bad = (t["role"] == OUTPUT) & (t["has_stats"] != 0) & ((t["nan"] > 0) | (t["posinf"] > 0) | (t["neginf"] > 0))
    hit = np.flatnonzero(bad)
    return len(columns.select(kind="op")), calls, columns.record(int(t["record"][hit[0]])) if len(hit) else None


class _Stopped(BaseException):
    """SIGTERM or SIGHUP arrived while ``xray record`` ran the script."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP, left at their defaults, kill the process with no finally block run
    and no dump.json written: while the script runs they raise ``_Stopped`` instead (once;
    a repeat while the dump is written is ignored). A script's own handlers stay its own."""
    def stop(signum, frame):
        for sig in saved:
            signal.signal(sig, signal.SIG_IGN)
        raise _Stopped(signum)

    saved = {}
    if threading.current_thread() is threading.main_thread():
        for name in ("SIGTERM", "SIGHUP"):
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
                saved[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if signal.getsignal(sig) is stop:
                signal.signal(sig, handler)


def _record(args) -> int:
    """Run the script as ``python script.py`` (or ``python -m``) would, recorded. A script that
    raises or exits non-zero is reported, the dump's summary says how the program ended, and
    xray exits with the script's status: a partial dump is never announced as a finished run.
    SIGTERM or SIGHUP ends the script, writes the dump, then ends xray by the same signal."""
    from .record import begin_dump, end_dump, mark_program

    script, *script_args = args.script
    if not args.module and not Path(script).is_file():
        print(f"xray record: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = [script, *script_args]
    # python puts the script's folder first on sys.path (the current folder for -m)
    sys.path.insert(0, os.getcwd() if args.module else str(Path(script).resolve().parent))
    folder = begin_dump(args.debug, None if args.dedup is None else args.dedup == "1", args.dump_num, args.output)
    status, failure, stopped = 0, None, None
    try:
        with _stop_signals_raise():
            if args.module:
                runpy.run_module(script, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(script, run_name="__main__")
    except _Stopped as e:
        stopped = e.signum
        status, failure = 128 + e.signum, f"was stopped by {signal.Signals(e.signum).name}"
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if status:
            failure = f"exited with status {status}"
    except BaseException as e:  # noqa: BLE001 - the script's own error: shown as python would show it
        import traceback

        traceback.print_exc()
        status, failure = 1, f"raised {type(e).__name__}: {e}"
    finally:
        if folder is not None:
            mark_program(script, status, failure)
            folder = end_dump()
    if folder is None:
        return status
    if failure is None:
        print(f"xray: dump written to {folder}", file=sys.stderr)
    else:
        from .quiet import one_line

        print(f"xray record: the script {one_line(failure, 300)}; the dump in {folder} holds only what ran "
              "before that (its summary says so)", file=sys.stderr)
    if stopped is not None:  # end as the signal would have ended the script
        sys.stderr.flush()
        signal.signal(stopped, signal.SIG_DFL)
        os.kill(os.getpid(), stopped)
    return status


def _export_json(args) -> int:
    from .dump import DumpFormatError, load_dump
    from .dump.json_index import ExportTargetError, export_target, write_json_index

    try:
        export_target(args.output)  # refused before the dump is read
        with load_dump(args.dump) as dump:
            out = write_json_index(dump, args.output)
    except (DumpFormatError, ExportTargetError) as e:
        print(f"xray export-json: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        from .quiet import os_error_line

        print(f"xray export-json: {os_error_line(e, args.output)}", file=sys.stderr)
        return 2
    print(f"xray: {out}", file=sys.stderr)
    return 0


def _drift(args) -> int:
    from .backends.registry import UnknownBackendError
    from .drift.keep_float import SuggestError, check_request
    from .drift.load import ModelSpecError, load_model
    from .drift.reference import ReferenceError
    from .drift.report import terminal_report
    from .drift.run import check_outputs, drift
    from .dump.folder_owner import OutputFolderError
    from .quiet import one_line

    try:
        from .backends.registry import parse_spec

        for name in args.backend or []:  # refused before the model is even built
            parse_spec(name)
        check_request(args.backend or ["onnxrt-cpu"], args.suggest_float, args.target_sqnr)
        check_outputs(Path(args.out), args.backend or ["onnxrt-cpu"])
        model, margs, mkwargs = load_model(args.model)
        result = drift(model, margs, args.backend or ["onnxrt-cpu"], Path(args.out), kwargs=mkwargs,
                       progress=lambda s: print(f"xray drift: {s}", file=sys.stderr, flush=True),
                       suggest_float=args.suggest_float, target_sqnr=args.target_sqnr)
    except (ModelSpecError, ReferenceError, UnknownBackendError, OutputFolderError, SuggestError) as e:
        print(f"xray drift: {one_line(e)}", file=sys.stderr)
        return 2
    print(terminal_report(result, layers=not args.no_layers))
    return 0


@closed_pipe_is_quiet
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="xray", description="Operator-level precision debugging for PyTorch.",
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="run the whole workflow on a small real model",
                          description="Record a 2-layer Llama (random weights) on CPU fp32 and on a simulated target "
                                      "device (bf16 autocast plus one broken matmul call), compare the two dumps, "
                                      "generate and run op tests, replay ops on ONNX Runtime and ExecuTorch, and "
                                      "write everything with an index.html into --out. Takes a few minutes on CPU.")
    demo.add_argument("--out", default="xray-demo", help="output folder (default: xray-demo)")
    demo.add_argument("--small", action="store_true", help="a smaller model and fewer steps (used by the tests)")
    demo.add_argument("--no-replay", action="store_true", help="skip the backend replay step")
    rec = sub.add_parser("record", help="run a Python script with every ATen call recorded",
                         description="Run a Python script (or -m module) unchanged, with every ATen call recorded "
                                     "into a trace dump. Settings default to the X_* environment variables.")
    rec.add_argument("-o", "--output", default=None, help="dump dir (default: X_DUMP_DIR or ./xray_debug)")
    rec.add_argument("--debug", type=lambda s: int(s, 0), default=None, help="X_DEBUG bit mask, e.g. 0x102")
    rec.add_argument("--dedup", choices=["0", "1"], default=None, help="X_DEDUP")
    rec.add_argument("--dump-num", type=int, default=None, help="X_DUMP_NUM")
    rec.add_argument("-m", dest="module", action="store_true", help="SCRIPT is a module name (like python -m)")
    rec.add_argument("script", nargs=argparse.REMAINDER, help="script.py [args...]")
    info = sub.add_parser("info", help="summarise a dump",
                          description="What a dump holds: record counts, the most called ops, the first NaN/Inf "
                                      "output.")
    info.add_argument("dump", help="trace dump folder, its dump.json, or a module-level .h5")
    info.add_argument("--top", type=int, default=15, help="how many ops to list, most called first (default 15)")
    export = sub.add_parser("export-json", help="write a dump's records as readable JSON",
                            description="Write every record of a dump as one JSON object (the format-version-2 "
                                        "dump.json layout, docs/format.md), for people, jq and diffs. The dump "
                                        "itself is left as it is.")
    export.add_argument("dump", help="trace dump folder, its dump.json, or a module-level .h5")
    export.add_argument("-o", "--output", required=True, help="the JSON file to write")
    drift = sub.add_parser("drift", help="run a whole model on deployment backends and find where it drifts",
                           description="Export MODEL once (torch.export, core ATen), record that program in eager, "
                                       "run it whole on each backend capturing every intermediate the backend "
                                       "exposes, write each run as a trace dump, and name per backend the first "
                                       "drifting layer with its local error (recomputed on the backend's own "
                                       "inputs) beside its accumulated error (vs eager). See docs/drift.md.")
    drift.add_argument("model", help="pkg.module:function or path/to/file.py:function returning "
                                     "(model, example_args[, example_kwargs])")
    drift.add_argument("-b", "--backend", action="append", default=None,
                       help="backend preset, repeatable (default onnxrt-cpu); name:key=value overrides options")
    drift.add_argument("--out", default="xray-drift", help="output folder (default: xray-drift)")
    drift.add_argument("--no-layers", action="store_true", help="print the backend table only, no per-layer tables")
    drift.add_argument("--suggest-float", action="store_true",
                       help="quantized backends: the fewest layers to keep in float for no layer to be beyond the "
                            "scheme (or for --target-sqnr), each candidate set verified by a run")
    drift.add_argument("--target-sqnr", type=float, default=None, metavar="DB",
                       help="with --suggest-float: every output's SQNR against float eager must reach DB")
    cross = sub.add_parser("cross-rank", help="check that what must agree across a run's ranks does",
                           description="Within one multi-rank run, compare across ranks the values that must agree "
                                       "(all-reduce, broadcast and all-gather results, replicated DTensors) and name "
                                       "the first op and rank that disagree. Exit status 1 when ranks disagree. "
                                       "See docs/distributed.md.")
    cross.add_argument("run", help="the run's folder of rank_<r>/ dumps")
    from .explain import cli as explain_cli
    from .compiled import cli as compiled_cli

    explain_cli.add_parsers(sub)
    compiled_cli.add_parser(sub)
    args = ap.parse_args(argv)
    from .quiet import quiet_third_party

    quiet_third_party()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # a recorded script's transformers too
    if args.cmd == "demo":
        from .demo_command import run_demo

        return run_demo(Path(args.out), small=args.small, replay=not args.no_replay)
    if args.cmd == "drift":
        return _drift(args)
    if args.cmd == "compile-check":
        from .compiled import cli as compiled_cli

        return compiled_cli.run(args)
    if args.cmd in ("explain", "fix"):
        from .explain import cli as explain_cli

        return explain_cli.run_explain(args) if args.cmd == "explain" else explain_cli.run_fix(args)
    if args.cmd == "cross-rank":
        from .compare import cross_rank

        return cross_rank.run(args.run)
    if args.cmd == "export-json":
        return _export_json(args)
    if args.cmd == "record":
        if args.script and args.script[0] == "--":
            args.script = args.script[1:]
        if not args.script:
            ap.error("record needs a script to run")
        return _record(args)
    return _info(args.dump, args.top)


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.exit(main())
