"""Recording memory follows the flush size, not the length of the recording: what a flushed
record leaves in memory, and what end_dump holds while it writes the index, are bounded.

The goal they are derived from: a 10M-call recording stays under 1 GB of resident memory,
end_dump included, so that a call may leave at most 100 B behind (tools/bench_record_memory.py
measures the resident figures themselves)."""
from __future__ import annotations

import errno
import gc
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

import xray
from xray.dump import index_file, load_dump
from xray.dump.columns import RECORD_DTYPE, TENSOR_DTYPE
from xray.dump.dispatch_modes import no_dispatch_modes
from xray.dump.errors import TruncatedDumpWarning
from xray.record.session import active_session

PER_CALL = 100  # bytes a flushed call may leave in memory: 1 GB / 10M calls
FLUSH = 512  # records per flush (and no flush by time): every measure starts and ends on a flush


def _loop(calls: int, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    for _ in range(calls // 2):
        (x * a) + b  # two records a turn, three tensor rows each (with their samples)


def _end_if_open() -> None:
    """A failed test leaves no dump recording the next one."""
    if active_session() is not None:
        xray.end_dump()


def _settled() -> None:
    """Garbage collected, and the dead tensors' entries the recorder's tables drop in batches
    (a bounded amount, up to a few thousand entries) dropped now, so that a measure sees growth."""
    gc.collect()
    session = active_session()
    if session is not None:
        session.recorder.producers._sweep()
        session.recorder._stats.sweep()


def _traced(fn) -> tuple[int, int]:
    """(bytes ``fn`` left allocated, its peak above what was allocated before it), by tracemalloc."""
    _settled()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    fn()
    _settled()
    now, peak = tracemalloc.get_traced_memory()
    return now - before, peak - before


@pytest.mark.slow
def test_flushed_records_leave_nothing_behind_and_end_dump_streams(tmp_path, monkeypatch):
    calls = 8 * FLUSH
    monkeypatch.setattr(index_file, "BATCH_ROWS", 4096)  # end_dump holds one batch of rows at a time
    x, a, b = torch.randn(16), torch.randn(16), torch.randn(16)
    # begun first: its first start imports torch._dynamo, slow to trace and no part of the measure
    xray.begin_dump(X_DEDUP=False, X_DUMP_NUM=0, dump_dir=tmp_path, flush_records=FLUSH, flush_seconds=1e9)
    tracemalloc.start()
    try:
        _loop(2 * FLUSH, x, a, b)  # plans, strings and caches made: what every later call shares
        kept, _ = _traced(lambda: _loop(calls, x, a, b))
        folder = []
        _, end_peak = _traced(lambda: folder.append(xray.end_dump()))
    finally:
        tracemalloc.stop()
        _end_if_open()
    assert kept / calls < PER_CALL, f"{kept / calls:.0f} B a call stayed in memory after its flush"
    # one batch of 4096 rows and its copy, the strings and the HDF5 file's own buffers: not the
    # whole index (about 1.2 KB a call here, 6 MB)
    assert end_peak < 8 << 20, f"end_dump held {end_peak / 2**20:.1f} MiB for {calls} calls"
    with load_dump(folder[0]) as dump:
        assert len(dump.columns) == 2 * FLUSH + calls
        assert np.array_equal(dump.columns.records["seq"], np.arange(2 * FLUSH + calls))


class _FullDisk:
    """A file whose writes fail with ENOSPC after ``room`` bytes, as on a full disk."""

    def __init__(self, path, mode: str, room: int) -> None:
        self._file = open(path, mode)
        self._room = room

    def write(self, data) -> int:
        self._room -= len(memoryview(data).cast("B"))
        if self._room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


@pytest.mark.parametrize("room", [0, 200_000])
def test_a_full_disk_while_end_dump_writes_the_index_leaves_the_journal(tmp_path, monkeypatch, room):
    """The index is written from the journal chunks; when the disk fills meanwhile, end_dump
    warns, no partial index is left, and the journal still holds every record."""
    def full_for_the_index(path, mode="r", *args, **kw):
        if Path(path).name.startswith("index-"):
            return _FullDisk(path, mode, room)
        return open(path, mode, *args, **kw)

    monkeypatch.setattr(index_file, "open", full_for_the_index, raising=False)
    monkeypatch.setattr(index_file, "BATCH_ROWS", 256)
    x, a, b = torch.randn(16), torch.randn(16), torch.randn(16)
    xray.begin_dump(X_DEDUP=False, X_DUMP_NUM=0, dump_dir=tmp_path, flush_records=100)
    try:
        _loop(1000, x, a, b)
        with pytest.warns(RuntimeWarning, match="No space left"):
            folder = xray.end_dump()
    finally:
        _end_if_open()
    assert not list(folder.glob("index-*")) and not (folder / "dump.json").exists()
    monkeypatch.undo()
    with pytest.warns(TruncatedDumpWarning), load_dump(folder) as dump:
        assert np.array_equal(dump.columns.records["seq"], np.arange(1000))


def test_the_index_end_dump_writes_holds_what_the_journal_holds(tmp_path, monkeypatch):
    """Written from the journal chunks a few rows at a time, the index is the journal's records
    with their final counts: every column, the folds, the samples and the texts."""
    monkeypatch.setattr(index_file, "BATCH_ROWS", 50)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    xray.begin_dump(X_DEBUG=0x11A, X_DUMP_NUM=1, dump_dir=tmp_path / "rec", flush_records=7, flush_seconds=1e9)
    try:
        for step in range(3):
            model(x * step).sum().backward()
        _loop(600, x, x, x)  # folded calls (after the pass's 64 records of each key)
        session = active_session()
        with no_dispatch_modes():
            session.writer.flush()  # everything in the journal: what a killed process leaves
        shutil.copytree(session.folder, tmp_path / "journal")
        folder = xray.end_dump()
    finally:
        _end_if_open()
    with pytest.warns(TruncatedDumpWarning):
        journal = load_dump(tmp_path / "journal")
    with load_dump(folder) as whole, journal:
        a, b = whole.columns, journal.columns
        assert len(a.tensors) > 100 and len(a.folds) >= 290 and a.sample_n is not None  # many batches
        for table in ("records", "tensors"):
            for name in RECORD_DTYPE.names if table == "records" else TENSOR_DTYPE.names:
                assert np.array_equal(getattr(a, table)[name], getattr(b, table)[name]), (table, name)
        assert np.array_equal(a.folds, b.folds)
        assert np.array_equal(a.sample_n, b.sample_n) and np.array_equal(a.sample, b.sample)
        assert a.strings.texts() == b.strings.texts()
