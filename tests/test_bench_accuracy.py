"""The accuracy benchmark's harness (tools/bench_accuracy.py) end to end on a few scenarios.

No assertion on hit rates: those are the benchmark's figures. These check that the fault
fires, the ground truth is found in the dumps, and every result field is filled in.
"""
import csv
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy import report  # noqa: E402
from accuracy.faults import round_mantissa  # noqa: E402
from accuracy.runner import named_seqs, run_scenario  # noqa: E402
from accuracy.scenario import Fault, Scenario  # noqa: E402
from accuracy.scenarios import quick, scenarios  # noqa: E402


def test_scenario_list_covers_the_brief():
    all_ = scenarios()
    assert len(all_) >= 60 and len({s.arch for s in all_}) >= 5
    assert len({s.name for s in all_}) == len(all_)
    classes = {s.cls.split("/")[0] for s in all_}
    for needed in ("whole-1e-3", "partial", "small-magnitude", "backward", "parameter", "module-level",
                   "target-only-op", "noise+bug", "rename", "extra-op", "missing-op", "huge-values", "noise"):
        assert needed in classes, needed
    assert {s.cls for s in quick(all_)} == {s.cls for s in all_}


def test_round_mantissa_is_tf32_like_and_keeps_strides():
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0)).t()
    r = round_mantissa(x)
    assert r.stride() == x.stride()
    assert torch.equal(round_mantissa(r), r)  # already 10-bit: unchanged
    rel = ((r - x).abs() / x.abs()).max().item()
    assert 0 < rel <= 2.0 ** -11  # half a unit in the 10th mantissa bit


def test_named_seqs_reads_origin_fields():
    fd = {"bench_seq": 3, "target_seq": 4, "index": 9, "origin": {"target_seq": 2}, "origin_bench_seq": 1}
    assert named_seqs(fd) == {("bench", 3), ("target", 4), ("target", 2), ("bench", 1)}
    text = {"target_seq": 7, "origin": "target-only op model.mlp/aten.mul.Tensor#5", "bench": "x/aten.mm.default#9"}
    assert named_seqs(text) == {("target", 7), ("target", 5), ("bench", 5)}  # names outside origin are not read


@pytest.mark.slow
@pytest.mark.parametrize("scenario", [
    Scenario("t/gpt2-mm", "whole-1e-3", "gpt2", fault=Fault("aten.addmm.default", 3)),
    Scenario("t/bert-param-module", "parameter/module", "bert", param="encoder.layer.0.intermediate.dense.weight",
             dump="module", data=False),
    Scenario("t/gpt2-backward", "backward", "gpt2", fault=Fault("aten.mm.default", 2, direction="backward"),
             backward=True),
], ids=lambda s: s.name)
def test_fault_scenario_end_to_end(scenario, tmp_path):
    o = run_scenario(scenario, tmp_path)
    assert o.harness_error is None, o.trace or o.harness_error
    assert o.crash is None or o.summary is None  # a crash leaves no summary, else a full one
    assert o.truth.target and o.truth.bench_module
    if scenario.dump == "trace":  # the ground truth is a call of the corrupted op kind, on both sides
        assert len(o.truth.bench) == len(o.truth.target) == 1
    if o.summary is not None:
        assert "first_divergence" in o.summary and o.summary["rows"] > 0
        assert isinstance(o.exact, bool) and isinstance(o.right_module, bool)
        assert o.right_module or not o.exact  # an exact hit is in the right module


@pytest.mark.slow
def test_noise_scenario_and_reports(tmp_path):
    outcomes = [run_scenario(Scenario("t/noise", "noise/threads", "bert", noise="threads"), tmp_path),
                run_scenario(Scenario("t/fault", "whole-1e-3", "bert", fault=Fault("aten.gelu.default", 0)), tmp_path)]
    noise = outcomes[0]
    assert noise.harness_error is None and noise.summary["rows"] > 0
    assert noise.exact is None  # noise-only runs are scored by their fail rows, not by a hit
    path = tmp_path / "r.csv"
    report.write_csv(outcomes, path)
    rows = list(csv.DictReader(path.open()))
    assert [r["name"] for r in rows] == ["t/noise", "t/fault"] and list(rows[0]) == list(report.CSV_COLUMNS)
    assert rows[1]["truth_target_seqs"] and rows[1]["truth_module"]
    t = report.totals(outcomes)
    assert t["fault_scenarios"] == 1 and t["noise_scenarios"] == 1 and t["noise_rows"] == noise.summary["rows"]
    faults, noises = report.tables(outcomes)
    assert faults[-1][0] == noises[-1][0] == "overall"
    assert len(faults[0]) == len(report.FAULT_HEADERS) and len(noises[0]) == len(report.NOISE_HEADERS)
