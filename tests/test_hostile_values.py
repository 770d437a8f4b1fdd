"""Values a hostile or unlucky dump or spec holds: names that are spreadsheet formulas, float64
statistics near 1e200, a YAML alias bomb (issue 31, items 10, 11 and 14)."""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

import xray
from xray.dump import csv_cells
from xray.compare.cli import main as compare_main
from xray.dump.model import Stats
from xray.numerics.metrics import stats_rms

ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
FORMULA = '=HYPERLINK("http://example/x","open")'  # no dot: a module name cannot hold one


@pytest.mark.parametrize("text, safe", [
    ("=cmd|' /C calc'!A0", "'=cmd|' /C calc'!A0"), ("+1+2", "'+1+2"), ("-foo", "'-foo"), ("@SUM(A1)", "'@SUM(A1)"),
    ("\t=1", r"\t=1"), ("\r=1", r"\r=1"),  # controls are escaped (issue 44): the text no longer starts a formula ("-0.5", "-0.5"), ("+3e-5", "+3e-5"), ("-inf", "-inf"), ("aten.add", "aten.add"),
    ("", ""),
])
def test_cells_a_spreadsheet_would_evaluate_become_text(text, safe):
    assert csv_cells.cell(text) == safe
    assert csv_cells.cell(-0.5) == -0.5


def _record(root: Path, scale: float = 1.0, dtype=torch.float32) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module(FORMULA, torch.nn.Linear(8, 8).to(dtype))
    model.add_module("-evil", torch.nn.GELU())
    with torch.no_grad(), xray.dump(dump_dir=root, X_DEDUP=False, X_DUMP_NUM=0) as d:
        model(torch.randn(4, 8, dtype=dtype) * scale)
    return d.folder


def _cells(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return [c for row in csv.reader(f) for c in row]


def test_module_names_cannot_become_formulas_in_any_csv(tmp_path, capsys):
    """compare's out.csv and the summary CSV (its fast path too) write them as text; numbers stay
    numbers for pandas."""
    a, b = _record(tmp_path / "a"), _record(tmp_path / "b")
    out = tmp_path / "out.csv"
    assert compare_main([str(a), str(b), str(out), "--no-progress"]) == 0
    from xray.summary.cli import main as summary_main

    summary = tmp_path / "summary.csv"
    assert summary_main([str(a), str(summary), "--csv"]) == 0
    for path in (out, summary):
        cells = _cells(path)
        assert any(c.startswith("'" + FORMULA) for c in cells), path  # the name, as text
        assert not [c for c in cells if csv_cells.risky(c)], path
    frame = pd.read_csv(out)
    numeric = [c for c in ("max_abs_err", "cosine") if c in frame.columns]
    assert numeric and all(frame[c].dtype.kind == "f" for c in numeric)


def test_statistics_near_1e200_stay_finite(tmp_path):
    """stats_rms squared the mean: OverflowError on valid float64 values (compare's traceback)."""
    assert stats_rms(Stats(1e200, 1.5e200, 1.2e200, 1e199, numel=4)) == pytest.approx(math.hypot(1.2e200, 1e199))
    a = _record(tmp_path / "a", 1e200, torch.float64)
    b = _record(tmp_path / "b", 1e200, torch.float64)
    assert compare_main([str(a), str(b), str(tmp_path / "o.csv"), "--no-progress"]) == 0


BOMB = "ops:\n  - op: [" + ", ".join(
    [f"&l0 [{', '.join(['lol'] * 9)}]"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]) + "]\n"

RUN = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    from xray.replay.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    """600 bytes of aliases: safe_load builds them cheaply, but a str() of the value expands 9^10."""
    spec = tmp_path / "bomb.yaml"
    spec.write_text(BOMB)
    assert len(BOMB) < 1000
    proc = subprocess.run([sys.executable, "-c", RUN, "--spec", str(spec), "-b", "torch-cpu", "-o", str(tmp_path / "o"),
                           "-q"], capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "aliases" in proc.stderr


def test_a_spec_with_modest_aliases_still_loads(tmp_path):
    from xray.replay.sweep import load_sweep

    spec = tmp_path / "ok.yaml"
    spec.write_text("ops:\n  - op: aten.mm.default\n    inputs:\n      self: &s [[4, 8]]\n"
                    "      mat2: [[8, 4]]\n  - op: aten.tanh.default\n    inputs:\n      self: *s\n")
    assert len(load_sweep(spec).cases) == 2


# -- issue 44: hostile input ------------------------------------------------------------------------

ESCAPES = "evil\x1b]0;PWNED\x07\x1b[2J\u202eabc"  # sets the title, clears the screen, turns text right to left
RAW = ("\x1b", "\x07", "\u202e")


def _record_named(root: Path, name: str, scale: float = 1.0) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module(name, torch.nn.Linear(8, 8))
    model.add_module("act", torch.nn.GELU())
    with torch.no_grad(), xray.dump(dump_dir=root, X_DEDUP=False, X_DUMP_NUM=100) as d:
        model(torch.randn(4, 8) * scale)
    return d.folder


def test_escape_codes_in_names_reach_no_terminal_csv_or_page(tmp_path, capsys):
    """compare's worst rows, its CSV and HTML, xray-summary (table and CSV) and xray info escape
    them; the escaped text still names the module."""
    from xray.cli import main as xray_main
    from xray.summary.cli import main as summary_main

    a, b = _record_named(tmp_path / "a", ESCAPES), _record_named(tmp_path / "b", ESCAPES, 1.5)
    out, page = tmp_path / "out.csv", tmp_path / "out.html"
    assert compare_main([str(a), str(b), str(out), "--no-progress", "--html", str(page)]) == 0
    terminal = capsys.readouterr().out
    assert "Worst rows" in terminal and r"evil\x1b]0;PWNED\x07\x1b[2J\u202eabc" in terminal
    assert summary_main([str(a)]) == 0
    assert summary_main([str(a), str(tmp_path / "s.csv"), "--csv"]) == 0
    assert xray_main(["info", str(a)]) == 0
    terminal += capsys.readouterr().out
    texts = [terminal, out.read_text(encoding="utf-8"), page.read_text(encoding="utf-8"),
             (tmp_path / "s.csv").read_text(encoding="utf-8")]
    for text in texts:
        assert not [c for c in RAW if c in text], text[:2000]
    assert r"\u202e" in texts[2] and r"\x1b" in texts[1] and r"\x1b" in texts[3]


def test_printable_escapes_controls_and_bidi_once():
    from xray.dump.model import printable

    assert printable("a\x1b[2Jb\u202ec\u2066d\u200fe\n") == r"a\x1b[2Jb\u202ec\u2066d\u200fe\n"
    assert printable("a\nb", keep="\n") == "a\nb"
    assert printable(printable(ESCAPES)) == printable(ESCAPES)
    assert printable("model.layers.0 ü →") == "model.layers.0 ü →"


def test_a_module_path_past_the_name_limit_is_cut_by_the_writer(tmp_path):
    """The reader refuses names over MAX_NAME: the writer used to write them (3 records lost on
    load). Now the recorder cuts them, keeping a digest: two long paths with one head stay apart."""
    import warnings

    from xray.dump.model import MAX_NAME

    torch.manual_seed(0)
    head = "x" * 1100
    model = torch.nn.Sequential()
    model.add_module(head + "a", torch.nn.Sequential(torch.nn.Linear(4, 4)))
    model.add_module(head + "b", torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEDUP=False, X_DUMP_NUM=0) as d:
        model(torch.randn(2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refused record warns
        with xray.load_dump(d.folder) as dump:
            modules = [r.module for r in dump.records if r.op == "aten.addmm.default"]
    assert len(modules) == 2 and len(set(modules)) == 2
    assert all(len(m) <= MAX_NAME and m.startswith(head[:900]) for m in modules)


def _json_with(folder: Path, edit) -> None:
    from xray.dump.json_index import rewrite_as_json

    rewrite_as_json(folder)
    path = folder / "dump.json"
    data = json.loads(path.read_text())
    for r in data["records"]:
        edit(r)
    path.write_text(json.dumps(data))


def _edited_sizes(root: Path) -> Path:
    """A recorded ``torch.ones(4, 4)`` and ``x.repeat(2, 1)``, their sizes edited in the dump."""
    with xray.dump(dump_dir=root, X_DEDUP=False, X_DUMP_NUM=100) as d:
        torch.ones(4, 4).repeat(2, 1) * 1.5

    def edit(r):
        if r["op"] == "aten.ones.default":
            r["inputs"]["size"] = [14000, 14000]
        if r["op"] == "aten.repeat.default":
            r["inputs"]["repeats"] = [3000, 3000]
    _json_with(d.folder, edit)
    return d.folder


@pytest.mark.slow
def test_edited_sizes_are_told_by_the_records_own_outputs(tmp_path):
    from xray.gen.cli import main as gen_main
    from xray.ops.rebuild import output_mismatch

    folder = _edited_sizes(tmp_path / "d")
    with xray.load_dump(folder) as dump:
        why = {r.op: output_mismatch(r) for r in dump.records}
    assert "[14000, 14000]" in why["aten.ones.default"] and "[4, 4]" in why["aten.ones.default"]
    assert "[12000, 12000]" in why["aten.repeat.default"] and why["aten.mul.Tensor"] is None
    proc = subprocess.run([sys.executable, "-m", "xray.gen.cli", str(folder), "-o", str(tmp_path / "gen"), "-q"],
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "[14000, 14000]" in proc.stderr, proc.stderr
    assert not list((tmp_path / "gen").glob("test_aten_ones*.py"))


RECOMPUTE_PEAK = textwrap.dedent("""
    import resource, sys, xray
    from xray.compare.local import local_error
    dump = xray.load_dump(sys.argv[1])
    rec = next(r for r in dump.records if r.op == "aten.repeat.default")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(local_error(rec, dump, next(iter(rec.output_tensors()))[1], 0))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - before)
""")


@pytest.mark.slow
def test_compares_recomputation_never_runs_an_edited_repeat(tmp_path):
    """The fp64 recomputation of an edited aten.repeat reached 1.9 GB; now it is never run."""
    folder = _edited_sizes(tmp_path / "a")
    proc = subprocess.run([sys.executable, "-c", RECOMPUTE_PEAK, str(folder)], capture_output=True, text=True,
                          timeout=300, env=ENV)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[0] == "None", proc.stdout + proc.stderr[-1500:]
    assert int(lines[-1]) < 200, f"the recomputation grew the peak RSS by {lines[-1]} MB"


@pytest.mark.slow
def test_replay_of_an_edited_size_is_a_mismatch_never_run(tmp_path):
    from xray.replay.cli import main as replay_main

    folder = _edited_sizes(tmp_path / "d")
    replay_main([str(folder), "-b", "torch-cpu", "-o", str(tmp_path / "r"), "-q", "--repeats", "0"])
    rows = {r["op"]: r for r in csv.DictReader(open(tmp_path / "r" / "matrix.csv", encoding="utf-8"))}
    assert rows["aten.ones.default"]["status"] == "MISMATCH" and "[14000, 14000]" in rows["aten.ones.default"]["error"]
    assert rows["aten.repeat.default"]["status"] == "MISMATCH"
    assert rows["aten.mul.Tensor"]["status"] == "OK"


def test_a_replayed_output_is_checked_against_the_recorded_meta():
    from xray.dump.model import Record, TensorMeta
    from xray.ops.rebuild import output_mismatch

    rec = Record(seq=0, kind="op", op="aten.relu.default", inputs={"self": TensorMeta((2, 3), "float32")},
                 outputs=[TensorMeta((2, 3), "float32")])
    assert output_mismatch(rec) is None
    assert "[3, 2] float32" in output_mismatch(rec, [((3, 2), "float32")])
    assert "float64" in output_mismatch(rec, [((2, 3), "float64")])


# -- msprobe dumps under the native reader's rules ---------------------------------------------------

def _msprobe(root: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_corrupt_corpus import make_msprobe_dump

    return make_msprobe_dump(root)


def _first_tensor(folder: Path):
    dump = xray.load_dump(folder)
    rec = next(r for r in dump.records if r.op == "Functional.linear")
    return dump, next(iter(rec.output_tensors()))[1]


@pytest.mark.parametrize("how", ["file", "folder"])
def test_msprobe_tensor_files_never_lead_out_of_the_dump(tmp_path, how):
    from xray.dump import DumpFormatError

    folder = _msprobe(tmp_path / "m")
    data = folder / "dump_tensor_data"
    outside = tmp_path / "outside"
    if how == "folder":
        shutil.move(data, outside)
        data.symlink_to(outside)
    else:
        outside.mkdir()
        for pt in data.glob("*.pt"):
            torch.save(torch.full((2, 8), 1337.0), outside / pt.name)
            pt.unlink()
            pt.symlink_to(outside / pt.name)
    dump, meta = _first_tensor(folder)
    with pytest.raises(DumpFormatError, match="refused"):
        dump.load_tensor(meta)


def test_msprobe_tensor_of_another_count_or_dtype_is_refused(tmp_path):
    from xray.dump import DumpFormatError

    folder = _msprobe(tmp_path / "m")
    dump, meta = _first_tensor(folder)
    path = folder / meta.data
    torch.save(torch.randn(5, 3, dtype=torch.float64), path)  # issue 44's case: larger, refused before it is read
    with pytest.raises(DumpFormatError, match="120 bytes of storage"):
        dump.load_tensor(meta)
    torch.save(torch.randn(2, 3), path)
    with pytest.raises(DumpFormatError, match="holds 6 elements"):
        dump.load_tensor(meta)
    torch.save(torch.randn(2, 8, dtype=torch.float16), path)  # same count, narrower: the storage check passes
    with pytest.raises(DumpFormatError, match="float16"):
        dump.load_tensor(meta)


ZIP_PEAK = textwrap.dedent("""
    import resource, sys, xray
    from xray.dump import DumpFormatError
    dump = xray.load_dump(sys.argv[1])
    rec = next(r for r in dump.records if r.op == "Functional.linear")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    try:
        dump.load_tensor(next(iter(rec.output_tensors()))[1])
        print("loaded")
    except DumpFormatError as e:
        print("refused:", e)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - before)
""")


@pytest.mark.slow
def test_msprobe_zip_bomb_is_refused_before_it_inflates(tmp_path):
    """A .pt whose DEFLATE'd storage holds 2**27 floats (512 MiB) for a declared (2, 8): refused
    from the archive's directory; the old reader inflated it whole."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_corrupt_corpus import zip_bomb

    folder = _msprobe(tmp_path / "m")
    dump, meta = _first_tensor(folder)
    zip_bomb(folder / meta.data, 1 << 27)
    assert (folder / meta.data).stat().st_size < 2 << 20
    proc = subprocess.run([sys.executable, "-c", ZIP_PEAK, str(folder)], capture_output=True, text=True,
                          timeout=300, env=ENV)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[0].startswith("refused:") and "compressed" in lines[0], proc.stdout + proc.stderr[-1500:]
    assert int(lines[-1]) < 100, f"reading the bomb grew the peak RSS by {lines[-1]} MB"


def test_msprobe_storage_larger_than_declared_is_refused(tmp_path):
    """Uncompressed, but a storage of 4096 floats behind a declared (2, 8)."""
    from xray.dump import DumpFormatError

    folder = _msprobe(tmp_path / "m")
    dump, meta = _first_tensor(folder)
    torch.save(torch.zeros(4096)[:16].view(2, 8), folder / meta.data)  # a view saves its whole storage
    with pytest.raises(DumpFormatError, match="bytes of storage"):
        dump.load_tensor(meta)


def test_msprobe_indexes_are_capped(tmp_path, monkeypatch):
    from xray.dump import DumpFormatError, msprobe

    folder = _msprobe(tmp_path / "m")
    size = (folder / "dump.json").stat().st_size
    monkeypatch.setattr(msprobe, "MAX_INDEX_BYTES", size - 1)
    with pytest.raises(DumpFormatError, match="larger than"):
        xray.load_dump(folder)
    monkeypatch.setattr(msprobe, "MAX_INDEX_BYTES", size)
    (folder / "construct.json").write_text(json.dumps({"x" * size: "y"}))
    with pytest.raises(DumpFormatError, match="construct.json: larger than"):
        xray.load_dump(folder)


@pytest.mark.parametrize("edit", ['"Max": 1' + "0" * 400, '"shape": [1' + "0" * 400 + "]",
                                  f'"shape": [{2**62}, {2**62}]', '"Norm": 1e308, "Mean": 1e308'])
def test_msprobe_hostile_numbers_are_one_error_or_read(tmp_path, edit):
    """OverflowError and "C long" tracebacks before: now a DumpFormatError naming the file, or
    (huge but finite statistics) a dump that reads."""
    from xray.dump import DumpFormatError

    folder = _msprobe(tmp_path / "m")
    text = (folder / "dump.json").read_text()
    key = edit.split(":")[0]
    start = text.index(key)
    end = text.index("]" if "shape" in key else ",", start) + (1 if "shape" in key else 0)
    (folder / "dump.json").write_text(text[:start] + edit + text[end:])
    try:
        with xray.load_dump(folder) as dump:
            from xray.dump.column_builder import columns_of

            columns_of(list(dump.records))
    except DumpFormatError as e:
        assert str(folder) in str(e)
