"""Recorder overhead vs plain eager, measured side by side in one run.

Model: transformers LlamaForCausalLM, 4 layers, hidden 256, batch 2x128 tokens (issue 2). Each
configuration is timed over the same number of forwards, interleaved with eager, and the
median ratio is printed. msprobe (pip install mindstudio-probe) runs beside it when installed.

The "Python row path" row switches the recorder's C path off (``XRAY_NATIVE_ROWS=0``): the same
dump, recorded by xray/record/rows.py alone, measured beside it.

The "tracer only" rows swap the dump writer for one that drops what it is given (``NullWriter``):
what the dispatch path costs without building columns or writing files (docs/performance.md).
Those rows time one forward per dump session (folder set-up and end_dump included). The "per
forward in a session" rows time forwards inside one long session, as a training or eval loop
records them: median and mean (the mean carries periodic flushes and garbage collection); the
inference_mode row runs both sides under ``torch.inference_mode()`` instead of ``no_grad``. The
defaults' row records as ``begin_dump()`` does (de-dup, X_DUMP_NUM=5); the floor row is a
dispatch mode that only runs each op, what any recorder built on one pays first.

Then the same per-forward rows at a real size (hidden 1024, 1x512 tokens; ``--no-real-size``
skips them): there each op does enough work that the per-call costs are a small share. Then the
reference model in bfloat16 (``--no-half`` skips it), every call with and without the
half-precision elementwise self-checks, side by side.

    python tools/bench_record.py [--repeats 5] [--threads 2] [--json out.json] [--no-real-size] [--no-half]

``--device DEV`` (cuda, xpu, mps, cpu...) measures issue 30's table instead: a Llama with hidden
1024, 8 layers, 16 heads (8 KV), 4x512 tokens (``--small``: hidden 256, 2 layers, 2x128, for a
CPU), fp32 and bf16, per forward inside a session: eager, de-dup, every call, every call
without statistics (X_DEBUG=0x100). Beside each ratio: kernel launches per forward
(torch.profiler's device kernels; ATen ops on a CPU), host synchronisations per forward
(``torch.cuda.set_sync_debug_mode`` on CUDA), and the queued statistics' batches and transfers.

    python tools/bench_record.py --device cuda [--small] [--repeats 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import xray  # noqa: E402
from xray.demo.models import bench_llama, token_batch  # noqa: E402
from xray.dump.writer import DumpWriter  # noqa: E402

session_mod = importlib.import_module("xray.record.session")  # xray.dump is also a function
from xray.record.tracer import _set_eval_frame  # noqa: E402 - the recorder's own Dynamo guard
stats_mod = importlib.import_module("xray.dump.stats")
self_check_mod = importlib.import_module("xray.record.self_check")

CONFIGS = [  # (label, dump kwargs, tracer only)
    ("0x102 dedup, no tensors", dict(X_DEBUG=0x102, X_DEDUP=True, X_DUMP_NUM=0), False),
    ("0x102 dedup, X_DUMP_NUM=5", dict(X_DEBUG=0x102, X_DEDUP=True, X_DUMP_NUM=5), False),
    ("0x112 dedup (+module records)", dict(X_DEBUG=0x112, X_DEDUP=True, X_DUMP_NUM=0), False),
    ("0x102 no dedup, no tensors", dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0), False),
    ("0x102 no dedup, X_DUMP_NUM=5", dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=5), False),
    ("0x102 dedup, tracer only", dict(X_DEBUG=0x102, X_DEDUP=True, X_DUMP_NUM=0), True),
    ("0x102 no dedup, tracer only", dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0), True),
]


class NullWriter(DumpWriter):
    """A writer that drops what it is given, without building columns or writing files: the
    tracer's share of the cost."""

    def add(self, record) -> None:
        pass

    def add_rows(self, *cells) -> None:
        pass

    def count_changed(self, fold) -> None:
        pass

    def flush(self, *, journal: bool = True) -> None:
        if self.before_flush is not None:
            self.before_flush()

    def close(self, summary: dict) -> Path:
        self.flush()
        self._journal.close()
        return self.folder


def folder_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def time_eager(model, ids) -> float:
    t = time.perf_counter()
    model(ids)
    return time.perf_counter() - t


def time_dump(model, ids, root: Path, kw: dict, tracer_only: bool = False) -> tuple[float, dict, int]:
    shutil.rmtree(root, ignore_errors=True)
    session_mod.DumpWriter = NullWriter if tracer_only else DumpWriter
    try:
        t = time.perf_counter()
        with xray.dump(dump_dir=root, **kw) as session:
            model(ids)
        elapsed = time.perf_counter() - t
    finally:
        session_mod.DumpWriter = DumpWriter
    return elapsed, session.summary(), folder_size(root)


def time_msprobe(model, ids, root: Path, level: str):
    """msprobe statistics mode at `level` (L1: torch API, mix: modules + API); None if absent."""
    try:
        from msprobe.pytorch import PrecisionDebugger
    except Exception:
        return None
    cfg = root / "msprobe.json"
    root.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(root / "out"), "rank": [], "step": [],
                               "level": level, "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                                              "summary_mode": "statistics"}}))
    debugger = PrecisionDebugger(config_path=str(cfg))
    t = time.perf_counter()
    debugger.start(model)
    model(ids)
    debugger.stop()
    debugger.step()
    return time.perf_counter() - t


def msprobe_ratio(level: str, repeats: int, threads: int) -> float | None:
    """msprobe's PrecisionDebugger is a process-wide singleton: each level runs in its own process."""
    try:
        import msprobe  # noqa: F401
    except Exception:
        return None
    proc = subprocess.run([sys.executable, __file__, "--msprobe-level", level, "--repeats", str(repeats),
                           "--threads", str(threads)], capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("MSPROBE_RATIO ")]
    return float(lines[-1].split()[1]) if lines else None


def _msprobe_child(level: str, repeats: int) -> int:
    model, ids = bench_llama(), token_batch(batch=2, seq=128, vocab=1000)
    tmp = Path(tempfile.mkdtemp(prefix="xray-msprobe-"))
    ratios = []
    with torch.no_grad():
        for _ in range(3):
            model(ids)
        for i in range(repeats + 1):
            eager = time_eager(model, ids)
            t = time_msprobe(model, ids, tmp / f"run{i}", level)
            if i:  # the first run pays msprobe's one-time set-up
                ratios.append(t / eager)
    shutil.rmtree(tmp, ignore_errors=True)
    print("MSPROBE_RATIO", statistics.median(ratios))
    return 0


STEADY_FORWARDS = 20  # forwards per block in the steady-state rows


def steady_ratios(model, ids, repeats: int, session, forwards: int = STEADY_FORWARDS) -> tuple[float, float]:
    """Per-forward cost inside one long session (a training or eval loop): blocks of
    ``forwards`` eager forwards alternate with one ``with session():`` of as many forwards.
    Returns the median over blocks of (median forward in the session / median eager forward),
    and the same for means: the mean carries the periodic flushes and any garbage collection
    they set off."""
    medians, means = [], []
    for _ in range(repeats):
        eager = [time_eager(model, ids) for _ in range(forwards)]
        with session():
            inside = [time_eager(model, ids) for _ in range(forwards)]
        medians.append(statistics.median(inside) / statistics.median(eager))
        means.append(statistics.mean(inside) / statistics.mean(eager))
    return statistics.median(medians), statistics.median(means)


def recording(root: Path, kw: dict):
    """A session for steady_ratios: a fresh dump into ``root`` with the dump kwargs ``kw``."""
    def session():
        shutil.rmtree(root, ignore_errors=True)
        return xray.dump(dump_dir=root, **kw)
    return session


class OnlyRuns(TorchDispatchMode):
    """A dispatch mode that runs each op and records nothing: what any recorder built on a
    Python ``TorchDispatchMode`` pays before it does anything (the floor under every row). It
    guards Dynamo as the recorder's mode does (``XrayTracer``: the eval-frame callback off
    around the call, not torch's wrapper, which costs about 2 us more a call)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return _set_eval_frame is None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        prior = None if _set_eval_frame is None else _set_eval_frame(None)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            if _set_eval_frame is not None:
                _set_eval_frame(prior)


REAL_SIZE = dict(hidden=1024, batch=1, seq=512, forwards=6)  # the benchmark model's proportions at a real width


def real_size_rows(repeats: int, root: Path) -> list[dict]:
    """The per-forward rows at a real size: the benchmark Llama at hidden 1024 (16 heads, 8 KV,
    MLP 2752, 4 layers) on 1x512 tokens, where each op does enough work that the per-call costs
    (dispatch, description, a self-check's fixed part) are a small share: the floor, the defaults,
    de-dup without tensors and every call, each beside eager in blocks of ``forwards``."""
    model = bench_llama(hidden=REAL_SIZE["hidden"])
    ids = token_batch(batch=REAL_SIZE["batch"], seq=REAL_SIZE["seq"], vocab=1000)
    n, results = REAL_SIZE["forwards"], []
    with torch.no_grad():
        model(ids)
        eager_ms = statistics.median(time_eager(model, ids) for _ in range(3)) * 1e3
        median, mean = steady_ratios(model, ids, repeats, OnlyRuns, n)
        results.append({"config": "floor", "ratio": median, "mean_ratio": mean, "eager_ms": eager_ms})
        for label, kw in (("defaults", CONFIGS[1][1]), ("dedup", CONFIGS[0][1]), ("every call", CONFIGS[3][1])):
            median, mean = steady_ratios(model, ids, repeats, recording(root, kw), n)
            results.append({"config": label, "ratio": median, "mean_ratio": mean})
    return results


@contextlib.contextmanager
def _without_elementwise_checks():
    """The recorder with its half-precision elementwise self-checks off (record/elementwise_check.py):
    what they cost, side by side."""
    before = self_check_mod.elementwise_check
    self_check_mod.elementwise_check = lambda *args, **kwargs: None
    try:
        yield
    finally:
        self_check_mod.elementwise_check = before


def half_precision_rows(repeats: int, root: Path) -> list[dict]:
    """The per-forward rows of the reference model in bfloat16 (weights and activations), where
    every elementwise call also keeps its self-check (the op run again in float32): the floor, the
    defaults, every call, and every call without those checks."""
    model, ids = bench_llama().to(torch.bfloat16), token_batch(batch=2, seq=128, vocab=1000)
    results = []
    with torch.no_grad():
        model(ids)
        eager_ms = statistics.median(time_eager(model, ids) for _ in range(5)) * 1e3
        median, mean = steady_ratios(model, ids, repeats, OnlyRuns)
        results.append({"config": "floor", "ratio": median, "mean_ratio": mean, "eager_ms": eager_ms})
        for label, kw, off in (("defaults", CONFIGS[1][1], False), ("every call", CONFIGS[3][1], False),
                               ("every call, no elementwise checks", CONFIGS[3][1], True)):
            with _without_elementwise_checks() if off else contextlib.nullcontext():
                median, mean = steady_ratios(model, ids, repeats, recording(root, kw))
            results.append({"config": label, "ratio": median, "mean_ratio": mean})
    return results


DEVICE_CONFIGS = [  # (label, dump kwargs or None for eager)
    ("eager", None),
    ("dedup", dict(X_DEBUG=0x102, X_DEDUP=True, X_DUMP_NUM=0)),
    ("every call", dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0)),
    ("every call, no statistics (0x100)", dict(X_DEBUG=0x100, X_DEDUP=False, X_DUMP_NUM=0)),
]


def _sync(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def _timed_forwards(model, ids, device, n: int) -> list[float]:
    times = []
    for _ in range(n):
        _sync(device)
        t = time.perf_counter()
        model(ids)
        _sync(device)
        times.append(time.perf_counter() - t)
    return times


def _launches(model, ids, device) -> int:
    """Device kernels (or, on a CPU, ATen ops) one forward launches, by torch.profiler."""
    return _launches_of(lambda: model(ids), device)


def _launches_of(fn, device) -> int:
    """Device kernels (or, on a CPU, ATen ops) ``fn`` launches, by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    elif device.type == "xpu" and hasattr(ProfilerActivity, "XPU"):
        activities.append(ProfilerActivity.XPU)
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    events = prof.events()
    if device.type == "cpu":
        return sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None)
    return sum(1 for e in events if str(getattr(e, "device_type", "")).endswith(("CUDA", "XPU", "MPS", "PrivateUse1"))
               and not e.name.startswith(("Memcpy", "Memset")))


def _host_syncs(model, ids, device) -> int | None:
    """Host synchronisations in one forward, where the device can count them (CUDA)."""
    return _syncs_of(lambda: model(ids), device)


def _syncs_of(fn, device) -> int | None:
    """Host synchronisations ``fn`` makes, where the device can count them (CUDA)."""
    if device.type != "cuda":
        return None
    import warnings

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def _batch_kernels(device: torch.device) -> dict:
    """label -> the batch kernel for ``device``'s queued statistics: the registered one (the fused
    Triton kernel where triton is installed for cuda/xpu) and the portable fallback beside it."""
    registered = stats_mod.BATCH_KERNELS.get(device.type)
    kernels = {"fused (Triton)": registered} if registered is not None else {}
    kernels["fallback (per tensor)"] = stats_mod._rows_one_by_one
    return kernels


@contextlib.contextmanager
def _batch_kernel(device: torch.device, kernel):
    """Queued statistics of ``device`` computed by ``kernel`` inside the block."""
    before = stats_mod.BATCH_KERNELS.get(device.type)
    stats_mod.BATCH_KERNELS[device.type] = kernel
    try:
        yield
    finally:
        if before is None:
            stats_mod.BATCH_KERNELS.pop(device.type, None)
        else:
            stats_mod.BATCH_KERNELS[device.type] = before


def _outputs(model, ids) -> list[torch.Tensor]:
    """Every floating module output of one forward: the tensors the statistics read (issue 30's probe)."""
    found = []

    def keep(_module, _args, out):
        for t in out if isinstance(out, (tuple, list)) else (getattr(out, "logits", out),):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                found.append(t.detach())
    handles = [m.register_forward_hook(keep) for m in model.modules()]
    try:
        model(ids)
    finally:
        for h in handles:
            h.remove()
    return found


def stats_cost(model, ids, device: torch.device, repeats: int) -> list[dict]:
    """The statistics alone, per kernel side by side: one forward's floating module outputs in
    batches of ``BATCH_DEFAULT`` tensors, each batch into a row buffer, as DeferredStats does:
    median ms, device kernels launched and host syncs per forward's worth of outputs."""
    tensors = _outputs(model, ids)
    count = stats_mod.BATCH_DEFAULT[0]
    rows = torch.empty((len(tensors), 7), dtype=torch.float64, device=device)
    items = [(t, rows[i]) for i, t in enumerate(tensors)]
    gbytes = sum(t.numel() * t.element_size() for t in tensors) / 1e9
    results = []
    for label, kernel in _batch_kernels(device).items():
        def run(kernel=kernel):
            for i in range(0, len(items), count):
                kernel(items[i:i + count])
        run()  # compiles (Triton) and warms the allocator
        times = []
        for _ in range(max(repeats, 1)):
            _sync(device)
            t = time.perf_counter()
            run()
            _sync(device)
            times.append((time.perf_counter() - t) * 1e3)
        results.append({"kernel": label, "tensors": len(tensors), "gbytes": round(gbytes, 3),
                        "ms": statistics.median(times), "launches": _launches_of(run, device),
                        "host_syncs": _syncs_of(run, device)})
    return results


def device_table(device: torch.device, small: bool, repeats: int, root: Path) -> tuple[list[dict], list[dict]]:
    """Issue 30's table on ``device``: per forward inside a session, each configuration beside
    eager forwards run in the same loop (the median of ``repeats`` blocks); "every call" once per
    statistics kernel. Then the statistics alone per kernel (``stats_cost``)."""
    from xray.demo.models import tiny_llama

    hidden, layers, batch, seq = (256, 2, 2, 128) if small else (1024, 8, 4, 512)
    results, costs = [], []
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_llama(layers=layers, hidden=hidden, heads=16 if not small else 4, kv_heads=8 if not small else 2,
                           vocab=1000, intermediate=hidden * 11 // 4, attn="eager").to(device=device, dtype=dtype)
        ids = token_batch(batch=batch, seq=seq, vocab=1000).to(device)
        with torch.no_grad():
            _timed_forwards(model, ids, device, 3)
            eager_launches = _launches(model, ids, device)
            eager_syncs = _host_syncs(model, ids, device)  # the model's own (transformers' mask checks)
            configs = [(label, kw, None) for label, kw in DEVICE_CONFIGS]
            at = next(i for i, (label, _, _) in enumerate(configs) if label == "every call")
            kernels = _batch_kernels(device)
            if len(kernels) > 1:  # the same configuration once per statistics kernel, side by side
                every = configs.pop(at)
                configs[at:at] = [(f"{every[0]}, {k}", every[1], kernel) for k, kernel in kernels.items()]
            for label, kw, kernel in configs:
                ratios, eager_ms, row = [], [], {"dtype": str(dtype).removeprefix("torch."), "config": label}
                for _ in range(repeats):
                    eager = statistics.median(_timed_forwards(model, ids, device, 5))
                    eager_ms.append(eager * 1e3)
                    if kw is None:
                        ratios.append(1.0)
                        continue
                    shutil.rmtree(root, ignore_errors=True)
                    with (contextlib.nullcontext() if kernel is None else _batch_kernel(device, kernel)), \
                            xray.dump(dump_dir=root, **kw) as session:
                        _timed_forwards(model, ids, device, 1)  # the first forward makes de-dup's records
                        recorded = statistics.median(_timed_forwards(model, ids, device, 5))
                        launches = _launches(model, ids, device)
                        deferred = session.recorder.deferred
                        transfers_before = deferred.transfers
                        syncs = _host_syncs(model, ids, device)
                        # each transfer (a writer flush's one copy per device) is one sync by design
                        flush_syncs = deferred.transfers - transfers_before
                        forwards = 7 + (syncs is not None)
                        calls = session.recorder.op_calls / forwards
                    ratios.append(recorded / eager)
                    # per forward; transfers happen at the writer's flushes and end_dump
                    row.update(launches=launches, added_launches=launches - eager_launches, host_syncs=syncs,
                               syncs_between_flushes=None if syncs is None else syncs - flush_syncs - eager_syncs,
                               added_per_call=(launches - eager_launches) / max(calls, 1),
                               batches=deferred.batches / forwards, transfers=deferred.transfers / forwards,
                               queued=deferred.launched / forwards, op_calls=calls)
                row.update(ratio=statistics.median(ratios), eager_ms=statistics.median(eager_ms))
                if kw is None:
                    row.update(launches=eager_launches, host_syncs=eager_syncs)
                results.append(row)
            costs.extend(dict(dtype=str(dtype).removeprefix("torch."), **c)
                         for c in stats_cost(model, ids, device, repeats))
    return results, costs


def _per(row: dict, key: str) -> str:
    return f"{row[key]:.1f}" if key in row else ""


def _device_main(args) -> int:
    device = torch.device(args.device)
    tmp = Path(tempfile.mkdtemp(prefix="xray-bench-"))
    try:
        results, costs = device_table(device, args.small, args.repeats, tmp / "d")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = "hidden 256, 2 layers, 2x128 tokens" if args.small else "hidden 1024, 8 layers, 16 heads (8 KV), 4x512 tokens"
    print(f"Llama {size}, eager attention, on {device} ({torch.__version__}); per forward inside a session, "
          f"median of {args.repeats} blocks")
    print(tabulate([[r["dtype"], r["config"], f"{r['eager_ms']:.1f}", f"{r['ratio']:.2f}x", r.get("launches", ""),
                     r.get("added_launches", ""), f"{r['added_per_call']:.3f}" if "added_per_call" in r else "",
                     "" if r.get("host_syncs") is None else r["host_syncs"],
                     "" if r.get("syncs_between_flushes") is None else r["syncs_between_flushes"],
                     _per(r, "queued"), _per(r, "batches"), _per(r, "transfers")] for r in results],
                   headers=["dtype", "configuration", "eager ms", "vs eager", "launches/fwd", "added",
                            "added/recorded call", "host syncs/fwd", "syncs between flushes", "queued stats/fwd",
                            "stat batches/fwd", "transfers/fwd"],
                   tablefmt="github"))
    print("\nStatistics alone, one forward's floating module outputs, per batch kernel:")
    print(tabulate([[c["dtype"], c["kernel"], c["tensors"], c["gbytes"], f"{c['ms']:.2f}", c["launches"],
                     "" if c["host_syncs"] is None else c["host_syncs"]] for c in costs],
                   headers=["dtype", "kernel", "tensors", "GB", "ms", "launches", "host syncs"], tablefmt="github"))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "small": args.small, "rows": results,
                                               "stats_cost": costs}, indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", help="measure issue 30's device table on this device instead")
    ap.add_argument("--small", action="store_true", help="with --device: a model small enough for a CPU")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--no-real-size", action="store_true", help="skip the rows at a real size (hidden 1024, 512 tokens)")
    ap.add_argument("--no-half", action="store_true", help="skip the rows of the reference model in bfloat16")
    ap.add_argument("--msprobe-level", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.msprobe_level:
        return _msprobe_child(args.msprobe_level, args.repeats)
    if args.device:
        return _device_main(args)
    model, ids = bench_llama(), token_batch(batch=2, seq=128, vocab=1000)
    tmp = Path(tempfile.mkdtemp(prefix="xray-bench-"))
    rows, results = [], []
    with torch.no_grad():
        for _ in range(3):  # warm-up: allocator, lazy inits, first-call costs
            model(ids)
        time_dump(model, ids, tmp / "warm", CONFIGS[0][1])
        time_dump(model, ids, tmp / "warm", CONFIGS[3][1])
        for label, kw, tracer_only in CONFIGS:
            ratios, summary, size = [], {}, 0
            for _ in range(args.repeats):
                eager = time_eager(model, ids)
                dumped, summary, size = time_dump(model, ids, tmp / "d", kw, tracer_only)
                ratios.append(dumped / eager)
            r = statistics.median(ratios)
            rows.append([label, f"{r:.2f}x", summary["op_calls"], summary["records"], summary["tensors_saved"],
                         f"{size / 2**20:.2f}"])
            results.append({"config": label, "ratio": r, **summary, "bytes": size})
        median, mean = steady_ratios(model, ids, args.repeats, OnlyRuns)
        rows.append(["a dispatch mode that only runs the op (the floor)", f"{median:.2f}x (mean {mean:.2f}x)",
                     "", "", "", ""])
        results.append({"config": "floor", "ratio": median, "mean_ratio": mean})
        for label, kw, mode, native in (
                ("the defaults (dedup, X_DUMP_NUM=5), per forward in a session", CONFIGS[1][1], torch.no_grad,
                 "1"),
                ("0x102 dedup, per forward in a session", CONFIGS[0][1], torch.no_grad, "1"),
                ("0x102 no dedup, per forward in a session", CONFIGS[3][1], torch.no_grad, "1"),
                ("0x102 no dedup, per forward, inference_mode", CONFIGS[3][1], torch.inference_mode, "1"),
                ("0x102 dedup, per forward, Python row path", CONFIGS[0][1], torch.no_grad, "0"),
                ("0x102 no dedup, per forward, Python row path", CONFIGS[3][1], torch.no_grad, "0")):
            previous = os.environ.get("XRAY_NATIVE_ROWS")
            os.environ["XRAY_NATIVE_ROWS"] = native
            try:
                with mode():  # inference tensors carry no version counter: their own cache rule
                    median, mean = steady_ratios(model, ids, args.repeats, recording(tmp / "steady", kw))
            finally:  # the caller's setting back, for the rows that follow
                if previous is None:
                    os.environ.pop("XRAY_NATIVE_ROWS")
                else:
                    os.environ["XRAY_NATIVE_ROWS"] = previous
            rows.append([label, f"{median:.2f}x (mean {mean:.2f}x)", "", "", "", ""])
            results.append({"config": label, "ratio": median, "mean_ratio": mean})
        for level in ("L1", "mix"):
            ratio = msprobe_ratio(level, args.repeats, args.threads)
            if ratio is not None:
                rows.append([f"msprobe statistics, level {level}", f"{ratio:.2f}x", "", "", "", ""])
                results.append({"config": f"msprobe {level}", "ratio": ratio})
            elif level == "L1":
                rows.append(["msprobe (pip install mindstudio-probe)", "not installed", "", "", "", ""])
    eager_ms = statistics.median(time_eager(model, ids) * 1e3 for _ in range(5))
    print(f"Llama 4x256, batch 2x128, torch {torch.__version__}, {args.threads} threads, "
          f"eager forward {eager_ms:.1f} ms (median of {args.repeats} interleaved runs per row)")
    print(tabulate(rows, headers=["configuration", "vs eager", "op calls", "records", "tensors saved",
                                  "dump MiB"], tablefmt="github"))
    real = [] if args.no_real_size else real_size_rows(args.repeats, tmp / "real")
    if real:
        print(f"\nAt a real size: the same Llama at hidden {REAL_SIZE['hidden']}, 4 layers, "
              f"{REAL_SIZE['batch']}x{REAL_SIZE['seq']} tokens, eager forward {real[0]['eager_ms']:.0f} ms; "
              f"per forward in a session, blocks of {REAL_SIZE['forwards']}")
        print(tabulate([[r["config"], f"{r['ratio']:.2f}x (mean {r['mean_ratio']:.2f}x)"] for r in real],
                       headers=["configuration", "vs eager"], tablefmt="github"))
    half = [] if args.no_half else half_precision_rows(args.repeats, tmp / "half")
    if half:
        print(f"\nIn bfloat16: the reference model's weights and activations, eager forward "
              f"{half[0]['eager_ms']:.0f} ms; per forward in a session (every elementwise call self-checked)")
        print(tabulate([[r["config"], f"{r['ratio']:.2f}x (mean {r['mean_ratio']:.2f}x)"] for r in half],
                       headers=["configuration", "vs eager"], tablefmt="github"))
    if args.json:
        headline = {"eager_ms": eager_ms, "configs": results}
        for r in results:
            key = {"0x102 dedup, no tensors": "dump_ratio_dedup", "0x102 no dedup, no tensors": "dump_ratio_nodedup",
                   "0x102 dedup, X_DUMP_NUM=5": "dump_ratio_dedup_tensors", "msprobe L1": "msprobe_L1_ratio",
                   "0x102 dedup, tracer only": "dump_ratio_dedup_tracer", "0x102 no dedup, tracer only":
                   "dump_ratio_nodedup_tracer",
                   "msprobe mix": "msprobe_mix_ratio",
                   "the defaults (dedup, X_DUMP_NUM=5), per forward in a session": "session_ratio_defaults",
                   "floor": "session_ratio_floor",
                   "0x102 dedup, per forward in a session": "session_ratio_dedup",
                   "0x102 no dedup, per forward in a session": "session_ratio_nodedup",
                   "0x102 no dedup, per forward, inference_mode": "session_ratio_nodedup_inference",
                   "0x102 dedup, per forward, Python row path": "session_ratio_dedup_python",
                   "0x102 no dedup, per forward, Python row path": "session_ratio_nodedup_python"}.get(r["config"])
            if key:
                headline[key] = r["ratio"]
        headline["real_size"] = real
        headline["bfloat16"] = half
        Path(args.json).write_text(json.dumps(headline, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
