"""A normalization's self-check (record/self_check.py: ``_normalization``, ``_normalization_backward``).

A norm's mean and rstd after a convolution under TF32 or in a training step differ by more than
the statistics-only rules allow an average of independent errors: TF32 rounds each weight once,
so a channel's errors are alike and do not average down. Those rules cannot tell that from a
bug; the norm's own local error can. Each output (the normalised output, the fused kernels'
saved mean and rstd, a backward's input gradient and a batch norm's weight and bias gradients)
is recomputed from the call's own inputs in float64 on a subset of its rows.

Measured at 7fc5d6a, before these checks: BiT (group norm) in training mode under TF32, 71 FAIL
rows with the defaults; a transformers ResNet training step in training mode, 324."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from xray.numerics.rules import Rules, eps
from xray.record.self_check import NORM_ELEMENTS, NORM_ROWS, self_checks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

aten = torch.ops.aten
C = 32


def _calls(dtype: torch.dtype, offset: float):
    """(op name, bound arguments, outputs) of every normalization the check covers, forward and
    backward, on one input (with ``offset`` added: a mean far from 0, where a one-pass variance
    cancels)."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, C, 7, 7, generator=gen) * 3 + offset).to(dtype)
    g = torch.randn(4, C, 7, 7, generator=gen).to(dtype)
    w, b = torch.randn(C, generator=gen).to(dtype), torch.randn(C, generator=gen).to(dtype)
    wl, bl = torch.randn(7, 7, generator=gen).to(dtype), torch.randn(7, 7, generator=gen).to(dtype)
    rm, rv = torch.randn(C, generator=gen).to(dtype), (torch.rand(C, generator=gen) + 0.5).to(dtype)
    calls = []
    gn = dict(input=x, weight=w, bias=b, N=4, C=C, HxW=49, group=8, eps=1e-5)
    out, mean, rstd = aten.native_group_norm.default(*gn.values())
    calls.append(("aten.native_group_norm.default", gn, (out, mean, rstd)))
    gnb = dict(grad_out=g, input=x, mean=mean, rstd=rstd, weight=w, N=4, C=C, HxW=49, group=8,
               output_mask=[True] * 3)
    calls.append(("aten.native_group_norm_backward.default", gnb, aten.native_group_norm_backward.default(*gnb.values())))
    ln = dict(input=x, normalized_shape=[7, 7], weight=wl, bias=bl, eps=1e-5)
    out, mean, rstd = aten.native_layer_norm.default(*ln.values())
    calls.append(("aten.native_layer_norm.default", ln, (out, mean, rstd)))
    lnb = dict(grad_out=g, input=x, normalized_shape=[7, 7], mean=mean, rstd=rstd, weight=wl, bias=bl,
               output_mask=[True] * 3)
    calls.append(("aten.native_layer_norm_backward.default", lnb, aten.native_layer_norm_backward.default(*lnb.values())))
    for training in (True, False):
        bn = dict(input=x, weight=w, bias=b, running_mean=rm.clone(), running_var=rv.clone(), training=training,
                  momentum=0.1, eps=1e-5)
        out, mean, invstd = aten.native_batch_norm.default(*bn.values())
        calls.append(("aten.native_batch_norm.default", {**bn, "running_mean": rm, "running_var": rv} if training
                      else bn, (out, mean, invstd)))
        bnb = dict(grad_out=g, input=x, weight=w, running_mean=rm, running_var=rv, save_mean=mean if training else None,
                   save_invstd=invstd if training else None, train=training, eps=1e-5, output_mask=[True] * 3)
        calls.append(("aten.native_batch_norm_backward.default", bnb,
                      aten.native_batch_norm_backward.default(*bnb.values())))
    rms = dict(input=x, normalized_shape=[7], weight=wl[0], eps=1e-6)
    calls.append(("aten._fused_rms_norm.default", rms, aten._fused_rms_norm.default(*rms.values())))
    # the fused RMS norm backward has no CPU kernel: autograd's gradient of the public op, in float64
    xa, wa = x.double().requires_grad_(), wl[0].double().requires_grad_()
    torch.nn.functional.rms_norm(xa, [7], wa, 1e-6).backward(g.double())
    calls.append(("aten._fused_rms_norm_backward.default", dict(
        grad_out=g, input=x, normalized_shape=[7], rstd=aten._fused_rms_norm.default(*rms.values())[1], weight=wl[0],
        output_mask=[True, True]), (xa.grad.to(dtype), wa.grad.to(dtype))))
    for name, op, args in (("aten.group_norm.default", aten.group_norm.default, (x, 8, w, b, 1e-5)),
                           ("aten.layer_norm.default", aten.layer_norm.default, (x, [7, 7], wl, bl, 1e-5)),
                           ("aten.rms_norm.default", aten.rms_norm.default, (x, [7], wl[0], 1e-6)),
                           ("aten.batch_norm.default", aten.batch_norm.default, (x, w, b, rm, rv, False, 0.1, 1e-5, False))):
        names = [a.name for a in op._schema.arguments]
        calls.append((name, dict(zip(names, args)), (op(*args),)))
    return calls


def _outputs(name: str, bound: dict) -> set[int]:
    """The outputs each call's check covers: a fused kernel's saved statistics (not a batch
    norm's outside training: it saves none), a backward's weight and bias gradients."""
    half = bound["input"].dtype in (torch.float16, torch.bfloat16)  # (a half-precision kernel's sums: not checked)
    if name in ("aten.native_group_norm_backward.default", "aten.native_layer_norm_backward.default") and half:
        return {0}
    if name in ("aten.native_group_norm.default", "aten.native_layer_norm.default",
                "aten.native_batch_norm_backward.default", "aten.native_group_norm_backward.default",
                "aten.native_layer_norm_backward.default") or (name == "aten.native_batch_norm.default"
                                                               and bound["training"]):
        return {0, 1, 2}
    if name == "aten._fused_rms_norm_backward.default":
        return {0} if half else {0, 1}
    return {0, 1} if name == "aten._fused_rms_norm.default" else {0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("offset", [0.0, 30.0])
def test_a_right_normalization_reads_within_its_dtypes_own_rounding(dtype, offset):
    """Each output's residual stays below the floor compare allows a kernel of its dtype
    (Rules.is_local_error: 8 x the output's rounding, plus 2 eps), an offset mean included."""
    for name, bound, outs in _calls(dtype, offset):
        got = self_checks(name, bound, list(outs))
        assert set(got) == _outputs(name, bound), (name, got)
        for k, check in got.items():
            dt = outs[k].dtype
            assert not Rules().is_local_error(check[0], eps(dt) / 2 / math.sqrt(3), dt), (name, k, check)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_one_percent_wrong_in_any_output_reads_as_that(dtype):
    """Read against its terms, a 1 % error reads at least a third of it here (a batch norm
    outside training subtracts running means of a third of its inputs' scale), and in float32 it
    is a local error by compare's rule."""
    for name, bound, outs in _calls(dtype, 0.0):
        for k in _outputs(name, bound):
            wrong = [o * 1.01 if i == k else o for i, o in enumerate(outs)]
            got = self_checks(name, bound, wrong)
            assert 3e-3 < got[k][0] < 2e-2, (name, k, got)
            if dtype == torch.float32:
                assert Rules().is_local_error(got[k][0], eps(dtype) / 2 / math.sqrt(3), dtype)


def test_a_wrong_group_count_reads_as_a_wrong_output():
    x = torch.randn(4, C, 7, 7) * torch.linspace(0.5, 3.0, C)[:, None, None]  # channels of unlike scales
    w, b = torch.randn(C), torch.randn(C)
    out = aten.native_group_norm.default(x, w, b, 4, C, 49, 4, 1e-5)  # 4 groups where the call says 8
    got = self_checks("aten.native_group_norm.default", dict(input=x, weight=w, bias=b, N=4, C=C, HxW=49, group=8,
                                                              eps=1e-5), list(out))
    assert set(got) == {0} and got[0][0] > 0.03  # (7 %); its statistics are of another shape: not compared


def test_a_large_normalization_is_checked_on_a_bounded_subset_of_its_rows():
    """A real-size layer norm (512 tokens, hidden 1024) reads at most NORM_ROWS rows, and a
    batch norm channel of 100,352 values (32 x 56 x 56) one row: NORM_ELEMENTS bounds the copy."""
    x, w = torch.randn(1, 512, 1024), torch.randn(1024)
    out = list(aten.native_layer_norm.default(x, [1024], w, w, 1e-5))
    out[0][0, 5] += 1.0  # one row wrong, outside... or inside the checked subset: either way bounded
    got = self_checks("aten.native_layer_norm.default", dict(input=x, normalized_shape=[1024], weight=w, bias=w,
                                                              eps=1e-5), out)
    assert set(got) == {0, 1, 2}
    assert NORM_ROWS * 1024 <= NORM_ELEMENTS
    x = torch.randn(32, 4, 56, 56)
    out = aten.native_batch_norm.default(x, None, None, None, None, True, 0.1, 1e-5)
    got = self_checks("aten.native_batch_norm.default", dict(input=x, weight=None, bias=None, running_mean=None,
                                                              running_var=None, training=True, eps=1e-5), list(out))
    assert set(got) == {0, 1, 2} and all(v[0] < 1e-6 for v in got.values())


def test_a_group_norm_training_step_under_tf32_has_no_fail_and_a_wrong_norm_is_born_there(tmp_path):
    """BiT in training mode (group norms after weight-standardised convolutions), fp32 against
    TF32, recorder defaults with backward: before these checks, 71 FAIL rows (its first: a group
    norm's mean, "inherited, and more"). A 1 % error in one group norm's output, on the same
    TF32 run, is born at that call."""
    pytest.importorskip("transformers")
    from accuracy.runner import run_scenario
    from accuracy.scenario import Fault, Scenario
    from accuracy.scenarios import RECORDER_DEFAULTS

    common = dict(arch="bit", noise="tf32", backward=True, train_mode=True, **RECORDER_DEFAULTS)
    o = run_scenario(Scenario("t/bit", "noise/tf32/trainmode", **common), tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0 and o.summary["first_divergence"] is None, o.summary["first_divergence"]
    assert o.summary["warned"] > 0
    fault = Fault("aten.native_group_norm.default", 3, "rel", 1e-2)
    o = run_scenario(Scenario("t/bit", "bug/tf32/trainmode", fault=fault, **common), tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.exact and o.summary["first_divergence"]["origin"] == "born", o.summary["first_divergence"]


@pytest.mark.parametrize("row_path", ["1", "0"], ids=["row path", "record path"])
def test_each_output_of_a_norm_carries_its_check_through_the_dump(tmp_path, monkeypatch, row_path):
    """Forward and backward of a group norm and a batch norm in training, every call recorded
    with statistics only: each output the check covers keeps its own, on either record path."""
    import xray

    monkeypatch.setenv("XRAY_ROW_PATH", row_path)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.GroupNorm(2, 8), torch.nn.BatchNorm2d(8)).train()
    with xray.dump(dump_dir=tmp_path, X_DEBUG=0x10A, X_DEDUP=False, X_DUMP_NUM=0) as d:
        net(torch.randn(4, 3, 8, 8)).square().mean().backward()
    expect = {"aten.native_group_norm.default": 3, "aten.native_batch_norm.default": 3,
              "aten.native_group_norm_backward.default": 3, "aten.native_batch_norm_backward.default": 3}
    for r in xray.load_dump(d.folder).records:
        if r.op in expect:
            checks = [m.check for _, m in r.output_tensors() if m.check is not None]
            assert len(checks) == expect.pop(r.op) and all(c[0] < 1e-6 for c in checks), (r.op, checks)
    assert not expect


def test_a_deferred_norm_check_reads_as_the_immediate_one():
    """On an accelerator each output's check stays a device tensor until the flush."""
    from xray.dump.column_builder import resolved

    name, bound, outs = _calls(torch.float32, 0.0)[0]
    wrong = [outs[0], outs[1] * 1.01, outs[2]]
    now, later = self_checks(name, bound, wrong), self_checks(name, bound, wrong, defer=True)
    assert set(later) == set(now) == {0, 1, 2}
    for k in now:
        assert isinstance(later[k], torch.Tensor)
        assert resolved(later[k])[0] == pytest.approx(now[k][0], rel=1e-9)


def test_the_check_reads_a_kernels_true_error_on_a_strided_gradient():
    """torch 2.13's CPU ``native_batch_norm_backward`` computes a one-sample gradient laid out
    channels-last with another batch stride (strides (32, 1, 128, 32): a (1, 16, 32) sequence
    transposed back to an image, as LeViT's does) about 140 % wrong (autograd calls the same
    kernel, so the truth here is the formula itself: outside training a batch norm's input
    gradient is ``grad_out w / sqrt(running_var + eps)``, elementwise). The check reads the
    kernel's error, whatever this torch's kernel does."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 32, 4, 4, generator=gen), torch.randn(32, generator=gen)
    rm, rv = torch.randn(32, generator=gen), torch.rand(32, generator=gen) + 0.5
    g = torch.randn(512, generator=gen).as_strided((1, 32, 4, 4), (32, 1, 128, 32))
    exact = g.double() * (w.double() / (rv.double() + 1e-5).sqrt())[:, None, None]
    got = aten.native_batch_norm_backward.default(g, x, w, rm, rv, None, None, False, 1e-5, [True] * 3)
    truth = float((got[0].double() - exact).norm() / exact.norm())
    bound = dict(grad_out=g, input=x, weight=w, running_mean=rm, running_var=rv, save_mean=None, save_invstd=None,
                 train=False, eps=1e-5, output_mask=[True] * 3)
    check = self_checks("aten.native_batch_norm_backward.default", bound, list(got))[0][0]
    assert check == pytest.approx(truth, rel=0.05, abs=1e-6)


def test_a_call_wrong_on_both_runs_says_the_bench_is_no_reference_there():
    """Where the bench's own self-check of an output born wrong is beyond its floor too (torch's
    CPU batch norm backward on the strided gradient above, in both runs), the culprit says so."""
    from types import SimpleNamespace

    from xray.compare.causality import _wrong_on_the_bench_too
    from xray.compare.noise_floor import Floors

    def pending(check: tuple) -> SimpleNamespace:
        meta = SimpleNamespace(check=check, dtype="float32")
        return SimpleNamespace(bench=SimpleNamespace(outputs=[("out0", meta)], op="aten.native_batch_norm_backward.default"),
                               reduce={})

    floors = Floors(Rules())
    assert "wrong on both runs" in _wrong_on_the_bench_too(pending((1.39, math.nan, math.nan)), 0, floors)
    assert _wrong_on_the_bench_too(pending((3e-8, math.nan, math.nan)), 0, floors) == ""



def test_a_call_as_wrong_on_the_bench_is_not_born_there_and_a_bug_beyond_it_is():
    """A target call whose local error is within the precision factor of the bench's own
    self-check, itself beyond its floor, is one kernel's error on both runs: not born there.
    One far beyond the bench's (a bug on top of the kernel's error) still is."""
    from types import SimpleNamespace

    from xray.compare.causality import _as_wrong_on_the_bench
    from xray.compare.noise_floor import Floors

    def pending(target: float, bench: float) -> SimpleNamespace:
        meta = SimpleNamespace(check=(bench, math.nan, math.nan), dtype="float32")
        return SimpleNamespace(bench=SimpleNamespace(outputs=[("out0", meta)], op="aten.native_batch_norm_backward.default"),
                               reduce={}, local={0: SimpleNamespace(local=target)})

    floors = Floors(Rules())
    assert _as_wrong_on_the_bench(pending(1.2, 1.39), 0, floors)
    assert not _as_wrong_on_the_bench(pending(50.0, 1.39), 0, floors)  # a bug beyond the kernel's error
    assert not _as_wrong_on_the_bench(pending(1.2, 3e-8), 0, floors)  # the bench is right there

def test_a_matmul_checks_own_sum_over_a_wide_output_is_within_its_floor():
    """A matmul's self-check sums its output's width in float32 (Freivalds' ``C r``). DeepSeek-V4's
    attention backward makes a (32, 8192) product of 8 terms: its check reads 1.4e-6 to 2.6e-6 on
    every run, where the kernel's own 8-term bound is 6.7e-7. The check's own sum is allowed,
    and a 1e-4 error (a bug, or a wrong kernel) stays beyond it."""
    from xray.compare.local import checked_error
    from xray.compare.noise_floor import Floors
    from xray.dump.model import Stats, TensorMeta

    def le(check: float, shape=(32, 8192), op="aten.mm.default"):
        meta = TensorMeta(shape=shape, dtype="float32", stats=Stats(-1.0, 1.0, 0.0, 0.5, check=(check, math.nan, math.nan)))
        return checked_error(meta, op)

    floors = Floors(Rules())
    assert le(2.6e-6).own_terms == 8192 and not floors.beyond(le(2.6e-6), "aten.mm.default", 8)
    assert floors.beyond(le(1e-4), "aten.mm.default", 8)
    # a narrow output sums few terms: the same reading is beyond the 8-term bound
    assert le(2.6e-6, (32, 8)).own_terms == 8 and floors.beyond(le(2.6e-6, (32, 8)), "aten.mm.default", 8)
    # a convolution's check sums its channels
    assert le(1e-6, (2, 512, 4, 4), "aten.convolution.default").own_terms == 512
    assert le(1e-6, (2, 512, 4, 4), "aten.sum.dim_IntList").own_terms == 1
