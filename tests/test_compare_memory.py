"""Compare's memory on a run that diverged at its first op: every row after it fails, and
attribution reads every pair; what it holds per failing row must stay small.

The goal (issue 44): a 1M-record all-failing compare under 2,000 MiB peak RSS. The identical pair
of that size peaks at 1,850 MiB and enters attribution at 1,760 MiB (tools/bench_bigdump.py
--failing, docs/benchmarks.md), so attribution may add ~240 bytes a failing row. A failing row's
own explanation (its culprit text, ~120 bytes) is part of that: what attribution keeps besides,
per row, must stay near 100 bytes; ``BOUND`` leaves that headroom. Objects per pair (Entries with
their Records, six dicts) held to the end were ~6 KB a row.
"""
from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest

from xray.compare import compare_dumps, entry_records
from xray.compare.pending import PendingRun
from xray.dump.model import Record, Stats, TensorMeta
from xray.dump.writer import DumpWriter

OPS = ("aten.mm.default", "aten.add.Tensor", "aten.mul.Tensor", "aten.silu.default")
BOUND = 240  # bytes a failing row may add over a passing one (see the module docstring)


def _chain(folder: Path, n: int, scale: float) -> Path:
    """A stats-only trace of ``n`` ops, each fed by the one before (format-v2 sources); ``scale``
    multiplies every output statistic, so with ``scale != 1`` every row fails from the first op."""
    rng = random.Random(0)
    writer = DumpWriter(folder, {"pid": 0, "rank": None, "config": {}})
    prev = Stats(min=-1.0, max=1.0, mean=0.0, std=0.5, numel=256)
    for seq in range(n):
        mean, std = rng.gauss(0.0, 0.1), rng.uniform(0.5, 2.0)
        out = Stats(min=(mean - 4 * std) * scale, max=(mean + 4 * std) * scale, mean=mean * scale,
                    std=std * scale, numel=256)
        rec = Record(seq=seq, kind="op", op=OPS[seq % len(OPS)], module=f"layers.{seq // 16}")
        rec.inputs = {"self": TensorMeta(shape=(4, 64), dtype="float32", stride=(64, 1), stats=prev,
                                         source=f"op:{seq - 1}:0" if seq else "input")}
        rec.outputs = [TensorMeta(shape=(4, 64), dtype="float32", stride=(64, 1), stats=out)]
        writer.add(rec)
        prev = out
    writer.close({})
    return folder


def _peak(bench: Path, target: Path) -> tuple[int, dict]:
    tracemalloc.start()
    try:
        result = compare_dumps(bench, target, progress=False)
        return tracemalloc.get_traced_memory()[1], result.status_counts()
    finally:
        tracemalloc.stop()


def test_a_failing_row_adds_little_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A million-row run reads far more entries than Entries keep and judges its pairs' inputs a
    # block at a time: so does this one, with the cache and the blocks made small.
    monkeypatch.setattr(entry_records, "HOLD", 0)
    monkeypatch.setattr(entry_records, "CACHE", 16)
    monkeypatch.setattr(entry_records, "BLOCK", 8)
    monkeypatch.setattr(PendingRun, "JUDGED", 8)
    sizes = (40, 120)
    for n in sizes:
        _chain(tmp_path / f"bench{n}", n, 1.0)
        _chain(tmp_path / f"fail{n}", n, 1.5)
    compare_dumps(tmp_path / "bench40", tmp_path / "fail40", progress=False)  # imports, caches: once
    peaks = {}
    for n in sizes:
        peaks["same", n], counts = _peak(tmp_path / f"bench{n}", tmp_path / f"bench{n}")
        assert counts == {"pass": n}
        peaks["fail", n], counts = _peak(tmp_path / f"bench{n}", tmp_path / f"fail{n}")
        assert counts == {"fail": n}
    # bytes per row, as the slope between the two sizes: what every compare holds once cancels
    per_row = {kind: (peaks[kind, sizes[1]] - peaks[kind, sizes[0]]) / (sizes[1] - sizes[0]) for kind in ("same", "fail")}
    extra = per_row["fail"] - per_row["same"]
    assert extra < BOUND, f"a failing row adds {extra:.0f} bytes over a passing one ({per_row})"
