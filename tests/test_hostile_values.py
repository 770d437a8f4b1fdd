"""Values a hostile or unlucky dump or spec holds: names that are spreadsheet formulas, float64
statistics near 1e200, a YAML alias bomb (issue 31, items 10, 11 and 14)."""
from __future__ import annotations

import csv
import math
import os
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
    ("\t=1", "'\t=1"), ("\r=1", "'\r=1"), ("-0.5", "-0.5"), ("+3e-5", "+3e-5"), ("-inf", "-inf"), ("aten.add", "aten.add"),
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
