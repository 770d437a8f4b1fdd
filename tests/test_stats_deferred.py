"""Deferred ("device") statistics: O(flushes) host transfers, same numbers as the synchronous path.

On an accelerator the recorder launches each tensor's statistics on the device into a
preallocated buffer and reads the buffer back once per writer flush (docs/performance.md).
``XRAY_DEFERRED_STATS=1`` takes that path on CPU too, so the property is checked here: the
device-to-host reads it makes are counted during a recorded Llama forward.

What counts as a host read: every scalar extraction ``aten::_local_scalar_dense`` (``.item()``,
``float(t)``, ``int(t)``, ``bool(t)`` all end there; counted by torch.profiler), plus
``Tensor.tolist``, ``Tensor.numpy``, ``Tensor.item`` and ``Tensor.cpu`` calls from Python (counted
by patching; ``tolist`` of a CPU tensor reads memory without an ATen call). On CUDA, ``tolist``
and ``.cpu()`` are the device-to-host copies, ``_local_scalar_dense`` is the per-scalar sync.
"""
from __future__ import annotations

import importlib
import math

import pytest
import torch

import xray
from xray.demo.models import bench_llama, token_batch
from xray.dump.writer import DumpWriter

stats_mod = importlib.import_module("xray.dump.stats")


class HostReads:
    """Counts host reads (see the module docstring) and writer flushes while active."""

    def __init__(self, monkeypatch) -> None:
        self.python = 0
        self.flushes = 0
        for name in ("tolist", "numpy", "item", "cpu"):
            monkeypatch.setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name)))
        flush = DumpWriter.flush

        def counted_flush(writer, *a, **k):
            self.flushes += 1
            return flush(writer, *a, **k)

        monkeypatch.setattr(DumpWriter, "flush", counted_flush)

    def _counting(self, method):
        def counted(t, *a, **k):
            self.python += 1
            return method(t, *a, **k)
        return counted

    def run(self, fn) -> int:
        """Host reads made by ``fn`` (scalar extractions + patched Python calls)."""
        self.python = 0
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
        scalars = sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")
        return scalars + self.python


def _record(tmp_path, model, ids, **kw):
    holder = {}

    def forward():
        with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0,
                                       flush_records=64, **kw) as d:
            model(ids)
        holder["dump"] = d
    return forward, holder


def _described(folder) -> list:
    dump = xray.load_dump(folder)
    return [m.stats for r in dump.records for _, m in (*r.input_tensors(), *r.output_tensors())
            if m.stats is not None]


@pytest.fixture(scope="module")
def llama():
    return bench_llama(), token_batch(batch=2, seq=32, vocab=1000)


@pytest.mark.slow
def test_deferred_statistics_read_the_host_once_per_flush(tmp_path, monkeypatch, llama):
    model, ids = llama
    reads = HostReads(monkeypatch)
    with torch.no_grad():
        own = reads.run(lambda: model(ids))  # the model's own host reads, recorded or not
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "1")
    forward, holder = _record(tmp_path / "d", model, ids)
    reads.flushes = 0
    total = reads.run(forward)
    described = _described(holder["dump"].folder)
    assert len(described) >= 300 and reads.flushes >= 5  # 64-record flushes over ~320 records
    assert total - own <= 2 * reads.flushes, (total, own, reads.flushes, len(described))


@pytest.mark.slow
def test_the_counter_sees_per_tensor_reads(tmp_path, monkeypatch, llama):
    """The same count on the synchronous torch path (no native extension): one read per
    statistic per tensor, so the bound above would fail; the counter is not blind."""
    model, ids = llama
    reads = HostReads(monkeypatch)
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "0")
    monkeypatch.setattr(stats_mod, "_NATIVE_KINDS", {})
    forward, holder = _record(tmp_path / "d", model, ids)
    total = reads.run(forward)
    assert total > 2 * reads.flushes + 100 and total >= 150, (total, reads.flushes)


def _close(a: float | None, b: float | None, scale: float, rel: float) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= rel * scale


def test_deferred_statistics_equal_the_synchronous_ones(tmp_path, monkeypatch, llama):
    """Record the same forward both ways. min/max/counts are exact (float64 holds every float32
    value). mean/std may differ by summation order only: the native path sums float32 lanes in
    blocks of at most 128 terms before adding them up in float64 (relative error per block
    <= 128 * 2**-24 ~ 8e-6 of the sum of magnitudes, so |d mean| <= 8e-6 * max|x|), and takes
    std as sqrt(E[x^2] - mean^2) where the deferred path centres on the mean first (exact
    two-pass). Bound used: 1e-5 of the tensor's magnitude max(|min|, |max|), for both."""
    model, ids = llama
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "0")
    forward, holder = _record(tmp_path / "sync", model, ids)
    forward()
    sync = _described(holder["dump"].folder)
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "1")
    forward, holder = _record(tmp_path / "deferred", model, ids)
    forward()
    deferred = _described(holder["dump"].folder)
    assert len(sync) == len(deferred) >= 300
    for s, d in zip(sync, deferred):
        assert (s.min, s.max, s.nan, s.posinf, s.neginf, s.numel) == (d.min, d.max, d.nan, d.posinf, d.neginf, d.numel)
        scale = max(abs(s.min), abs(s.max), 1e-30) if s.min is not None else 0.0
        assert _close(s.mean, d.mean, scale, 1e-5) and _close(s.std, d.std, scale, 1e-5), (s, d)


NONFINITE = [
    torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 3.0]),
    torch.tensor([float("nan"), float("nan")]),
    torch.tensor([float("inf"), 2.0, float("inf")]),
    torch.tensor([[1.0, float("nan")], [5.0, -float("inf")]]).t(),
    torch.tensor([1e30, -1e30, float("nan")], dtype=torch.float32),
    torch.tensor([1.0, float("nan"), 2.0], dtype=torch.bfloat16),
    torch.full((7,), 0.1),
    torch.tensor([1000.0 + i * 1e-3 for i in range(100)], dtype=torch.float64),  # |mean| >> std
    torch.arange(12, dtype=torch.int32).reshape(3, 4)[:, 1:],
    torch.tensor([True, False, True]),
    torch.empty(0),
]


@pytest.mark.parametrize("t", NONFINITE, ids=range(len(NONFINITE)))
def test_deferred_semantics_match_tensor_stats(t):
    """Finite elements only for min/max/mean/std, NaN/+Inf/-Inf counted: as tests/test_stats.py."""
    deferred = stats_mod.DeferredStats(capacity=2)
    handles = [deferred.launch(t), deferred.launch(t.clone()), deferred.launch(t)]  # fills the buffer once
    deferred.resolve()
    want = stats_mod.tensor_stats(t)
    for got in handles:
        assert (got.min, got.max, got.nan, got.posinf, got.neginf, got.numel) == \
            (want.min, want.max, want.nan, want.posinf, want.neginf, want.numel)
        for a, b in ((got.mean, want.mean), (got.std, want.std)):
            assert (a is None and b is None) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (got, want)
    assert deferred.transfers == (0 if t.numel() == 0 else 2)


def test_a_full_buffer_is_read_back_early():
    deferred = stats_mod.DeferredStats(capacity=4)
    handles = [deferred.launch(torch.full((3,), float(i))) for i in range(10)]
    assert deferred.transfers == 2  # after 4 and 8 launches
    deferred.resolve()
    assert deferred.transfers == 3 and [h.max for h in handles] == [float(i) for i in range(10)]


def test_deferred_launches_in_and_out_of_inference_mode():
    """The buffer is a normal tensor wherever it was first needed, and rows never join autograd."""
    deferred = stats_mod.DeferredStats(capacity=2)
    with torch.inference_mode():
        a = deferred.launch(torch.full((3,), 1.0))
    b = deferred.launch(torch.full((3,), 2.0, requires_grad=True) * 1)
    with torch.inference_mode():
        c = deferred.launch(torch.full((3,), 3.0))
    deferred.resolve()
    assert [s.max for s in (a, b, c)] == [1.0, 2.0, 3.0]


def test_a_sink_without_before_flush_gets_synchronous_statistics(monkeypatch):
    """The module debugger's op sink encodes each record as it arrives: never placeholders."""
    from xray.record.config import DumpConfig
    from xray.record.tracer import Recorder

    class Sink:
        def add(self, record):
            pass

    monkeypatch.setenv("XRAY_DEFERRED_STATS", "1")
    recorder = Recorder(DumpConfig(), Sink())
    assert recorder.stats(torch.full((3,), 2.0)).max == 2.0


# -- writes the dispatcher does not see (issue 44, item 7) ------------------------------------------

def _written_behind_the_dispatcher(tmp_path, monkeypatch, batch: str | None = None):
    """``y = x + 0.1``, then ``y.numpy()[0] = 100``: a write no dispatcher call makes, as raw
    Triton or extension kernels, DLPack consumers and CUDA graph replays make them on a GPU."""
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "1")
    if batch is not None:
        monkeypatch.setenv("XRAY_STATS_BATCH", batch)
    x = torch.tensor([1.0, 2.0, 4.0, 3.0])
    # flush_seconds: no time-driven flush between the call and the write on a slow machine
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0,
                                   flush_seconds=1e9) as d:
        y = x + 0.1
        y.numpy()[0] = 100.0
    (add,) = [m.stats for r in xray.load_dump(d.folder).records if r.op == "aten.add.Tensor"
              for _, m in r.output_tensors()]
    return add, d.recorder.deferred


def test_a_write_behind_the_dispatcher_never_lands_in_deferred_statistics(tmp_path, monkeypatch):
    """The batch reads y after the write: its numbers (max 100) are not the call's (max 4.1), so
    they are withheld, and said so; the sample, read at the call, stays the call's."""
    with pytest.warns(RuntimeWarning, match="changed between their call"):
        add, deferred = _written_behind_the_dispatcher(tmp_path, monkeypatch)
    assert (add.min, add.max, add.mean, add.std) == (None, None, None, None)
    assert (add.nan, add.posinf, add.neginf, add.numel) == (0, 0, 0, 4)
    assert add.sample == tuple(float(v) for v in torch.tensor([1.1, 2.1, 4.1, 3.1]))
    assert deferred.withheld == 1


def test_statistics_taken_at_each_call_see_no_later_write(tmp_path, monkeypatch):
    """``XRAY_STATS_BATCH=1,1``: each tensor is reduced at its call (on a GPU: enqueued on its
    stream then, ahead of any later kernel on that stream)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        add, deferred = _written_behind_the_dispatcher(tmp_path, monkeypatch, batch="1,1")
    assert add.max == float(torch.tensor(4.1)) and add.min == float(torch.tensor(1.1))
    assert deferred.withheld == 0


def test_a_version_counter_moved_before_the_batch_withholds_the_statistics():
    """A dispatcher write the recorder did not watch (another thread, a mode switched off)."""
    deferred = stats_mod.DeferredStats()
    t = torch.arange(100.0)
    moved, kept = deferred.launch(t), deferred.launch(torch.arange(100.0))
    t[99] = -5.0  # position 99 need not be sampled: the counter says it
    with pytest.warns(RuntimeWarning):
        deferred.resolve()
    assert moved.max is None and moved.sample is not None and min(moved.sample) >= 0.0
    assert (kept.min, kept.max) == (0.0, 99.0) and deferred.withheld == 1


@pytest.mark.parametrize("training", [True, False])
def test_a_batch_norm_reads_the_queued_statistics_first_only_where_it_writes(tmp_path, monkeypatch, training):
    """A batch norm writes its running statistics only in training (its schema does not say
    so: record/encode.py, ``writes_now``). Each write first reduces the queued statistics (on an
    accelerator, one batch early); an eval call writes nothing and queues on."""
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "1")
    writes = []
    before_write = stats_mod.DeferredStats.before_write
    monkeypatch.setattr(stats_mod.DeferredStats, "before_write", lambda self: (writes.append(1), before_write(self)))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.BatchNorm2d(8)).train(training)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEBUG=0x102, X_DEDUP=False) as d:
        model(torch.randn(2, 3, 8, 8))
    assert d.recorder.deferred.used
    # training: each batch norm, and the in-place add_ that counts its batches; eval: none; then
    # one as the recording stops (what runs while it is stopped goes unseen)
    assert len(writes) == (4 if training else 0) + 1
