"""Statistics in batches (issue 30): outputs queued per device, bounded by count and bytes, reduced
a batch at a time on their device, read back once per flush.

An accelerator is not needed to test the logic: ``XRAY_DEFERRED_STATS=1`` queues CPU tensors too,
and ``XRAY_STATS_BATCH`` sets the bounds. The numbers must be the immediate path's under the rules
tests/test_stats_deferred.py derives (min/max/counts exact; mean/std within 1e-5 of the tensor's
magnitude), and a tensor written in place after its call must keep the values it had at the call.
"""
from __future__ import annotations

import importlib

import pytest
import torch

import xray
from xray.demo.models import bench_llama, token_batch
from xray.dump.dispatch_modes import no_dispatch_modes

stats_mod = importlib.import_module("xray.dump.stats")


def _record(tmp_path, fn, monkeypatch, mode: str, batch: str = "8,1048576"):
    monkeypatch.setenv("XRAY_DEFERRED_STATS", mode)
    monkeypatch.setenv("XRAY_STATS_BATCH", batch)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path / mode, X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0,
                                   flush_records=64) as d:
        fn()
    deferred = d.recorder.deferred
    return xray.load_dump(d.folder), deferred


def _stats(dump) -> list:
    return [(r.op, m.stats) for r in dump.records for _, m in (*r.input_tensors(), *r.output_tensors())
            if m.stats is not None]


def _same(sync: list, queued: list) -> None:
    assert [op for op, _ in sync] == [op for op, _ in queued]
    for (op, s), (_, q) in zip(sync, queued):
        assert (s.min, s.max, s.nan, s.posinf, s.neginf, s.numel) == (q.min, q.max, q.nan, q.posinf, q.neginf, q.numel), op
        if s.mean is None:
            assert q.mean is None and q.std is None, op
            continue
        scale = max(abs(s.min), abs(s.max), 1e-30)
        assert abs(s.mean - q.mean) <= 1e-5 * scale and abs(s.std - q.std) <= 1e-5 * scale, (op, s, q)


@pytest.mark.slow
def test_queued_statistics_equal_the_immediate_ones_on_a_llama(tmp_path, monkeypatch):
    model, ids = bench_llama(), token_batch(batch=2, seq=32, vocab=1000)
    sync, _ = _record(tmp_path, lambda: model(ids), monkeypatch, "0")
    queued, deferred = _record(tmp_path, lambda: model(ids), monkeypatch, "1")
    assert len(_stats(sync)) >= 300
    _same(_stats(sync), _stats(queued))
    # batches of at most 8 tensors, each tensor reduced once; far fewer host transfers than batches
    assert deferred.launched >= 200 and deferred.batches >= deferred.launched / 8
    assert deferred.transfers < deferred.batches / 2  # one per writer flush, not one per batch
    assert deferred.queued == 0


def test_a_tensor_written_in_place_after_its_call_keeps_its_values(tmp_path, monkeypatch):
    """Queued outputs written later by an in-place call, or through a view: each record holds
    the values at its call (the immediate path's)."""
    x = torch.arange(-8.0, 8.0).reshape(4, 4)

    def run():
        y = x * 2  # queued, then written by add_
        y.add_(100)
        z = x + 1  # queued, then written through a view
        z.view(-1)[:3].zero_()
        w = x - 1  # queued, then written by an in-place call whose input is queued at once
        w.mul_(-1)
        e = x.expand(3, 4, 4)  # expanded: reduced over its stored values
        e.sum()

    sync, _ = _record(tmp_path, run, monkeypatch, "0")
    queued, deferred = _record(tmp_path, run, monkeypatch, "1", batch="1000,1073741824")
    _same(_stats(sync), _stats(queued))
    mul = next(m.stats for r in queued.records if r.op == "aten.mul.Tensor" for _, m in r.output_tensors())
    assert (mul.min, mul.max) == (-16.0, 14.0)  # before add_
    add = next(m.stats for r in queued.records if r.op == "aten.add.Tensor" for _, m in r.output_tensors())
    assert (add.min, add.max) == (-7.0, 8.0)  # before the zero_ through a view
    expand = next(m.stats for r in queued.records if r.op == "aten.expand.default" for _, m in r.output_tensors())
    assert expand.numel == 48 and (expand.min, expand.max) == (-8.0, 7.0)


def test_a_write_while_paused_does_not_reach_queued_statistics(tmp_path, monkeypatch):
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "1")
    monkeypatch.setenv("XRAY_STATS_BATCH", "1000,1073741824")
    x = torch.arange(6.0)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0) as d:
        y = x * 3
        late = torch.full((2,), 5.0)
        with no_dispatch_modes():  # as the recorder calls it: its own ops unrecorded
            held = d.recorder.deferred.launch(late)  # queued now, whatever the writer flushed before
        assert d.recorder.deferred.queued >= 1
        d.pause()
        assert d.recorder.deferred.queued == 0  # reduced on the device as the recording paused
        y.fill_(-1.0)  # unseen by the recorder
        late.fill_(-1.0)
        d.start()
        y + 1
    assert held.max == 5.0
    (mul,) = [m.stats for r in xray.load_dump(d.folder).records if r.op == "aten.mul.Tensor"
              for _, m in r.output_tensors()]
    assert (mul.min, mul.max) == (0.0, 15.0)


def test_the_queue_is_bounded_by_count_and_by_bytes():
    by_count = stats_mod.DeferredStats(batch_count=4, batch_bytes=1 << 30)
    handles = [by_count.launch(torch.full((3,), float(i))) for i in range(10)]
    assert (by_count.batches, by_count.queued, by_count.transfers) == (2, 2, 0)  # after 4 and 8
    by_count.resolve()
    assert (by_count.batches, by_count.queued, by_count.transfers) == (3, 0, 1)
    assert [h.max for h in handles] == [float(i) for i in range(10)]
    by_bytes = stats_mod.DeferredStats(batch_count=1000, batch_bytes=100)
    for i in range(6):
        by_bytes.launch(torch.full((16,), float(i)))  # 64 bytes: every second one fills a batch
    assert (by_bytes.batches, by_bytes.queued) == (3, 0)


def test_bounds_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("XRAY_STATS_BATCH", "32, 4096")
    assert (stats_mod.DeferredStats().batch_count, stats_mod.DeferredStats().batch_bytes) == (32, 4096)
    monkeypatch.setenv("XRAY_STATS_BATCH", "nonsense")
    assert stats_mod.batch_bounds() == stats_mod.BATCH_DEFAULT


def test_each_device_type_takes_its_own_batch_kernel(monkeypatch):
    """A fused kernel registers per device type (cuda, xpu, mps, privateuse1...); the batch goes
    to it whole, and what it writes is what resolve reads."""
    seen = []

    def kernel(items):
        seen.append(len(items))
        stats_mod._rows_one_by_one(items)

    monkeypatch.setitem(stats_mod.BATCH_KERNELS, "cpu", kernel)
    deferred = stats_mod.DeferredStats(batch_count=3)
    handles = [deferred.launch(torch.tensor([1.0, float(i), float("inf")])) for i in range(5)]
    deferred.resolve()
    assert seen == [3, 2]
    assert [(h.max, h.posinf, h.nan) for h in handles] == [(max(1.0, float(i)), 1, 0) for i in range(5)]
