"""``xray-compare bench target out.csv``: diff two dumps; bench is the trusted side.

Exit status: 0 when the compare ran (whatever it found), 2 when an input is unusable.
"""
from __future__ import annotations

import argparse
import sys

from ..console import closed_pipe_is_quiet
from ..numerics.rules import Rules, parse_tolerance_arg
from .result import ATTRIBUTED


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xray-compare", description=__doc__.splitlines()[0],
                                epilog="example:\n  xray-compare dumps/llama-fp32 dumps/llama-bf16-fault out.csv --html report.html "
                                       "--summary-json summary.json\n\nStatuses, rules and CSV columns: docs/compare.md",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", help="trusted dump: trace folder, dump.json, module-level .h5, or multi-rank folder")
    p.add_argument("target", help="dump to check, of the same kind")
    p.add_argument("out_csv", help="one row per compared tensor pair")
    p.add_argument("--summary-json", metavar="FILE", help="totals and first_divergence as JSON")
    p.add_argument("--html", metavar="FILE", help="self-contained report with an error plot")
    p.add_argument("--tests", metavar="DIR", help="an xray-gen folder: the report's rows link to their op's tests")
    p.add_argument("--reference", metavar="DUMP", help="float64 run of the bench: a pair that is not all-close "
                   "passes when its error is within --fp64-multiplier x the bench's own (torch._dynamo's rule)")
    p.add_argument("--tol", action="append", default=[], metavar="DTYPE:rtol=R,atol=A",
                   help="override a dtype's tolerance (repeatable), e.g. bfloat16:rtol=0.02,atol=1e-4")
    p.add_argument("--warn-cosine", type=float, default=Rules.warn_cosine,
                   help="warning (precision loss), not fail, needs at least this cosine (default %(default)s)")
    p.add_argument("--stats-warn-factor", type=float, default=Rules.stats_warn_factor,
                   help="statistics-only: warning up to this multiple of the tolerance (default %(default)s)")
    p.add_argument("--fp64-multiplier", type=float, default=Rules.fp64_multiplier,
                   help="with --reference: a pair passes when its error against the float64 run is at most this "
                        "multiple of the bench's own error against it (default %(default)s)")
    p.add_argument("--statistics-only", action="store_true",
                   help="judge every pair on its statistics, leaving saved tensors unread: what a statistics-only "
                        "recording of the same runs would be told (the cheap recording on a device), and faster")
    p.add_argument("--tf32", choices=("auto", "on", "off"), default="auto",
                   help="may the target's fp32 matmuls and convolutions round their inputs to TF32 (or an NPU's "
                        "HF32)? auto: what its dump's header recorded; on/off: declared, for a switch xray cannot "
                        "read (a vendor library's, NVIDIA_TF32_OVERRIDE set outside the program, an emulator)")
    p.add_argument("--ignore-step", action="store_true",
                   help="pair the two dumps' steps in order, whatever their numbers (a run dumped at step 0 "
                        "against one dumped at step 3); records otherwise pair only within one step")
    p.add_argument("--attribute-all", action="store_true",
                   help="attribute (origin, cause, culprit) every failing row, not only the first "
                        f"{ATTRIBUTED} in execution order: slower where most rows fail (the verdict is the same)")
    p.add_argument("--worst", type=int, default=10, help="rows in the terminal's worst-rows table")
    p.add_argument("--threads", type=int, default=1, help="torch threads while comparing (default %(default)s; "
                   "0 keeps torch's setting)")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    return p


def rules_from_args(args: argparse.Namespace) -> Rules:
    """The Rules the compare options ask for (ValueError on a bad --tol): one reading for
    xray-compare and python -m xray.compare."""
    rules = Rules(warn_cosine=args.warn_cosine, stats_warn_factor=args.stats_warn_factor,
                  fp64_multiplier=args.fp64_multiplier, tf32={"auto": None, "on": True, "off": False}[args.tf32])
    for text in args.tol:
        rules = rules.with_override(*parse_tolerance_arg(text))
    return rules


def compare_options(args: argparse.Namespace) -> dict:
    """``compare_dumps``'s keyword arguments that xray-compare's options give (rules apart:
    ``rules_from_args``): one reading for xray-compare and python -m xray.compare."""
    return dict(reference=args.reference, threads=args.threads or None, statistics_only=args.statistics_only,
                ignore_step=args.ignore_step, attribute_first=None if args.attribute_all else ATTRIBUTED,
                progress=False if args.no_progress else None)


@closed_pipe_is_quiet
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..quiet import one_line, quiet_third_party

    quiet_third_party()
    from . import CompareInputError, compare_dumps  # torch and h5py: only once a compare runs
    from .report import terminal_report, write_csv, write_html, write_summary_json

    from ..dump.atomic import check_writable

    try:
        rules = rules_from_args(args)
        check_writable(args.out_csv, args.summary_json, args.html)
        result = compare_dumps(args.bench, args.target, rules=rules, **compare_options(args))
        write_csv(result, args.out_csv)
        if args.summary_json:
            write_summary_json(result, args.summary_json)
        if args.html:
            write_html(result, args.html, tests=args.tests)
    except (CompareInputError, ValueError) as e:
        print(f"xray-compare: error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:
        from ..quiet import os_error_line

        print(f"xray-compare: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    print(terminal_report(result, args.worst))
    print(f"\nwrote {args.out_csv}" + "".join(f", {p}" for p in (args.summary_json, args.html) if p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
