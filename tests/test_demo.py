"""`xray demo` in reduced form: the same seven steps on a smaller model, checked end to end."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from xray.demo_command import divergence_table


@pytest.mark.slow
def test_demo_runs_every_step_and_finds_the_injected_fault(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "xray.cli", "demo", "--small", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "xray found it." in text  # the compare named the injected kernel fault, born there
    assert "xray drift found it." in text  # the whole-model run named the layer with the wrong ONNX weight
    summary = json.loads((out / "compare-summary.json").read_text())
    first = summary["first_divergence"]
    assert first["origin"] == "born" and first["op"] == "aten.mm.default"
    assert "mlp.up_proj" in first["bench"]
    # op tests: all pass on cpu; on the broken 'target device' exactly the matmul tests fail
    cpu, target = pd.read_csv(out / "ops-cpu.csv"), pd.read_csv(out / "ops-target.csv")
    assert cpu["is_pass"].all()
    assert set(target.loc[~target["is_pass"], "op_name"]) == {"aten.mm.default"}
    assert len(pd.read_csv(out / "ops-diff.csv")) == len(cpu)
    matrix = pd.read_csv(out / "replay" / "matrix.csv")
    assert {"onnxrt-cpu", "executorch-xnnpack"} <= set(matrix["backend"])
    assert (out / "replay" / "heatmap.png").exists() and (out / "index.html").exists()
    for what in ("compare.html", "index.html"):
        assert (out / what).stat().st_size > 1000
    index = (out / "index.html").read_text()
    assert 'href="replay/heatmap.html"' in index and "{'" not in index  # a page, never a folder or a dict


def test_index_renders_the_first_divergence_as_a_table():
    first = {"rank": 0, "index": 7, "status": "fail", "origin": "born", "bench": "model.mlp/aten.mm.default#12",
             "target": "model.mlp/aten.mm.default#12", "bench_seq": 12, "op": "aten.mm.default", "cosine": 0.999912345,
             "max_abs_err": 0.05, "layout": None, "cause": {"local_error": 0.05, "floor": None}}
    table = divergence_table(first)
    assert table.startswith("<table") and "{" not in table and "None" not in table
    assert "<th>operator</th><td><code>aten.mm.default</code>" in table and "<code>0.9999</code>" in table
    assert "local_error: 0.05" in table
    assert table.index("operator") < table.index("bench record") < table.index("origin")
    assert "every record agrees" in divergence_table(None)


def test_demo_refuses_a_folder_it_did_not_create(tmp_path, monkeypatch, capsys):
    """`xray demo --out DIR` used to rmtree DIR (and `--out .` the current folder)."""
    from xray.cli import main

    user = tmp_path / "work"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    assert main(["demo", "--small", "--no-replay", "--out", str(user)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not created by xray demo" in err[0] and str(user) in err[0]
    assert (user / "notes.txt").read_text() == "mine"
    monkeypatch.chdir(user)
    assert main(["demo", "--small", "--no-replay", "--out", "."]) == 2
    assert "--out . is not empty and was not created by xray demo" in capsys.readouterr().err
    assert sorted(p.name for p in user.iterdir()) == ["notes.txt"]
    file_out = user / "notes.txt"
    assert main(["demo", "--small", "--no-replay", "--out", str(file_out)]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert file_out.read_text() == "mine"


def test_demo_replaces_its_own_previous_output(tmp_path):
    from xray.demo_command import OUT_MARKER, _claim_out

    out = tmp_path / "demo"
    assert _claim_out(out) is None and (out / OUT_MARKER).is_file()  # new folder: created and marked
    (out / "compare.csv").write_text("old")
    assert _claim_out(out) is None  # ours from a previous run: emptied and marked again
    assert sorted(p.name for p in out.iterdir()) == [OUT_MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _claim_out(empty) is None and (empty / OUT_MARKER).is_file()
