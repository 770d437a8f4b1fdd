"""Benchmark the tools that read a whole trace dump (issue 21): xray-summary, xray-gen, ``xray info``
and replay's record selection on a big synthetic format-v3 dump, beside the dump's raw open.

The dump is tools/bench_bigdump.py's 7B-shaped stats-only trace (its ``Model`` written with xray's
DumpWriter, forward steps only), one rank, ``--records`` records (default 200,000). Each tool runs end to end through
its command's ``main`` (opening the dump itself), output to a file; "raw open" is ``load_dump``
plus reading the columns, the floor every tool pays.

    python tools/bench_summary.py [--records 200000] [--json out.json] [--keep]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_bigdump import Model  # (the same 7B-shaped model)


class ForwardModel(Model):
    """Forward steps only: bench_bigdump's synthetic backward records pass ``grad_output`` to
    ops whose schema has no such argument, which xray-gen rightly refuses to render."""

    def backward(self) -> None:
        self.tape = []


def write_dump(folder: Path, records: int) -> None:
    """One rank of ``records`` forward records, written by xray's DumpWriter (format v3)."""
    from xray.dump.writer import DumpWriter

    writer = DumpWriter(folder, {"pid": os.getpid(), "rank": 0, "config": {
        "X_DEBUG": 0x10A, "X_DEDUP": False, "X_DUMP_NUM": 0, "flags": ["STATS", "MODULES", "META"]}})
    ForwardModel(writer, 0, records, target=False, inject=None).run()
    writer.close({"op_calls": records, "records": records, "tensors_saved": 0, "seconds": 0.0, "error": None})


def _timed(fn) -> float:
    """Seconds ``fn`` takes, its stdout and stderr discarded (progress bars, tables)."""
    sink = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        rc = fn()
    seconds = time.perf_counter() - t0
    if rc not in (None, 0):
        raise SystemExit(f"{fn.__name__} failed ({rc}): {sink.getvalue()[-2000:]}")
    return seconds


def measure(folder: Path, out: Path) -> dict[str, float]:
    """Seconds of each tool on the dump in ``folder`` (outputs under ``out``)."""
    import xray
    from xray.cli import main as xray_main
    from xray.gen.cli import main as gen_main
    from xray.replay.runner import ReplayConfig, select_records
    from xray.summary.cli import main as summary_main

    def raw_open():
        dump = xray.load_dump(folder)
        len(dump.columns)  # the tables are read on first use

    def summary_table():
        return summary_main([str(folder), str(out / "summary.txt")])

    def summary_csv():
        return summary_main([str(folder), str(out / "summary.csv"), "--csv"])

    from xray.gen.blacklist import DEFAULT_BLACKLIST

    blacklist = out / "blacklist.txt"  # the default, and the trace's collectives (gen refuses them)
    blacklist.write_text(DEFAULT_BLACKLIST.read_text(encoding="utf-8") + "\nc10d.*\n", encoding="utf-8")

    def gen():
        return gen_main([str(folder), "-o", str(out / "pytests"), "--factory", "random", "-q",
                         "--blacklist", str(blacklist)])

    def info():
        return xray_main(["info", str(folder)])

    def replay_select():  # a dump, which the record path iterates too
        select_records(xray.load_dump(folder), ReplayConfig(backends=[], out=out / "replay"))

    raw_open()  # imports and page cache: not the dump's cost
    steps = {"raw open (load_dump + columns)": raw_open, "xray-summary (table)": summary_table,
             "xray-summary --csv": summary_csv, "xray-gen (random inputs)": gen, "xray info": info,
             "replay record selection (dedup)": replay_select}
    return {name: _timed(fn) for name, fn in steps.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--dir", type=Path, default=None, help="where to write the dump (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the dump (and re-use it when it is there)")
    p.add_argument("--json", type=Path, help="also write the numbers here (for tools/bench.py)")
    args = p.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="xray-bench-summary-"))
    folder = root / "bench" / "rank_0"
    try:
        t0 = time.perf_counter()
        if not (args.keep and (folder / "dump.json").exists()):
            shutil.rmtree(root / "bench", ignore_errors=True)
            write_dump(folder, args.records)
        written = time.perf_counter() - t0
        out = root / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        times = measure(folder, out)
        import xray

        n = len(xray.load_dump(folder).columns)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    base = times["raw open (load_dump + columns)"]
    rows = [[name, f"{s:.2f}", f"{n / s:,.0f}", f"{s / base:.1f}x"] for name, s in times.items()]
    print(f"synthetic 7B-shaped stats-only v3 dump: {n:,} records, one rank (written in {written:.0f} s)")
    print(tabulate(rows, headers=["step", "seconds", "records/s", "vs raw open"], tablefmt="github"))
    if args.json:
        args.json.write_text(json.dumps({"records": n, "open_s": base, "summary_s": times["xray-summary (table)"],
                                         "summary_csv_s": times["xray-summary --csv"],
                                         "gen_s": times["xray-gen (random inputs)"], "info_s": times["xray info"],
                                         "replay_select_s": times["replay record selection (dedup)"]}))


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    main()
