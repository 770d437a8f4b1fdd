"""The example dumps shipped in dumps/ stay readable by every tool (the format contract)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import xray
from xray.compare import compare_dumps

DUMPS = Path(__file__).resolve().parents[1] / "dumps"


def test_every_example_dump_loads_and_is_small():
    for name in ("llama-fp32", "llama-bf16-fault", "llama-dedup", "llama-module.h5"):
        path = DUMPS / name
        size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
        assert size < 4 * 2**20, f"{name} is {size} bytes: keep examples to a few MB"
        with xray.load_dump(path) as dump:
            assert dump.complete and len(dump.records) > 10


def test_shipped_pair_names_the_injected_fault():
    result = compare_dumps(DUMPS / "llama-fp32", DUMPS / "llama-bf16-fault", progress=False)
    first = result.summary.first_divergence
    assert first["origin"] == "born" and first["op"] == "aten.mm.default" and "up_proj" in first["bench"]


@pytest.mark.slow
def test_summary_reads_the_shipped_module_dump(tmp_path):
    out = tmp_path / "sum.csv"
    proc = subprocess.run([sys.executable, "-m", "xray.summary.cli", str(DUMPS / "llama-module.h5"), str(out), "--csv"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    import pandas as pd

    df = pd.read_csv(out)
    assert {"forward", "backward"} <= set(df["Direction"]) and df["Module"].str.contains("q_proj").any()
