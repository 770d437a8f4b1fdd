"""xray-summary INPUT [OUTPUT]: a statistics table of a module dump (.h5), a folder of them
(one per rank), or a tracer dump (folder or dump.json)."""
from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path
from typing import Iterator

from ..console import closed_pipe_is_quiet


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xray-summary", description=__doc__,
                                epilog="examples:\n  xray-summary dumps/llama-module.h5 sum.txt --step 0 --match 'layers\\.0\\.'\n"
                                       "  xray-summary dumps/llama-fp32 --csv sum.csv",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="a module dump .h5, a folder of globalrank-*.h5 files, or a tracer dump")
    p.add_argument("output", nargs="?", help="also write the table (or, with --csv, the CSV) to this file")
    p.add_argument("--csv", action="store_true", help="write CSV instead of a table")
    p.add_argument("--step", help="steps to show: 1,4-6 (default: all)")
    p.add_argument("--rank", help="global ranks to show: 0,2-3 (default: all)")
    p.add_argument("--match", metavar="PATTERN", help="show tensors whose name matches this regular expression")
    p.add_argument("--allow-incomplete", action="store_true",
                   help="summarise a module dump whose writer never finished (default: refuse)")
    return p


def _inputs(path: Path) -> list[Path]:
    """A folder of per-rank module dumps expands to its files; anything else is one dump."""
    if path.is_dir():
        files = sorted(path.glob("globalrank-*.h5"))
        if files:
            return files
    return [path]


def _open(path: Path, allow_incomplete: bool):
    from ..dump import DumpFormatError, load_dump
    from ..dump.reader import TruncatedDumpWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TruncatedDumpWarning)
        dump = load_dump(path)
    for w in caught:
        if issubclass(w.category, TruncatedDumpWarning) and not allow_incomplete:
            dump.close()
            raise DumpFormatError(f"{w.message}; pass --allow-incomplete to summarise it anyway")
        print(f"xray-summary: warning: {w.message}", file=sys.stderr)
    return dump


def _steps(dump) -> set[int]:
    """The steps a dump holds: a module dump's step groups, a trace dump's record steps."""
    import numpy as np

    if hasattr(dump, "steps"):
        return set(dump.steps)
    from ..dump.column_scan import native_columns

    columns = native_columns(dump)
    if columns is not None:  # a v3 trace dump: its step column, not a million Records
        steps = columns.records["step"]
        return set(np.unique(steps[steps >= 0]).tolist())
    return {r.step for r in dump.records if r.step is not None}


def _spans(numbers: set[int]) -> str:
    """0,1,2,5 -> '0-2,5' (the --step syntax)."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and int(out[-1].rpartition("-")[2]) == n - 1:
            out[-1] = f"{out[-1].partition('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def _check_steps(selected: frozenset[int] | None, dumps: list) -> None:
    """Refuse a --step selection that matches no step (an empty table reads as "no tensors")."""
    if selected is None:
        return
    present = set().union(*(_steps(d) for d in dumps))
    missing = selected - present
    if missing == selected:
        from ..debugger.steps import SelectionError

        has = f"the dump has steps {_spans(present)}" if present else "the dump records no step numbers"
        raise SelectionError(f"--step {_spans(set(selected))}: no such step; {has}")
    if missing:
        print(f"xray-summary: warning: steps {_spans(set(missing))} are not in the dump "
              f"(it has {_spans(present)})", file=sys.stderr)


def _rows(dumps: list, args) -> Iterator:
    from ..debugger.steps import parse_selection
    from .table import dump_rows, filter_rows

    steps, ranks = parse_selection(args.step, "step"), parse_selection(args.rank, "rank")
    for dump in dumps:
        yield from filter_rows(dump_rows(dump), steps, ranks, args.match)


@closed_pipe_is_quiet
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from ..dump.atomic import atomic_write, write_text
    from ..quiet import one_line, quiet_third_party

    quiet_third_party()
    from ..progress import progress

    from ..debugger.steps import SelectionError, parse_selection
    from ..dump import DumpFormatError
    from .table import render_table, write_csv

    dumps: list = []
    try:
        if args.match:
            re.compile(args.match)
        steps = parse_selection(args.step, "step")
        parse_selection(args.rank, "rank")
        for p in _inputs(Path(args.input)):  # open (and validate) every input before writing anything
            dumps.append(_open(p, args.allow_incomplete))
        _check_steps(steps, dumps)
        rows = progress(_rows(dumps, args), desc="xray-summary", unit="tensors")
        if args.csv:
            if args.output:
                with atomic_write(args.output, newline="") as f:
                    n = write_csv(rows, f)
                print(f"xray-summary: wrote {n} rows to {args.output}", file=sys.stderr)
            else:
                write_csv(rows, sys.stdout)
            return 0
        text = render_table(rows)
        print(text)
        if args.output:
            write_text(args.output, text + "\n")
        return 0
    except BrokenPipeError:  # `xray-summary x.h5 | head`: an OSError, but the reader's, not ours
        raise
    except (DumpFormatError, SelectionError) as e:
        print(f"xray-summary: error: {one_line(e)}", file=sys.stderr)
    except re.error as e:
        print(f"xray-summary: error: --match {args.match!r} is not a regular expression ({e})", file=sys.stderr)
    except OSError as e:
        print(f"xray-summary: error: {e.filename or args.output}: {e.strerror or e}", file=sys.stderr)
    finally:
        for d in dumps:
            d.close()
    return 2


if __name__ == "__main__":
    sys.exit(main())
