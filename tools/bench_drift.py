"""How long ``xray drift`` takes on the demo Llama, stage by stage, against the 60 s goal.

Runs the real command line (``python -m xray.cli drift xray.drift.examples:tiny_llama`` with
onnxrt-cpu, executorch-xnnpack and torch-compile) in a fresh process, so the total includes
importing torch, transformers and the backends, as a user's run does. Stage seconds come from
the run's drift.json; one eager forward of the same model is timed beside it for scale.
torch.compile's time depends on inductor's on-disk cache (warm after the first run on a machine;
``--cold`` points it at an empty folder).

    python tools/bench_drift.py [--cold] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
MODEL = "xray.drift.examples:tiny_llama"
BACKENDS = ["onnxrt-cpu", "executorch-xnnpack", "torch-compile"]
GOAL_S = 60.0


def eager_forward_ms(repeats: int = 5) -> float:
    """Median of ``repeats`` forwards of the same model, after one warm-up."""
    import torch

    sys.path.insert(0, str(ROOT))
    from xray.drift.examples import tiny_llama

    model, args = tiny_llama()
    times = []
    with torch.no_grad():
        model(*args)
        for _ in range(repeats):
            start = time.perf_counter()
            model(*args)
            times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def run(out: Path, cold: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")
    if cold:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(out / "inductor-cache")
    cmd = [sys.executable, "-m", "xray.cli", "drift", MODEL, *[a for b in BACKENDS for a in ("-b", b)],
           "--out", str(out / "drift"), "--no-layers"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"xray drift failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = json.loads((out / "drift" / "drift.json").read_text())
    row = {"model": MODEL, "wall_s": round(wall, 2), "goal_s": GOAL_S, "within_goal": wall < GOAL_S,
           "in_process_s": round(summary["seconds"]["total"], 2), "export_s": round(summary["seconds"]["export"], 2),
           "eager_reference_s": round(summary["seconds"]["eager_reference"], 2),
           "imports_and_model_s": round(wall - summary["seconds"]["total"], 2), "inductor_cache": "cold" if cold else "as found",
           "backends": {}, "stdout": proc.stdout}
    for b in summary["backends"]:
        row["backends"][b["backend"]] = {"status": b["status"], "mapped_pct": b.get("mapped_pct"),
                                         "granularity": b["granularity"], "error": b["error"][:200],
                                         **{f"{k}_s": round(v, 2) for k, v in b["seconds"].items()}}
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cold", action="store_true", help="an empty inductor cache for torch.compile")
    ap.add_argument("--json", type=Path, help="also write the headline numbers here (for tools/bench.py)")
    args = ap.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="xray-bench-drift-"))
    row = run(out, args.cold)
    row["eager_forward_ms"] = round(eager_forward_ms(), 2)
    row["load_average"] = round(os.getloadavg()[0], 1)  # a shared 2-core machine: say how busy it was
    print(row.pop("stdout"))
    table = [["(process: imports, model build)", "", "", f"{row['imports_and_model_s']:.1f}"],
             ["export (torch.export + core ATen)", "", "", f"{row['export_s']:.1f}"],
             ["eager reference (recorded)", "", "", f"{row['eager_reference_s']:.1f}"]]
    for name, b in row["backends"].items():
        stages = ", ".join(f"{k[:-2]} {v:.1f}" for k, v in b.items() if k.endswith("_s"))
        table.append([name, b["status"], f"{b['mapped_pct'] or 0:.0f}%", f"{sum(v for k, v in b.items() if k.endswith('_s')):.1f}  ({stages})"])
    table.append(["TOTAL wall (goal < 60 s)", "OK" if row["within_goal"] else "OVER", "", f"{row['wall_s']:.1f}"])
    table.append(["one eager forward (same model)", "", "", f"{row['eager_forward_ms'] / 1000:.4f}"])
    print(tabulate(table, headers=["stage", "status", "mapped", "seconds"], tablefmt="simple"))
    print(f"load average {row['load_average']} on {os.cpu_count()} cores; torch.compile's inductor cache: "
          f"{row['inductor_cache']}")
    if args.json:
        args.json.write_text(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
