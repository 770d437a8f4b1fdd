"""Where recording's time goes: torch.profiler over forwards recorded inside one session.

The model of ``bench_record.py --device``: a Llama with hidden 1024, 8 layers, 16 heads (8 KV),
4x512 tokens (``--small``: hidden 256, 2 layers, 2x128). It times eager and recorded forwards
side by side, then profiles two recorded forwards and prints the host functions that cost most
(self CPU time, with Python frames) and the device kernels the recording added.

    python tools/profile_record.py --device cuda [--dtype bfloat16] [--config every] [--out DIR]
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

import xray  # noqa: E402
from xray.demo.models import tiny_llama, token_batch  # noqa: E402

CONFIGS = {"every": dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0),
           "dedup": dict(X_DEBUG=0x102, X_DEDUP=True, X_DUMP_NUM=0),
           "defaults": {}}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(fn, device, n: int) -> float:
    times = []
    for _ in range(n):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--config", default="every", choices=sorted(CONFIGS))
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", type=Path, help="write the tables (and a Chrome trace) here")
    args = ap.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hidden, layers, batch, seq = (256, 2, 2, 128) if args.small else (1024, 8, 4, 512)
    model = tiny_llama(layers=layers, hidden=hidden, heads=4 if args.small else 16, kv_heads=2 if args.small else 8,
                       vocab=1000, intermediate=hidden * 11 // 4, attn="eager").to(device=device, dtype=dtype)
    ids = token_batch(batch=batch, seq=seq, vocab=1000).to(device)
    root = Path(tempfile.mkdtemp(prefix="xray-profile-"))
    lines = []
    try:
        with torch.no_grad():
            forward = lambda: model(ids)  # noqa: E731
            _time(forward, device, 3)
            eager = _time(forward, device, 5)
            with xray.dump(dump_dir=root / "d", **CONFIGS[args.config]) as session:
                forward()
                recorded = _time(forward, device, 5)
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                with profile(activities=activities, with_stack=True) as prof:
                    forward()
                    forward()
                    _sync(device)
                calls = session.recorder.op_calls
        lines.append(f"{args.dtype} {args.config}: eager {eager * 1e3:.2f} ms, recorded {recorded * 1e3:.2f} ms, "
                     f"{recorded / eager:.2f}x; {calls} ATen calls recorded in the session")
        averages = prof.key_averages(group_by_stack_n=1)
        lines.append(averages.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=60))
        kernels = collections.Counter()
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA") and not e.name.startswith(("Memcpy", "Memset")):
                kernels[e.name[:70]] += 1
        lines.append(tabulate(kernels.most_common(args.top), headers=["device kernel (2 forwards)", "launches"]))
        text = "\n\n".join(lines)
        print(text)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"profile_{args.dtype}_{args.config}.txt").write_text(text)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
