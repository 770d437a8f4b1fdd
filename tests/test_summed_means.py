"""A sum's means add up within one run (compare/summed_means.py): a statistics-only add whose
sample missed the elements a bug changed still shows it, where its mean is not its inputs'."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from xray.compare.summed_means import summed_mean_error
from xray.dump.model import Record, Stats, TensorMeta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy import zoo  # noqa: E402
from accuracy.runner import run_scenario  # noqa: E402
from accuracy.scenario import Fault, Scenario  # noqa: E402
from accuracy.scenarios import RECORDER_DEFAULTS  # noqa: E402


def _meta(shape, mean, lo, hi, dtype="float32"):
    n = 1
    for d in shape:
        n *= d
    return TensorMeta(shape=shape, dtype=dtype, stride=(), stats=Stats(min=lo, max=hi, mean=mean, std=1.0, numel=n))


def _add(out_mean, op="aten.add.Tensor", alpha=1, b_shape=(4, 64), dtype="float32"):
    rec = Record(seq=0, kind="op", op=op, module="m")
    rec.inputs = {"self": _meta((4, 64), 0.25, -3.0, 3.0), "other": _meta(b_shape, -0.5, -2.0, 2.0), "alpha": alpha}
    rec.outputs = [_meta((4, 64), out_mean, -4.0, 4.0, dtype)]
    return rec


def test_means_that_add_up_are_within_the_floor_and_a_miss_is_beyond_it():
    right = summed_mean_error(_add(-0.25), _add(-0.25).outputs[0], 0)
    assert right.local == 0.0 and right.floor > 0
    # a broadcast bias (64 values repeated 4 times) adds its mean too
    bias = _add(-0.25, b_shape=(64,))
    assert summed_mean_error(bias, bias.outputs[0], 0).local == 0.0
    sub = _add(0.75, op="aten.sub.Tensor")
    assert summed_mean_error(sub, sub.outputs[0], 0).local == 0.0
    scaled = _add(-0.75, alpha=2)
    assert summed_mean_error(scaled, scaled.outputs[0], 0).local == 0.0
    # three of 256 elements doubled (+1 each): the mean moves by 3/256, 3e-3 of the peak
    wrong = _add(-0.25 + 3 / 256)
    le = summed_mean_error(wrong, wrong.outputs[0], 0)
    assert le.local == pytest.approx(3 / 256 / 4) and le.local > 8 * le.floor
    # bf16's own rounding of the output may move its mean by half a unit of its peak
    rounded = _add(-0.25 + 3 / 256, dtype="bfloat16")
    assert summed_mean_error(rounded, rounded.outputs[0], 0).local < summed_mean_error(rounded, rounded.outputs[0], 0).floor


def test_not_a_sum_of_two_tensors_is_not_judged():
    mul = _add(-0.25, op="aten.mul.Tensor")
    assert summed_mean_error(mul, mul.outputs[0], 0) is None
    uneven = _add(-0.25, b_shape=(3,))  # 256 is no multiple of 3: not an even broadcast
    assert summed_mean_error(uneven, uneven.outputs[0], 0) is None


@pytest.mark.slow
def test_a_sparse_bug_in_a_statistics_only_residual_add_is_named():
    """Qwen3 under bf16 autocast, the defaults: three elements of a float32 residual add doubled
    (tools/accuracy's "few" fault). Its statistics moved 4.5 % from the bench's, within bf16's
    warning band and within what its inputs' samples carry; its sample missed the three. Its
    mean is not its inputs' means added: a local error beyond its floor, and it is named."""
    entry = next((x for x in zoo.listed() if x.model_type == "qwen3"), None)
    if entry is None:
        pytest.skip("this transformers has no qwen3")
    s = Scenario("t/qwen3", "bug", zoo.register(entry), noise="bf16", fault=Fault("aten.add.Tensor", 8, "few", 1.0),
                 **RECORDER_DEFAULTS)
    o = run_scenario(s)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact, fd
    assert (fd["origin"], fd["cause"]) == ("born", "local error"), fd
