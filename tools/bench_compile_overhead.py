"""What recording a compiled run costs, compilation excluded, statistics only: the median and the fastest time of
a compiled model's run with compile-check's probes recording (each written buffer reduced to its
statistics right after its launch, as ``--statistics-only``) against the same compiled program
with the probes idle, and against a plain ``torch.compile`` of the model.

    python tools/bench_compile_overhead.py [--models tiny,real] [--runs 5] [--threads 1]

``--threads``: torch's intra-op threads (default: torch's). On a machine shared with other work,
a multi-threaded kernel waits at its barrier for a thread the OS has descheduled, and each probe
between two launches lets the idle threads fall asleep: the figures then measure the load, not
the recording. One thread measures the recording itself.

Prints one row per model and writes OUT/overhead.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from xray.quiet import quiet_third_party  # noqa: E402

quiet_third_party()


def _timed(fn, runs: int, after=None) -> tuple[float, float]:
    """(median, fastest) of ``runs`` runs: other work on the machine only ever adds time, so the
    fastest run is the program's own cost; the median shows how much the load added."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if after:
            after()
    return statistics.median(times), min(times)


def measure(model: torch.nn.Module, args: tuple, runs: int) -> dict:
    from torch._inductor.compile_fx import compile_fx

    from xray.compiled.capture import Capture, capturing
    from xray.compiled.reference import DynamoGraphs

    out = {}
    with torch.no_grad():
        torch._dynamo.reset()
        plain = torch.compile(model, backend="inductor", dynamic=False)
        t0 = time.perf_counter()
        plain(*args)
        out["compile_plain_s"] = time.perf_counter() - t0
        plain(*args)
        out["plain_s"], out["plain_best_s"] = _timed(lambda: plain(*args), runs)

        torch._dynamo.reset()
        capture, dynamo = Capture(keep_tensors=False), DynamoGraphs()
        probed = torch.compile(model, backend=dynamo.backend(capture, lambda gm, ex: compile_fx(gm, ex)), dynamic=False)
        t0 = time.perf_counter()
        with capturing(capture):
            probed(*args)
        out["compile_probed_s"] = time.perf_counter() - t0
        probed(*args)
        out["probes_idle_s"], out["probes_idle_best_s"] = _timed(lambda: probed(*args), runs)
        capture.recording = dynamo.recording = True

        def forget() -> None:
            capture.values.clear()
            capture.calls.clear()
            dynamo.runs.clear()

        out["recording_s"], out["recording_best_s"] = _timed(lambda: probed(*args), runs, forget)
        capture.recording = dynamo.recording = False
        out["launches"] = sum(len(g.launches) for g in capture.graphs)
        torch._dynamo.reset()
    out["ratio_vs_plain"] = out["recording_s"] / out["plain_s"]
    out["ratio_vs_idle"] = out["recording_s"] / out["probes_idle_s"]
    out["best_ratio_vs_plain"] = out["recording_best_s"] / out["plain_best_s"]
    return out


def main() -> int:
    from bench_compile_faults import _llama

    models = {"tiny": ("Llama 2x64, 32 tokens", lambda: _llama(layers=2)),
              "real": ("Llama 1x1024, 512 tokens", lambda: _llama(hidden=1024, layers=1, seq=512, inter=2816, heads=16))}
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,real", help="comma-separated: " + ",".join(models))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--out", default="bench-compile")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in [m for m in a.models.split(",") if m]:
        label, build = models[name]
        model, args = build()
        r = {"model": label, "threads": torch.get_num_threads(), **measure(model, args, a.runs)}
        rows.append(r)
        print(f"{label:28s} median: plain {r['plain_s'] * 1e3:.1f} ms, probes idle {r['probes_idle_s'] * 1e3:.1f} ms, "
              f"recording {r['recording_s'] * 1e3:.1f} ms ({r['ratio_vs_plain']:.2f}x plain); fastest: plain "
              f"{r['plain_best_s'] * 1e3:.1f} ms, probes idle {r['probes_idle_best_s'] * 1e3:.1f} ms, recording "
              f"{r['recording_best_s'] * 1e3:.1f} ms ({r['best_ratio_vs_plain']:.2f}x plain); {r['launches']} launches, "
              f"{r['threads']} threads", flush=True)
        (out / "overhead.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
