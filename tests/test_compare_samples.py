"""Samples in verdicts: every statistics row is also judged on its sampled elements, and an
elementwise op is recomputed on its inputs' samples (docs/compare.md, "Samples in verdicts").

Each run is a few tiny ops recorded with every tensor saved; the dumps are then turned into what a
statistics-only recording with samples holds (each tensor's ``samples.take``, its data dropped),
so the same pair is compared with and without samples.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import xray
from xray.compare.engine import compare_loaded
from xray.compare.pair_judge import PairComparer
from xray.compare.result import CompareRow
from xray.dump import samples
from xray.dump.model import TensorMeta
from xray.dump.reader import TraceDump
from xray.dump.stats import tensor_stats
from xray.numerics import sample_judge
from xray.numerics.rules import Rules

GELU = torch.ops.aten.gelu.default


class _Wrong(TorchDispatchMode):
    """Replaces ``op``'s output by ``fn(output)``, below the recorder (recorded as the op's own)."""

    def __init__(self, op, fn) -> None:
        super().__init__()
        self.op, self.fn = op, fn

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return self.fn(out) if func is self.op else out


def _record(folder, wrong: TorchDispatchMode | None = None, bf16: bool = False):
    torch.manual_seed(0)
    x, w = torch.randn(64, 96), torch.randn(96, 128) / 10
    with torch.no_grad(), wrong or contextlib.nullcontext(), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), \
            xray.dump(dump_dir=folder, X_DEDUP=False, X_DUMP_NUM=1000, X_DEBUG=0x112) as d:
        y = torch.nn.functional.gelu(x @ w)
        (y * 0.5 + 1.0).sum(-1)
    return d.folder


def _statistics_only(folder, with_samples: bool = True, with_checks: bool = True) -> TraceDump:
    """The dump as a statistics-only recording (with each tensor's sample) would hold it."""
    dump = xray.load_dump(folder)
    records = list(dump.records)
    for r in records:
        for _, m in (*r.input_tensors(), *r.output_tensors()):
            m.sample = tuple(samples.take(dump.load_tensor(m).reshape(m.shape)).tolist()) if with_samples else None
            m.data = None
            if m.stats is not None and not with_checks:
                m.stats = dataclasses.replace(m.stats, check=None)
    return TraceDump(dump.folder, dump.header, records, dump.complete, dump.summary)


def _rows(tmp_path, wrong=None, bf16=False, with_samples=True, with_checks=True):
    bench = _statistics_only(_record(tmp_path / "bench"), with_samples, with_checks)
    target = _statistics_only(_record(tmp_path / "target", wrong, bf16), with_samples, with_checks)
    rows, _ = compare_loaded(bench, target, Rules())
    return {r.bench_op: r for r in rows if r.bench_op}


def test_statistics_agree_but_the_sample_fails(tmp_path):
    """A gelu whose output is permuted (flipped along its rows): every statistic is the bench's,
    its elements are not. The sample fails it, and its recomputation on its input's sample names
    it born; what it feeds inherits."""
    rows = _rows(tmp_path, _Wrong(GELU, lambda t: t.flip(-1)))
    gelu = rows["aten.gelu.default"]
    assert gelu.status == "fail" and "the sample decided" in gelu.note and gelu.sample_err > 0.1
    assert (gelu.origin, gelu.cause) == ("born", "local error") and gelu.local_err > 0.1
    assert rows["aten.mul.Tensor"].cause == "inherited"


def test_a_ten_percent_error_on_part_of_a_tensor_under_bf16_fails(tmp_path):
    """Under bf16 autocast, a gelu 10 % off on half its columns: born there, named by its local
    error on the sample (the floor is bf16's rounding of gelu on those elements)."""
    part = _Wrong(GELU, lambda t: torch.cat([t[:, :64] * 1.1, t[:, 64:]], -1))
    gelu = _rows(tmp_path, part, bf16=True)["aten.gelu.default"]
    assert gelu.status == "fail" and (gelu.origin, gelu.cause) == ("born", "local error")
    assert gelu.local_err > gelu.local_floor


def test_bf16_rounding_on_samples_passes(tmp_path):
    """bf16 autocast against float32: the samples differ by rounding only, no row fails."""
    rows = _rows(tmp_path, bf16=True)
    assert all(r.status in ("pass", "warning") for r in rows.values()), {k: r.status for k, r in rows.items()}
    assert all(r.sample_err is not None and r.sample_err < 2e-2 for r in rows.values())


def test_a_dump_without_samples_compares_as_before(tmp_path):
    """No samples and no self-checks (a dump recorded before either): no sample_err, no sample
    note, nothing recomputed; the flipped gelu is invisible to statistics, as it always was."""
    rows = _rows(tmp_path, _Wrong(GELU, lambda t: t.flip(-1)), with_samples=False, with_checks=False)
    assert all(r.sample_err is None and "sample" not in r.note and r.local_err is None for r in rows.values())
    assert rows["aten.gelu.default"].status == "pass"


def test_without_samples_the_elementwise_self_check_names_the_flipped_gelu(tmp_path):
    """bf16 autocast, statistics only, no samples: the gelu's recorded self-check (every element
    against gelu run again on its input in float32) reads the flip, and names it born."""
    rows = _rows(tmp_path, _Wrong(GELU, lambda t: t.flip(-1)), bf16=True, with_samples=False)
    gelu = rows["aten.gelu.default"]
    assert gelu.status == "fail" and (gelu.origin, gelu.cause) == ("born", "local error"), gelu
    assert gelu.local_err > 0.5 and "every element" in gelu.note


def test_inputs_are_judged_on_their_samples():
    """judge_inputs' judge (PairComparer.compare): statistics that agree, samples that do not."""
    x = torch.randn(64, 64)
    bench, target = TensorMeta((64, 64), "float32"), TensorMeta((64, 64), "float32")
    bench.stats, target.stats = tensor_stats(x), tensor_stats(x.flip(0))
    bench.sample, target.sample = tuple(samples.take(x)), tuple(samples.take(x.flip(0)))
    row = PairComparer(None, None, Rules()).compare(CompareRow(), bench, target)
    assert row.status == "fail" and row.sample_err > 0.1 and "the sample decided" in row.note
    target.sample = tuple(samples.take(x.to(torch.bfloat16).float()))
    assert PairComparer(None, None, Rules()).compare(CompareRow(), bench, target).sample_err < 1e-2


def test_the_sample_judge_is_the_saved_data_rule_over_arrays():
    """One rule: a row of the vectorised judge equals judge_one; NaN where the bench is finite
    is NAN_INF; equal -inf (a mask) agrees."""
    rules = Rules()
    b = np.array([[1.0, -np.inf, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    t = np.array([[1.0, -np.inf, 3.0, 4.0], [1.0, np.nan, 3.0, 4.0]])
    got = sample_judge.judge(b, t, np.array([4, 4]), np.array([4, 4]), np.full(2, 1.3e-6), np.full(2, 1e-5),
                             np.full(2, 2.0), np.full(2, 4.0), rules)
    assert got["verdict"].tolist() == [sample_judge.PASS, sample_judge.NAN_INF]
    one = sample_judge.judge_one((1.0, 2.0, 3.0), (1.0, 2.0, 3.5), 1.3e-6, 1e-5, 2.0, 3.0, rules)
    assert one[0] == sample_judge.FAIL and abs(one[1] - 0.5 / 3.0) < 1e-12 and one[2] == 1


MUL = torch.ops.aten.mul.Tensor


def _rms_norm_rows(tmp_path, wrong=None):
    """An RMS norm after a bf16 matmul: ``y * rsqrt(mean(y^2))`` reads a (64, 1) tensor broadcast
    over (64, 128), then ``* weight`` a (128,) one: neither is sampled whole (more than 32
    elements), so only positions drawn axis by axis line their samples up with the output's."""
    def record(folder, wrong=None, bf16=False):
        torch.manual_seed(0)
        x, w, g = torch.randn(64, 96), torch.randn(96, 128) / 10, torch.rand(128) + 0.5
        with torch.no_grad(), wrong or contextlib.nullcontext(), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), \
                xray.dump(dump_dir=folder, X_DEDUP=False, X_DUMP_NUM=1000, X_DEBUG=0x112) as d:
            y = (x @ w).float()
            (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)) * g
        return d.folder

    bench = _statistics_only(record(tmp_path / "bench"))
    target = _statistics_only(record(tmp_path / "target", wrong, bf16=True))
    rows, _ = compare_loaded(bench, target, Rules())
    return [r for r in rows if r.bench_op == "aten.mul.Tensor"]


def test_a_norm_scale_wrong_under_bf16_is_born_at_its_broadcast_mul(tmp_path):
    """The first mul of an RMS norm 5 % wrong under bf16 noise, on statistics and samples alone:
    recomputed on its inputs' samples (the (64, 1) rsqrt broadcast), it is born there; its
    consumer, right on what it received, is never an origin. Clean, neither mul fails."""
    calls = iter(range(2))
    wrong = _Wrong(MUL, lambda t: t * 1.05 if next(calls, 1) == 0 else t)
    first, second = _rms_norm_rows(tmp_path / "wrong", wrong)
    assert first.status == "fail" and (first.origin, first.cause) == ("born", "local error"), first
    assert "measured on the sample" in first.note and first.local_err > 0.04
    assert second.origin != "born", second
    assert all(r.status in ("pass", "warning") for r in _rms_norm_rows(tmp_path / "clean"))
