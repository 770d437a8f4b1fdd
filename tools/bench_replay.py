"""Replay throughput in records per second per backend, cold (empty export cache) vs cached.

Records a 1-layer tiny Llama (de-duplicated), then for each backend replays the first N distinct
op records twice into the same output folder: the first run exports and lowers every op (cold),
the second finds every export in the cache. Both runs include the worker start-up, so the ratio
is what a user sees when re-running xray-replay on the same dump. Run side by side in one process:

    python tools/bench_replay.py --limit 20 --backend onnxrt-cpu --backend executorch-xnnpack
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

import xray  # noqa: E402
from xray.backends.base import ReplayStatus  # noqa: E402
from xray.demo.models import tiny_llama, token_batch  # noqa: E402
from xray.replay.runner import ReplayConfig, replay_dump  # noqa: E402

DEFAULT_BACKENDS = ["torch-cpu", "torch-compile", "onnxrt-cpu", "executorch-xnnpack", "executorch-portable", "coreml"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", action="append", default=[], help="preset to measure (repeatable)")
    p.add_argument("--limit", type=int, default=20, help="distinct op records replayed per run")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per op (latency)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (dump, matrices, caches)")
    p.add_argument("--json", type=Path, help="also write the headline numbers here (for tools/bench.py)")
    args = p.parse_args()
    backends = args.backend or DEFAULT_BACKENDS
    work = Path(tempfile.mkdtemp(prefix="xray-bench-replay-"))
    try:
        run(work, backends, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, backends: list[str], args: argparse.Namespace) -> None:
    model, ids = tiny_llama(layers=1, hidden=32), token_batch()
    with torch.no_grad(), xray.dump(X_DEDUP=True, X_DUMP_NUM=5, dump_dir=work / "dump") as d:
        model(ids)
    rows, headline = [], {}
    for b in backends:
        out = work / b
        times, counts = [], []
        for _ in ("cold", "cached"):
            cfg = ReplayConfig(backends=[], baseline=b, out=out, limit=args.limit, repeats=args.repeats,
                               progress=False)
            start = time.perf_counter()
            result = replay_dump(d.folder, cfg)
            times.append(time.perf_counter() - start)
            counts.append(len(result.records))
            cached = sum(r.cached for r in result.rows)
        statuses = {}
        for r in result.rows:
            statuses[ReplayStatus(r.status).name] = statuses.get(ReplayStatus(r.status).name, 0) + 1
        n = counts[0]
        headline[b] = {"records": n, "cold_rps": n / times[0], "cached_rps": n / times[1]}
        rows.append([b, n, f"{times[0]:.1f}", f"{n / times[0]:.2f}", f"{times[1]:.1f}", f"{n / times[1]:.2f}",
                     f"{times[0] / times[1]:.1f}x", f"{cached}/{n}",
                     ", ".join(f"{k}={v}" for k, v in statuses.items())])
    print(tabulate(rows, headers=["backend", "records", "cold s", "cold rec/s", "cached s", "cached rec/s",
                                  "cached speed-up", "cache hits", "statuses"]))
    if args.json:
        args.json.write_text(json.dumps(headline))
    print(f"\n(times include worker start-up; {os.cpu_count()} CPU cores; work folder {work}"
          f"{' kept' if args.keep else ' removed'})")


if __name__ == "__main__":
    main()
