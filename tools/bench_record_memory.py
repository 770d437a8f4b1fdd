"""Recorder memory against the number of records: peak RSS while recording and during end_dump.

A loop of cheap ATen calls (``y = x * a; z = y + b`` on a 16-element tensor, two calls a turn)
is recorded in a fresh process per size, with the defaults (de-duplicated: every call after the
first two folds into them) and with ``X_DEDUP=0 X_DUMP_NUM=0`` (every call a record of
statistics; ``--config saved``: ``X_DEDUP=0`` alone, every record also copying its tensors, slow:
one HDF5 dataset per tensor). Printed per size:
the process's resident memory before recording, its peak while recording, its peak during
``end_dump`` (the kernel's high-water mark is reset before it, /proc/self/clear_refs), and the
growth per record. Two sizes side by side show whether memory follows the flush size (growth
per record falls as N grows) or the number of records (it stays the same).

    python tools/bench_record_memory.py [--sizes 200000 1000000] [--config defaults every saved] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

GOAL_BYTES = 1 << 30  # a 10M-call recording, end_dump included, stays under 1 GB
GOAL_RECORDS = 10_000_000
CONFIGS = {"defaults": {}, "every": dict(X_DEDUP=False, X_DUMP_NUM=0), "saved": dict(X_DEDUP=False)}
LABELS = {"defaults": "defaults (de-dup)", "every": "X_DEDUP=0 X_DUMP_NUM=0", "saved": "X_DEDUP=0"}


def _status(field: str) -> int:
    """A /proc/self/status field (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def child(n: int, config: str, folder: str) -> dict:
    """Record ``n`` calls in this process and measure it (run by ``main`` in a fresh process)."""
    import torch

    import xray

    torch.manual_seed(0)
    x, a, b = torch.randn(16), torch.randn(16), torch.randn(16)
    for _ in range(100):  # warm torch's own caches outside the measure
        (x * a) + b
    xray.begin_dump(dump_dir=folder, **CONFIGS[config])
    for _ in range(100):
        (x * a) + b
    _reset_peak()
    before = _status("VmRSS")
    for _ in range(n // 2 - 50):
        (x * a) + b
    recorded = _status("VmRSS")
    peak_recording = _status("VmHWM")
    _reset_peak()
    out = xray.end_dump()
    peak_end = _status("VmHWM")
    index = sum(p.stat().st_size for p in Path(out).glob("index-*.h5"))
    return {"calls": n, "config": config, "rss_before": before, "rss_recorded": recorded,
            "peak_recording": peak_recording, "peak_end_dump": peak_end, "index_bytes": index}


def measure(n: int, config: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="xray_mem_") as tmp:
        proc = subprocess.run([sys.executable, __file__, "--child", str(n), "--config", config,
                               "--folder", tmp], capture_output=True, text=True, check=False)
        if proc.returncode:
            raise SystemExit(f"child for {n} records failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _mib(b: int) -> str:
    return f"{b / 2**20:,.0f} MiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000])
    ap.add_argument("--config", nargs="+", choices=sorted(CONFIGS), default=["defaults", "every"])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.config[0], args.folder)))
        return 0
    results, rows = [], []
    for config in args.config:
        runs = [measure(n, config) for n in args.sizes]
        results += runs
        for r in runs:
            growth = (r["rss_recorded"] - r["rss_before"]) / r["calls"]
            peak = max(r["peak_recording"], r["peak_end_dump"])
            rows.append([LABELS[config], f"{r['calls']:,}", _mib(r["rss_before"]),
                         _mib(r["peak_recording"]), _mib(r["peak_end_dump"]), f"{growth:,.1f} B",
                         _mib(r["index_bytes"]), "yes" if peak < GOAL_BYTES else "no"])
        if len(runs) >= 2:
            lo, hi = runs[0], runs[-1]
            slope = (max(hi["peak_recording"], hi["peak_end_dump"]) - max(lo["peak_recording"], lo["peak_end_dump"])) \
                / (hi["calls"] - lo["calls"])
            at_goal = max(lo["peak_recording"], lo["peak_end_dump"]) + slope * (GOAL_RECORDS - lo["calls"])
            rows.append(["", "between sizes", "", "", "", f"{slope:,.1f} B/call of peak", "",
                         f"10M calls -> {_mib(at_goal)}"])
    print(tabulate(rows, headers=["recording", "calls", "RSS before", "peak recording", "peak end_dump",
                                  "RSS growth / call", "index on disk", "< 1 GiB"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
