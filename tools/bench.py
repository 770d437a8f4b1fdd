"""Every capability's benchmark in one run, one table. Each figure is a ratio (or a rate beside
its own baseline) measured side by side in the same run; absolute times depend on the machine.

    python tools/bench.py [--quick] [--markdown]

Runs, each in its own process: bench_record.py (dump overhead vs eager, and msprobe when it is
installed), bench_debugger.py (module-dump overhead), bench_compare.py (compare GB/s vs raw
read), bench_gen.py (generation records/s), bench_summary.py (xray-summary, xray-gen, xray info and replay's
record selection on a 200k-record v3 dump, beside its raw open), bench_replay.py (replay records/s, cold vs cached),
bench_accuracy.py (how often compare names the injected fault; false failures on noise-only runs),
bench_drift.py (xray drift on the demo Llama, three backends, against the 60 s goal),
bench_bigdump.py (open, scan and compare of a 7B-shaped stats-only dump pair, issue 21's targets:
1,000,000 records per side: about 10 minutes, 2 GB of disk and 5 GiB of memory on 2 cores; 100,000
under --quick, about 1 minute, where its time targets are scaled pro rata).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

HERE = Path(__file__).resolve().parent


def run(script: str, args: list[str], out: Path) -> dict | None:
    cmd = [sys.executable, str(HERE / script), *args, "--json", str(out)]
    print(f"$ {' '.join(cmd[1:])}", flush=True)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TRANSFORMERS_VERBOSITY="error"))
    if proc.returncode != 0 or not out.exists():
        print(f"  failed ({proc.returncode}): {proc.stderr[-1500:]}", file=sys.stderr)
        return None
    print(f"  done in {time.perf_counter() - started:.0f} s", flush=True)
    return json.loads(out.read_text())


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller inputs, half the accuracy scenarios")
    ap.add_argument("--markdown", action="store_true", help="print the table as GitHub markdown (for the README)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="xray-bench-all-"))
    q = args.quick
    rec = run("bench_record.py", ["--repeats", "3" if q else "5"], tmp / "record.json")
    dbg = run("bench_debugger.py", ["--steps", "20" if q else "40"], tmp / "debugger.json")
    cmp_ = run("bench_compare.py", ["--gb", "0.6" if q else "1.2"], tmp / "compare.json")
    gen = run("bench_gen.py", ["--records", "100000"], tmp / "gen.json")
    tools = run("bench_summary.py", ["--records", "50000" if q else "200000"], tmp / "tools.json")
    rep = run("bench_replay.py", ["--limit", "8" if q else "15", "--backend", "onnxrt-cpu",
                                  "--backend", "executorch-xnnpack"], tmp / "replay.json")
    acc = run("bench_accuracy.py", ["--quick"] if q else [], tmp / "accuracy.json")
    dft = run("bench_drift.py", [], tmp / "drift.json")
    big = run("bench_bigdump.py", ["--records", "100000" if q else "1000000"], tmp / "bigdump.json")
    rows = []
    if rec:
        rows += [["record (ATen tracer)", "0x102 dedup, stats only, vs eager", f"{rec['dump_ratio_dedup']:.2f}x",
                  "target <= 2x"],
                 ["", "0x102 every call (no dedup), vs eager", f"{rec['dump_ratio_nodedup']:.2f}x", ""],
                 ["", "0x102 dedup, per forward in a session", f"{rec['session_ratio_dedup']:.2f}x",
                  "target <= 1.3x (issue 21)"],
                 ["", "0x102 no dedup, per forward in a session", f"{rec['session_ratio_nodedup']:.2f}x",
                  "target <= 1.5x (issue 21)"],
                 ["", "... the same with the C path off", f"{rec['session_ratio_nodedup_python']:.2f}x",
                  "XRAY_NATIVE_ROWS=0: the Python row path"],
                 ["", "0x102 dedup + 5 tensors/record, vs eager", f"{rec['dump_ratio_dedup_tensors']:.2f}x",
                  "writes tensors to disk"]]
        for level in ("L1", "mix"):
            if f"msprobe_{level}_ratio" in rec:
                rows.append(["", f"msprobe statistics level {level}, vs eager", f"{rec[f'msprobe_{level}_ratio']:.2f}x",
                             "torch-API level only"])
    if dbg:
        for i, (width, ratio) in enumerate(dbg["module_dump_ratio"].items()):
            rows.append(["" if i else "module dump (PrecisionDebugger)",
                         f"statistics only, vs eager, hidden {width}", f"{ratio:.2f}x",
                         f"target <= 1.3x; {dbg['module_dump_trained_ratio'][width]:.2f}x if parameters change"])
        rows += [["", "tensor mode write speed vs disk", f"{dbg['tensor_write_MBps']:.0f} / {dbg['disk_MBps']:.0f} MB/s",
                  "fsync'd sequential write"]]
    if cmp_:
        rows += [["compare", "tensor data compared", f"{cmp_['compare_GBps']:.2f} GB/s",
                  f"raw read {cmp_['read_GBps']:.1f} GB/s; target >= 1 GB/s"],
                 ["", "peak RSS", f"{cmp_['peak_rss_MiB']:.0f} MiB", f"largest tensor {cmp_['largest_tensor_MiB']:.0f} MiB"]]
    if gen:
        rows += [["generate (xray-gen)", f"{gen['records']:,} records -> {gen['tests']:,} tests",
                  f"{gen['gen_records_per_s']:,.0f} rec/s", f"reading the dump: {gen['read_records_per_s']:,.0f} rec/s"]]
    if tools:
        rows += [["whole-dump tools (v3)", f"{tools['records']:,} records: summary table / --csv",
                  f"{tools['summary_s']:.1f} / {tools['summary_csv_s']:.1f} s", f"raw open {tools['open_s']:.2f} s"],
                 ["", "xray-gen / xray info / replay selection",
                  f"{tools['gen_s']:.2f} / {tools['info_s']:.2f} / {tools['replay_select_s']:.2f} s",
                  "read on the columns; Records built only for what is rendered"]]
    if rep:
        for backend, r in rep.items():
            rows.append(["replay" if backend == next(iter(rep)) else "", f"{backend}, {r['records']} ops",
                         f"{r['cold_rps']:.2f} / {r['cached_rps']:.2f} rec/s", "cold / cached exports"])
    if acc:
        rows += [["compare accuracy", f"{acc['fault_scenarios']} injected faults, {acc['architectures']} architectures",
                  f"{acc['exact_pct']:.0f}% exact / {acc['right_module_pct']:.0f}% module",
                  "first divergence names the faulty call / its module; target >= 97% exact"],
                 ["", f"{acc['noise_scenarios']} noise-only runs (bf16, fp16, TF32, threads, kernels)",
                  f"{acc['noise_fail_rows_pct']:.1f}% false-fail rows",
                  f"{acc['noise_scenarios_failing']} runs with a FAIL row; {acc['crashes']} crashes; target 0"]]
    if dft:
        ort = dft["backends"].get("onnxrt-cpu", {})
        rows += [["drift (xray drift)", "demo Llama, onnxrt-cpu + executorch-xnnpack + torch-compile, wall",
                  f"{dft['wall_s']:.1f} s", f"target < 60 s; one eager forward {dft['eager_forward_ms']:.1f} ms"],
                 ["", "eager records mapped on ONNX Runtime", f"{ort.get('mapped_pct') or 0:.0f}%", "target >= 90%"]]
    if big:
        scale = big["records"] / 1_000_000  # issue 21's targets are for 1M records
        rows += [["big dump (issue 21)", f"open {big['records']:,} records, stats only, {big['ranks']} ranks",
                  f"{big['open_s']:.1f} s", (f"{big['open_records_per_s']:,.0f} rec/s, {big['open_rss_MiB']:,.0f} MiB; "
                                             f"json.loads alone {big['raw_read_s']:.1f} s; GC off {big['open_nogc_s']:.1f} s; "
                                             f"target <= {scale:.2g} s")],
                 ["", "scan every record (op, module, stats)", f"{big['scan_records_per_s']:,.0f} rec/s", "after open"],
                 ["", "compare two such dumps", f"{big['compare_s']:.0f} s, {big['compare_rss_MiB']:,.0f} MiB",
                  f"target <= {30 * scale:.3g} s, < 2,000 MiB"]]
    print(f"\nxray benchmarks on {machine()}, load average {os.getloadavg()[0]:.1f}")
    print(tabulate(rows, headers=["capability", "measure", "result", "note"],
                   tablefmt="github" if args.markdown else "simple"))
    return 0 if all((rec, dbg, cmp_, gen, tools, rep, acc, dft, big)) else 1


if __name__ == "__main__":
    sys.exit(main())
