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


CLONE = "aten.clone.default"


class _Transposing(torch.nn.Module):
    """A linear whose result is transposed and made contiguous (a clone: a copy kernel) before
    the next layer reads it back."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)

    def forward(self, x):
        h = self.a(x).transpose(0, 1).contiguous()
        return self.b(torch.nn.functional.gelu(h.transpose(0, 1)))


def _off_sample(t: torch.Tensor) -> torch.Tensor:
    """Three elements doubled, none of them at the sample's positions: a sparse copy bug the
    sample cannot see."""
    from xray.dump.samples import positions

    t = t.clone()
    drawn = set(positions(tuple(t.shape)))
    for i in [i for i in range(7, t.numel(), 4099) if i not in drawn][:3]:
        t.view(-1)[i] *= 2
    return t


def _x256():
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("path", PATHS)
def test_a_copy_gets_statistics_of_its_own_on_every_recording_path(path, tmp_path, monkeypatch):
    """A clone is a kernel that can be wrong: its statistics are measured, not handed on from its
    input, so three wrong elements its sample missed still show (its maximum and spread move); a
    clean clone's are its input's, within the rounding of summing in another order."""
    use_path(monkeypatch, path)
    for wrong in (False, True):
        fault = CorruptCall(CLONE, 0, _off_sample if wrong else (lambda t: t))
        folder = record_forward(_Transposing(), tmp_path / f"d{wrong}", _x256(), fault=fault, X_DEDUP=False,
                                X_DUMP_NUM=0)
        with xray.load_dump(folder) as d:
            (clone,) = [r for r in d.records if r.op == CLONE]
            src, out = clone.inputs["self"].stats, clone.outputs[0].stats
        assert out.sample is not None and src.sample is not None
        if wrong:
            assert out.std > src.std * (1 + 1e-5) and out.mean != src.mean
        else:
            assert (out.min, out.max) == (src.min, src.max)
            # (float32 partial sums in another order: 5e-8 of the spread here, against compare's 1e-5)
            assert abs(out.mean - src.mean) < 1e-6 * src.std and out.std == pytest.approx(src.std, rel=1e-6)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_a_sparse_bug_in_a_copy_its_sample_missed_is_born_at_the_copy(tmp_path, autocast):
    """Statistics only: an fp32 bench against an fp32 or bf16 autocast target whose clone doubles
    three elements its sample does not draw. The clone's own statistics differ from its input's
    within the target run: born there. Before, fp32 named the gelu reading it and bf16 found no
    divergence. The clean pair has no FAIL row."""
    bench = record_forward(_Transposing(), tmp_path / "fp32", _x256(), X_DUMP_NUM=0)
    clean = record_forward(_Transposing(), tmp_path / "clean", _x256(), autocast=autocast, X_DUMP_NUM=0)
    assert compare_dumps(bench, clean).summary.failed == 0
    target = record_forward(_Transposing(), tmp_path / "bug", _x256(), fault=CorruptCall(CLONE, 0, _off_sample),
                            autocast=autocast, X_DUMP_NUM=0)
    fd = compare_dumps(bench, target).summary.first_divergence
    assert fd is not None and fd["op"] == CLONE and (fd["origin"], fd["cause"]) == ("born", "local error"), fd


REPEAT = "aten.repeat.default"


class _Repeating(torch.nn.Module):
    """Keys repeated for grouped heads, as older attention code does it (``repeat``): every
    element of the input the same number of times."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.k, self.q = torch.nn.Linear(64, 32), torch.nn.Linear(64, 64)

    def forward(self, x):
        keys = self.k(x).repeat(1, 1, 2)  # (2, 16, 64): each key twice
        return torch.tanh(self.q(x) * keys).sum(-1)


@pytest.mark.parametrize("faulty", [False, True])
def test_a_repeat_is_judged_by_its_statistics_against_its_input(tmp_path, faulty):
    """A repeat holds each element of its input the same number of times: the same extremes,
    mean and population spread. Statistics only, an fp32 bench against a bf16 autocast target:
    a repeat 5 % off is born there (before: a warning, "moves its input's values: never an
    origin on its own", and no row failed: DiffLlama's bf16 training-mode fault in the
    architecture sweep); a right one is no origin."""
    model, x = _Repeating().eval(), _x()
    bench = record_forward(model, tmp_path / "fp32", x, X_DUMP_NUM=0)
    fault = CorruptCall(REPEAT, 0, relative(5e-2)) if faulty else None
    target = record_forward(model, tmp_path / "bf16", x, fault=fault, autocast=True, X_DUMP_NUM=0)
    summary = compare_dumps(bench, target).summary
    if not faulty:
        assert summary.failed == 0, summary.first_divergence
        return
    with xray.load_dump(target) as d:
        truth = next(r.seq for r in d.records if r.op == REPEAT)
    fd = summary.first_divergence
    assert fd is not None and fd["target_seq"] == truth and (fd["origin"], fd["cause"]) == ("born", "local error"), fd


def test_a_widening_cast_is_looked_through_whichever_order_its_statistics_were_summed_in():
    """A bf16 tensor and its float32 copy hold one multiset; their spreads, summed in other
    orders (the native statistics path against torch's), differ in the eighth digit. The cast
    moved its values unchanged all the same (compare's "same values by statistics", which a
    GELU run as SiLU under autocast needs to see the two ops read one value); a cast that
    rounded them moves the spread by bf16's rounding, and is no mere move."""
    from types import SimpleNamespace

    from xray.compare.causality import _same_values_by_statistics
    from xray.dump.model import Stats, TensorMeta

    def cast(spread_out: float, shape=(32, 8)):
        def meta(dtype, std):
            return TensorMeta(shape=shape, dtype=dtype, stats=Stats(-0.35, 0.27, 0.0023, std, numel=256))
        return SimpleNamespace(op="aten._to_copy.default", inputs=[("self", meta("bfloat16", 0.11093565961))],
                               outputs=[("out0", meta("float32", spread_out))])

    assert _same_values_by_statistics(cast(0.11093565961))
    assert _same_values_by_statistics(cast(0.11093565944))  # summed in another order
    assert not _same_values_by_statistics(cast(0.11093565961 * (1 + 2 ** -8)))  # rounded by the cast
