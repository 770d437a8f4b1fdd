"""A value-moving op (a view, a reshape) that changed what it moved is named by its own record.

The recorder hands a view's input statistics on to its output only where the output provably
holds the input's elements (a view of it, or a copy of its shape); a reshaping result in new
memory gets statistics of its own, which compare holds against its input's within the run
(xray/compare/moved_values.py). Before, a 5 % bug in a bf16 reshape recorded with statistics only
was found nowhere: its statistics were its input's, and the two runs' noise hid its sample.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import record_forward
from test_record_rows import PATHS, use_path

import xray
from xray.compare import compare_dumps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy.faults import CorruptCall, relative  # noqa: E402

VIEW = "aten.view.default"


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 32)).eval()


def _x():
    return torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))


def _views(folder) -> list:
    with xray.load_dump(folder) as d:
        return [(r.inputs["self"].stats, r.outputs[0].stats) for r in d.records if r.op == VIEW]


@pytest.mark.parametrize("path", PATHS)
def test_a_reshape_into_new_memory_gets_statistics_of_its_own_on_every_recording_path(path, tmp_path, monkeypatch):
    """The third view (F.linear's 3-d result reshaped after its addmm) returns a copy, 5 % off:
    its output statistics are its own, 5 % from its input's; every true view's are its input's."""
    use_path(monkeypatch, path)
    fault = CorruptCall(VIEW, 3, relative(5e-2))
    folder = record_forward(_mlp(), tmp_path / "d", _x(), fault=fault, X_DEDUP=False, X_DUMP_NUM=0)
    assert fault.hit
    views = _views(folder)
    assert len(views) == 6
    for i, (src, out) in enumerate(views):
        if i == 3:
            assert out.max == pytest.approx(src.max * 1.05, rel=1e-6) and out.std == pytest.approx(src.std * 1.05)
        else:
            assert (out.min, out.max, out.mean, out.std) == (src.min, src.max, src.mean, src.std), i


def test_a_reshape_that_changed_what_it_moved_is_born_under_bf16_noise(tmp_path):
    """Statistics only (X_DUMP_NUM=0), an fp32 bench against a bf16 autocast target whose third
    view is 5 % off: that view is the first divergence, born on its own inputs. Before, no row
    failed (4 warnings)."""
    model, x = _mlp(), _x()
    bench = record_forward(model, tmp_path / "fp32", x, X_DUMP_NUM=0)
    fault = CorruptCall(VIEW, 3, relative(5e-2))
    target = record_forward(model, tmp_path / "bug", x, fault=fault, autocast=True, X_DUMP_NUM=0)
    with xray.load_dump(target) as d:
        truth = [r.seq for r in d.records if r.op == VIEW][3]
    fd = compare_dumps(bench, target).summary.first_divergence
    assert fd is not None and fd["target_seq"] == truth and (fd["origin"], fd["cause"]) == ("born", "local error"), fd


def test_a_clean_bf16_run_has_no_view_born(tmp_path):
    """The same pair without the bug: every view holds its input's statistics, no row fails."""
    model, x = _mlp(), _x()
    bench = record_forward(model, tmp_path / "fp32", x, X_DUMP_NUM=0)
    result = compare_dumps(bench, record_forward(model, tmp_path / "bf16", x, autocast=True, X_DUMP_NUM=0))
    assert result.summary.failed == 0, result.summary.first_divergence
