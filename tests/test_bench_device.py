"""tools/bench_record.py --device on the CPU (--small): the table the device machine prints must come
out whole before device time is spent on it, including the per-kernel side-by-side rows, and
tools/device_check.py must summarise it (issue 30)."""
from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tabulate")
TOOLS = Path(__file__).parents[1] / "tools"
stats_mod = importlib.import_module("xray.dump.stats")


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.slow  # two dtypes x five configurations of a real Llama: a minute or more
def test_the_device_table_runs_on_cpu_with_two_batch_kernels_side_by_side(tmp_path, monkeypatch, capsys):
    # A second kernel registered for "cpu" (the portable one under another name): the table then
    # measures "every call" and the statistics alone once per kernel, as on a GPU with triton.
    def registered(items):
        stats_mod._rows_one_by_one(items)

    monkeypatch.setitem(stats_mod.BATCH_KERNELS, "cpu", registered)
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "1")  # the queued path, as on a device
    out = tmp_path / "bench.json"
    assert _tool("bench_record").main(["--device", "cpu", "--small", "--repeats", "1", "--json", str(out)]) == 0
    bench = json.loads(out.read_text())
    configs = {r["config"] for r in bench["rows"]}
    assert {"every call, fused (Triton)", "every call, fallback (per tensor)", "dedup"} <= configs, configs
    every = [r for r in bench["rows"] if r["config"].startswith("every call, f")]
    assert all(r["queued"] > 100 and r["batches"] > 0 and r["added_per_call"] >= 0 for r in every), every
    kernels = [(c["dtype"], c["kernel"]) for c in bench["stats_cost"]]
    assert kernels == [(d, k) for d in ("float32", "bfloat16") for k in ("fused (Triton)", "fallback (per tensor)")]
    assert all(c["tensors"] > 10 and c["launches"] > 0 for c in bench["stats_cost"])
    assert "Statistics alone" in capsys.readouterr().out
    lines = _tool("device_check").bench_summary(bench)
    # (3 recorded configurations + "every call" once more, for the second kernel) x 2 dtypes
    assert sum("added launches per recorded call" in line for line in lines) == 8
    assert sum("statistics of" in line for line in lines) == 4
    assert _tool("device_check").bench_summary({"error": "boom"}) == ["  bench_record failed: boom"]
