"""xray-summary: module dumps and tracer dumps, filters, CSV, bad input, bounded memory."""
from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

import xray
from xray.debugger.capture import CallKey, TensorCapture
from xray.dump import Dump, ModuleDump, TraceDump
from xray.dump.module_writer import ModuleDumpWriter
from xray.demo.models import tiny_llama, token_batch
from xray.summary.cli import main

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
FILE = "globalrank-0_localrank-0.h5"


@pytest.fixture(scope="module")
def module_dump(tmp_path_factory):
    folder = tmp_path_factory.mktemp("md")
    m, ids = tiny_llama(layers=1, hidden=32), token_batch()
    dbg = xray.PrecisionDebugger(dump_path=folder, model=m, step="0-1", task="statistics")
    with torch.no_grad():
        for _ in range(2):
            dbg.start()
            m(ids)
            dbg.stop()
            dbg.step()
    return folder


def test_table_columns_and_filters(module_dump, tmp_path, capsys):
    out = tmp_path / "sum.txt"
    assert main([str(module_dump / FILE), str(out), "--step", "1", "--match", r"q_proj.*forward_output"]) == 0
    text = out.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    header = text.splitlines()[0].split()
    assert header == ["Index", "Step", "Rank", "Module", "Dtype", "Shape", "Min", "Max", "Mean", "Std"]
    body = text.splitlines()[2:]
    assert len(body) == 1 and "model.layers.0.self_attn.q_proj.Linear.0.forward_output.0" in body[0]
    assert body[0].split()[1] == "1" and "2x16x32" in body[0]


def test_csv_matches_the_dump(module_dump, tmp_path):
    out = tmp_path / "sum.csv"
    assert main([str(module_dump), str(out), "--csv", "--rank", "0"]) == 0  # a folder of ranks
    df = pd.read_csv(out)
    with xray.load_dump(module_dump / FILE) as dump:
        rows = list(dump.rows())
    assert len(df) == len(rows) and sorted(df["Step"].unique()) == [0, 1]
    by_name = df[df["Step"] == 0].set_index("Module")
    for r in rows[:20]:
        if r.step == 0 and r.meta.stats.min is not None:
            # 9 significant digits: every float32 value (this model's minima) round-trips exactly
            assert np.float32(by_name.loc[r.name, "Min"]) == np.float32(r.meta.stats.min)
            assert by_name.loc[r.name, "Numel"] == r.meta.numel
    assert main([str(module_dump), str(out), "--csv", "--rank", "3"]) == 0
    assert len(pd.read_csv(out)) == 0


def test_accepts_tracer_dumps(tmp_path, capsys):
    m, ids = tiny_llama(layers=1, hidden=32), token_batch()
    with torch.no_grad(), xray.dump(X_DEDUP=True, X_DUMP_NUM=0, dump_dir=tmp_path) as d:
        m(ids)
    for target in (d.folder, d.folder / "dump.json"):
        assert main([str(target), "--match", "aten.mm"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) > 2 and all("aten.mm" in line for line in lines[2:])


def test_both_formats_are_dumps(module_dump, tmp_path):
    """Every tool takes a ``Dump``: the trace reader and the module reader both provide it."""
    m, ids = tiny_llama(layers=1, hidden=32), token_batch()
    with torch.no_grad(), xray.dump(X_DEDUP=True, X_DUMP_NUM=0, dump_dir=tmp_path) as d:
        m(ids)
    for path, kind in ((d.folder, TraceDump), (module_dump / FILE, ModuleDump)):
        with xray.load_dump(path) as dump:
            assert isinstance(dump, kind) and isinstance(dump, Dump)
            assert dump.records and dump.header and dump.complete and dump.folder.is_dir()


def test_bad_input_gives_one_line_error(module_dump, tmp_path, capsys):
    truncated = tmp_path / "cut.h5"
    truncated.write_bytes((module_dump / FILE).read_bytes()[:4096])
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1, 2]
    unfinished = tmp_path / "unfinished.h5"
    unfinished.write_bytes((module_dump / FILE).read_bytes())
    with h5py.File(unfinished, "a") as f:
        f.attrs["complete"] = False
    cases = [([str(truncated)], "truncated or corrupt"), ([str(foreign)], "not an xray module dump"),
             ([str(unfinished)], "--allow-incomplete"), ([str(module_dump / FILE), "--step", "x"], "'x'"),
             ([str(tmp_path / "missing.h5")], "no such file"), ([str(module_dump), "--match", "("], "regular")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (argv, err)
    assert main([str(unfinished), "--allow-incomplete"]) == 0


_RSS = ("import resource, sys; from xray.summary.cli import main; {call}; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")  # KiB on Linux


def _peak_rss_kib(call: str) -> int:
    out = subprocess.run([sys.executable, "-c", _RSS.format(call=call)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_large_file_is_summarised_in_bounded_memory(tmp_path):
    """A 256 MiB dump (64 tensors of 4 MiB) is listed without reading its tensor data."""
    path = tmp_path / FILE
    writer = ModuleDumpWriter(path, {"global_rank": 0, "local_rank": 0, "rank": 0})
    writer.open()
    capture = TensorCapture(writer, save_data=True, overflow_only=False)
    base = torch.randn(1 << 20)
    for i in range(64):
        call = CallKey(0, i, f"layers.{i}", "Linear", 0, "forward")
        capture.capture(call, "forward_output", "0", base * (i + 1))
    writer.close()
    size_mib = path.stat().st_size / 2**20
    assert size_mib > 250
    baseline = _peak_rss_kib("pass")
    peak = _peak_rss_kib(f"main([{str(path)!r}, {str(tmp_path / 'out.csv')!r}, '--csv'])")
    assert len(pd.read_csv(tmp_path / "out.csv")) == 64
    # Reading the data would add >= 256 MiB; the index and table add a few MiB at most.
    # 48 MiB leaves room for allocator noise while staying far below the file's size.
    assert (peak - baseline) / 1024 < 48, (peak, baseline)
