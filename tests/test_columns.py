"""Format v3: the record index as columns. Records survive the round trip exactly, the file
opens without reading its tables, filters run on the columns, and a killed process's journal
chunks (de-duplicated counts included) rebuild the same records."""
from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import xray
from xray.dump import TruncatedDumpWarning
from xray.dump.column_builder import columns_of
from xray.dump.columns import RECORD_DTYPE, StringTable, Table
from xray.dump.json_index import rewrite_as_json, write_json_index
from xray.dump.reader import TraceDump
from xray.demo.models import tiny_llama, token_batch


@pytest.fixture(scope="module")
def llama_dump(tmp_path_factory):
    """A real model's recording with everything on: modules, backward, stacks, saved tensors,
    de-duplication (counts: the third step folds), non-tensor arguments of every kind the tracer meets."""
    model = tiny_llama(layers=1, hidden=64, heads=2, kv_heads=1, vocab=64, intermediate=96)
    ids = token_batch(batch=1, seq=8, vocab=64)
    with xray.dump(dump_dir=tmp_path_factory.mktemp("llama"), X_DEBUG=0x11e, X_DEDUP=True, X_DUMP_NUM=2) as d:
        for _ in range(3):
            model(ids).logits.float().pow(2).mean().backward()
    return xray.load_dump(d.folder)


def test_records_survive_the_columns_exactly(llama_dump, tmp_path):
    records = list(llama_dump.records)
    assert len(records) > 100 and any(r.count > 1 for r in records) and any(r.kind == "module" for r in records)
    assert any(r.stack for r in records) and any(r.direction == "backward" for r in records)
    # through the writer and index file (recorded), and through columns built in memory
    assert list(columns_of(records).iter_records()) == records
    # and through the JSON of version 2 and back
    write_json_index(llama_dump, tmp_path / "dump.json")
    for seg in llama_dump.folder.glob("tensors-*.h5"):
        (tmp_path / seg.name).write_bytes(seg.read_bytes())
    assert list(xray.load_dump(tmp_path).records) == records
    assert json.loads((tmp_path / "dump.json").read_text())["format_version"] == 2


def test_random_access_and_iteration_agree(llama_dump):
    records = llama_dump.records
    assert [records[i] for i in range(len(records))] == list(records)
    assert records[-1] == records[len(records) - 1]
    assert list(records[5:9]) == [records[i] for i in range(5, 9)]
    with pytest.raises(IndexError):
        records[len(records)]


def test_filters_run_on_the_columns(llama_dump):
    records = list(llama_dump.records)
    mm = llama_dump.select(op="aten.mm.default")
    assert len(mm) and [r.seq for r in mm] == [r.seq for r in records if r.op == "aten.mm.default"]
    attn = llama_dump.select(module="model.layers.0.self_attn", kind="op", direction="forward")
    assert [r.seq for r in attn] == [r.seq for r in records if r.kind == "op" and r.direction == "forward" and (
        r.module == "model.layers.0.self_attn" or (r.module or "").startswith("model.layers.0.self_attn."))]
    lo, hi = records[10].seq, records[20].seq
    assert [r.seq for r in llama_dump.select(seq=(lo, hi))] == [r.seq for r in records if lo <= r.seq < hi]
    assert len(llama_dump.select(op="aten.no_such_op.default")) == 0


def test_columns_hold_what_the_records_hold(llama_dump):
    cols = llama_dump.columns
    records = list(llama_dump.records)
    r, t = cols.records, cols.tensors
    assert len(r) == len(records) and r["t_end"][-1] == len(t)
    assert r["seq"].tolist() == [x.seq for x in records] and r["count"].tolist() == [x.count for x in records]
    known = (t["role"] == 1) & (t["has_stats"] == 1) & (t["absent"] & 2 == 0)  # outputs with a max
    expected = [m.stats.max for x in records for _, m in x.output_tensors() if m.stats and m.stats.max is not None]
    assert t["max"][known].tolist() == expected


def test_string_table_round_trip_and_checks():
    table = StringTable()
    ids = [table.intern(s) for s in ["a", "bé", "", "a", "x" * 1000]]
    assert ids == [0, 1, 2, 0, 3]
    back = StringTable.from_arrays(*table.to_arrays())
    assert [back[i] for i in range(len(back))] == ["a", "bé", "", "x" * 1000]
    assert back.intern("bé") == 1 and back.intern("new") == 4
    blob, ends = table.to_arrays()
    with pytest.raises(ValueError, match="ascending"):
        StringTable.from_arrays(blob, ends[::-1].copy())


def test_an_empty_dump_has_empty_columns(tmp_path):
    with xray.dump(dump_dir=tmp_path):
        pass
    dump = xray.load_dump(next(tmp_path.iterdir()))
    assert len(dump.records) == 0 and len(dump.columns.tensors) == 0 and list(dump.records) == []
    assert len(Table.from_rows(RECORD_DTYPE, [])) == 0


KILLED = textwrap.dedent("""
    import os, signal, sys, torch, xray
    xray.begin_dump(dump_dir=sys.argv[1], X_DEDUP=True, flush_records=4, flush_seconds=1e9)
    x = torch.ones(4)
    for i in range(30):
        x = torch.tanh(x) * 1.5   # two signatures, counted up across many chunks
        if i % 7 == 0:
            torch.zeros(i + 1)    # a new record now and then, so chunks keep coming
    torch.ones(2).sum()
    xray.end_dump(clear_context=False)   # dump.json and the index for what came so far
    xray.begin_dump()                    # ... and recording goes on
    torch.cos(x)
    for i in range(12):
        torch.zeros(100 + i)      # more chunks after the snapshot
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.slow
def test_killed_process_journal_chunks_keep_counts(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    (folder,) = list(tmp_path.iterdir())
    snapshot = xray.load_dump(folder)  # dump.json names the index end_dump(clear_context=False) wrote
    counts = collections.Counter()
    for r in snapshot.records:  # the first tanh reads a factory's output, the others mul's: two records
        counts[r.op] += r.count
    assert counts["aten.tanh.default"] == 30 and counts["aten.mul.Tensor"] == 30
    (folder / "dump.json").unlink()  # as if the process had died before that snapshot too
    with pytest.warns(TruncatedDumpWarning, match="not finalised"):
        partial = xray.load_dump(folder)
    ops = [r.op for r in partial.records]
    assert "aten.cos.default" in ops and len([o for o in ops if o == "aten.zeros.default"]) >= 12
    assert sum(r.count for r in partial.records if r.op == "aten.tanh.default") == 30


def test_rewrite_as_json_keeps_every_record(llama_dump, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(llama_dump.folder, copy)
    rewrite_as_json(copy)
    assert not list(copy.glob("index-*.h5"))
    assert list(xray.load_dump(copy).records) == list(llama_dump.records)


def test_old_record_dumps_get_columns_on_demand(llama_dump):
    old = TraceDump(llama_dump.folder, llama_dump.header, list(llama_dump.records), True)
    assert list(old.columns.iter_records()) == list(llama_dump.records)
    assert [r.seq for r in old.select(op="aten.mm.default")] == [r.seq for r in llama_dump.select(op="aten.mm.default")]


def test_export_json_cli_writes_every_record(llama_dump, tmp_path, capsys):
    from xray.cli import main

    out = tmp_path / "records.json"
    assert main(["export-json", str(llama_dump.folder), "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["format_version"] == 2 and "index" not in data
    assert data["records"] == [r.to_json() for r in llama_dump.records]
    assert main(["export-json", str(tmp_path / "nope"), "-o", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_load_dump_picks_one_rank_of_a_multi_rank_folder(llama_dump, tmp_path):
    import shutil

    for r in (0, 1):
        shutil.copytree(llama_dump.folder, tmp_path / f"rank_{r}")
    with pytest.raises(xray.DumpFormatError, match="holds 2 dumps"):
        xray.load_dump(tmp_path)
    assert xray.load_dump(tmp_path, rank=1).folder == tmp_path / "rank_1"
    with pytest.raises(xray.DumpFormatError, match="no rank_5"):
        xray.load_dump(tmp_path, rank=5)


def test_packed_columns_equal_numpy_conversion(monkeypatch):
    """The writer's C conversion of cells into columns (xray/dump/_pack.c) gives numpy's
    columns, and hands numpy whatever it does not convert itself (a float in an integer
    column is truncated by numpy; a value out of a column's range is refused by both)."""
    from xray.dump import column_builder as cb

    if cb._pack is None:
        pytest.skip("the C extension is not built")
    rows = [(1, 0, -1.5, 2.0, 0.25, 1.0, 0, 0, 0, 10), (True, 15, 0.0, 0.0, 0.0, 0.0, 3, 1, 2, 2 ** 40),
            (np.uint8(1), np.int64(2), np.float32(0.5), 1, 2, 3, 4, 5, 6, 7)]
    packed = cb._columns(rows, cb._STATS)
    monkeypatch.setattr(cb, "_pack", None)
    reference = cb._columns(rows, cb._STATS)
    for name in cb._STATS.names:
        assert packed[name].dtype == reference[name].dtype and np.array_equal(packed[name], reference[name]), name
    monkeypatch.undo()
    truncated = cb._columns([(1, 0, 0.0, 0.0, 0.0, 0.0, 1.7, 0, 0, 1)], cb._STATS)  # numpy's path
    assert truncated["nan"][0] == 1
    with pytest.raises(OverflowError):
        cb._columns([(300, 0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 1)], cb._STATS)
