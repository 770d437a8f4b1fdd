"""The `xray` command: record a script without editing it, and summarise a dump."""
from __future__ import annotations

import subprocess
import sys

import xray


def test_xray_record_runs_an_unmodified_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys, torch\nx = torch.ones(3) * float(sys.argv[1])\nprint('SUM', x.sum().item())\n")
    proc = subprocess.run([sys.executable, "-m", "xray.cli", "record", "-o", str(tmp_path / "d"), "--dedup", "0",
                           "--", str(script), "2.5"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SUM 7.5" in proc.stdout
    dump = xray.load_dump(tmp_path / "d")
    assert [r.op for r in dump.records] == ["aten.ones.default", "aten.mul.Tensor", "aten.sum.default",
                                            "aten._local_scalar_dense.default"]


def test_xray_info_summarises_and_rejects_bad_paths(tmp_path):
    import torch

    with xray.dump(dump_dir=tmp_path, X_DEDUP=False) as session:
        torch.tensor([1.0, float("nan")]) * 2
    proc = subprocess.run([sys.executable, "-m", "xray.cli", "info", str(session.folder)], capture_output=True, text=True)
    assert proc.returncode == 0 and "aten.mul.Tensor" in proc.stdout and "first NaN/Inf output" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "xray.cli", "info", str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 2 and "no such file" in bad.stderr
