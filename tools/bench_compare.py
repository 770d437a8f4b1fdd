"""Benchmark xray-compare: GB/s of tensor data compared, beside merely reading the same files.

Writes a synthetic pair of trace dumps with xray's own DumpWriter (in a child process, so the
peak memory reported below is the compare's alone), then times, in this one run:
  1. reading every saved tensor of both dumps (h5py, whole datasets), and
  2. compare_dumps on the pair (chunked streaming, all metrics, statuses, alignment).
Usage: python tools/bench_compare.py [--gb 1.2] [--dir /tmp/xray_bench_compare]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ELEMS = 1 << 20  # 4 MiB float32 tensors


def write(folder: Path, gb_per_side: float) -> None:
    import torch

    from xray.demo.synthetic import Op, write_dump

    n = max(1, int(gb_per_side * 1e9 / (ELEMS * 4)))
    g = torch.Generator().manual_seed(0)
    bench, target = [], []
    for i in range(n):
        x = torch.randn(ELEMS // 1024, 1024, generator=g)
        # target: most tensors equal, some with float32-level noise, one scaled (a real failure)
        y = x if i % 3 else x + 1e-7 * torch.randn(x.shape, generator=g)
        if i == n // 2:
            y = x * 1.01
        op = ("aten.mm.default", "aten.add.Tensor", "aten.mul.Tensor")[i % 3]
        bench.append(Op(op, x, module=f"layers.{i // 3}"))
        target.append(Op(op, y, module=f"module.layers.{i // 3}"))
    write_dump(folder / "bench", bench)
    write_dump(folder / "target", target)


def read_all(folder: Path) -> int:
    import h5py

    total = 0
    for seg in sorted(folder.glob("*/tensors-*.h5")):
        with h5py.File(seg, "r") as f:
            def visit(name, obj):
                nonlocal total
                if isinstance(obj, h5py.Dataset):
                    total += obj[()].nbytes
            f.visititems(visit)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.2, help="total tensor data of both dumps (GB)")
    ap.add_argument("--dir", default="/tmp/xray_bench_compare")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the headline numbers here (for tools/bench.py)")
    args = ap.parse_args()
    folder = Path(args.dir)
    if "--child-write" in sys.argv:
        return
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                    f"from bench_compare import write; from pathlib import Path; write(Path({str(folder)!r}), {args.gb / 2})"],
                   check=True)
    print(f"wrote synthetic dumps in {time.perf_counter() - t0:.1f} s")

    import torch

    from xray.compare import compare_dumps

    read_all(folder)  # warm the page cache so both timings below read from memory
    t0 = time.perf_counter()
    nbytes = read_all(folder)
    t_read = time.perf_counter() - t0
    timings = {}
    for threads in (2, 1):  # the default (1) last, so the result printed below is its own
        t0 = time.perf_counter()
        result = compare_dumps(folder / "bench", folder / "target", progress=False, threads=threads)
        timings[threads] = time.perf_counter() - t0
    t_cmp = timings[1]
    s = result.summary
    gb = s.bytes_compared / 1e9
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"torch threads available: {torch.get_num_threads()}; load average {os.getloadavg()[0]:.1f}")
    print(f"tensor data: {nbytes / 1e9:.2f} GB in {s.bench_records}+{s.target_records} records "
          f"({ELEMS * 4 / 2**20:.0f} MiB each)")
    print(f"read only : {t_read:6.2f} s  {nbytes / 1e9 / t_read:6.2f} GB/s")
    for threads, t in sorted(timings.items()):
        print(f"compare   : {t:6.2f} s  {gb / t:6.2f} GB/s  (compare / read time: {t / t_read:.2f}x)  "
              f"torch threads={threads}")
    print(f"peak RSS  : {peak:.0f} MiB (largest tensor {ELEMS * 4 / 2**20:.0f} MiB)")
    print(f"statuses  : {result.status_counts()}  matched {s.matched}/{s.bench_records}  "
          f"first divergence: {(s.first_divergence or {}).get('bench')}")
    if args.json:
        args.json.write_text(json.dumps({"gb": gb, "compare_GBps": gb / t_cmp, "read_GBps": nbytes / 1e9 / t_read,
                                         "compare_vs_read": t_cmp / t_read, "peak_rss_MiB": peak,
                                         "largest_tensor_MiB": ELEMS * 4 / 2**20}))
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
