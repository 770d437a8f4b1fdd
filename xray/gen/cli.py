"""``xray-gen``: turn a dump into a portable pytest suite (one test per distinct op signature)."""
from __future__ import annotations

import argparse
import sys
import warnings

from ..console import closed_pipe_is_quiet


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xray-gen",
        description="Generate de-duplicated pytest unit tests, one per distinct (op, argument signature), "
                    "from an xray dump. Run them with: pytest OUT --device cpu --detail_compare_path=result.csv",
        epilog="example:\n  xray-gen dumps/llama-dedup/dump.json -o pytests/\n"
               "  pytest pytests/ --device cpu --seed 42 --detail_compare_path=./result.csv\n\n"
               "The output folder gets a conftest.py that loads xray's pytest plugin (those options) for it only.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dump", help="dump.json, its folder, or a dump_dir holding one process folder")
    p.add_argument("-o", "--output", default="pytests", help="output folder (default: pytests/)")
    p.add_argument("--factory", choices=("load", "random", "auto"), default="auto",
                   help="inputs: load = the saved tensors (error if one is missing), random = from the recorded "
                        "statistics, auto = saved where available, else random (default)")
    p.add_argument("--cpu-init", action="store_true",
                   help="build random inputs on CPU and move them to the device, so two devices see identical "
                        "inputs (saved tensors are always loaded on CPU)")
    p.add_argument("--seed", type=int, default=0, help="default seed written into the tests (pytest --seed overrides)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--blacklist", metavar="FILE", help="fnmatch patterns of op names to skip (replaces the default)")
    g.add_argument("--no-blacklist", action="store_true", help="generate tests for every op")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary table")
    return p


class NoOpRecordsError(ValueError):
    """The dump holds no ATen op record, so there is nothing to generate tests from."""


def _has_op_records(dump) -> bool:
    """Whether the dump holds an op record: on a v3 dump's kind column, else its records."""
    from ..dump.column_scan import native_columns

    columns = native_columns(dump)
    if columns is not None:
        return len(columns.select(kind="op")) > 0
    return any(r.kind == "op" for r in dump.records)


def _require_op_records(dump, path: str) -> None:
    if _has_op_records(dump):
        return
    if getattr(dump, "format", None) == "xray-module":
        raise NoOpRecordsError(
            f"{path} is a module-level dump (PrecisionDebugger) with no ATen op records; xray-gen makes one test "
            "per op call: pass a trace dump (xray.begin_dump()/end_dump() or `xray record`: its folder or "
            "dump.json), or dump with PrecisionDebugger(..., dump_torch_api=True)")
    raise NoOpRecordsError(f"{path} holds no ATen op records; record with the X_DEBUG default 0x102 "
                           "(META|STATS) and pass that dump")


@closed_pipe_is_quiet
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from ..quiet import one_line, quiet_third_party

    quiet_third_party()
    from tabulate import tabulate  # torch and h5py come in with the dump: only once a command runs
    from ..progress import progress

    from ..dump import DumpFormatError, load_dump
    from ..ops.rebuild import MissingTensorError
    from .blacklist import DEFAULT_BLACKLIST, Blacklist
    from .generator import GenerationError, generate

    try:
        blacklist = Blacklist.load(None if args.no_blacklist else (args.blacklist or DEFAULT_BLACKLIST))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dump = load_dump(args.dump)
        for w in caught:
            print(f"xray-gen: warning: {w.message}", file=sys.stderr)
        _require_op_records(dump, args.dump)
        bar = progress(unit="test", desc="xray-gen", enabled=not args.quiet)
        try:
            report = generate(dump, args.output, factory=args.factory, cpu_init=args.cpu_init, seed=args.seed,
                              blacklist=blacklist, progress=bar.update)
        finally:
            bar.close()
            close = getattr(dump, "close", None)
            if close is not None:
                close()
    except (MissingTensorError, DumpFormatError, NoOpRecordsError) as e:  # these name the file already
        print(f"xray-gen: error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"xray-gen: error: {e.filename or args.dump}: {e.strerror or e}", file=sys.stderr)
        return 2
    except (GenerationError, ValueError) as e:
        print(f"xray-gen: error: {args.dump}: {one_line(e)}", file=sys.stderr)
        return 2
    if not args.quiet:
        rows = [["records in dump", report.records], ["op records", report.op_records],
                ["op calls they stand for", report.calls],
                *[[f"skipped: {k}", v] for k, v in sorted(report.skipped.items())],
                ["generated tests (distinct signatures)", report.tests], ["test files", report.files],
                ["saved tensors copied", report.tensors_copied], ["inputs from statistics", report.random_inputs],
                ["seconds", f"{report.seconds:.2f}"]]
        print(tabulate(rows, tablefmt="simple"))
    print(f"xray-gen: {report.op_records - report.skipped.get('blacklisted', 0)} op records collapsed into "
          f"{report.tests} tests in {report.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
