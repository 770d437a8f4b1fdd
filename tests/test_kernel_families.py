"""Kernel families: a device's kernel for one computation pairs with the CPU's and is judged
against one device-neutral reference (xray/numerics/kernel_families.py).

CUDA's kernels cannot run here, but their schemas are in every torch build: each reference is fed
a real CPU call's values under the member's own argument names and must reproduce the CPU
kernel's outputs in float64. End to end, a ResNet whose batch norms run another real kernel
(``_native_batch_norm_legit_no_training``, what an exported program calls) must compare clean
against eager and name a bug in that kernel where it is born.
"""
from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from conftest import record_forward

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import xray  # noqa: E402
from accuracy import archs, faults  # noqa: E402
from accuracy.faults import CorruptCall, FusedRmsNormKernel, relative  # noqa: E402
from accuracy.runner import functional_rms_norms  # noqa: E402
from xray.compare import compare_dumps  # noqa: E402
from xray.numerics.kernel_families import kernel_specific, kind_of, reference_of  # noqa: E402

RECORD_ALL = {"X_DEBUG": 0x102, "X_DEDUP": False, "X_DUMP_NUM": 64}  # every call, every tensor saved

ATTENTION_BACKWARD = ("_scaled_dot_product_flash_attention_for_cpu_backward",
                      "_scaled_dot_product_efficient_attention_backward",
                      "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_cudnn_attention_backward")
BATCH_NORM = ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "_native_batch_norm_legit",
              "_native_batch_norm_legit_no_training", "_batch_norm_with_update", "_batch_norm_no_update")
BATCH_NORM_BACKWARD = ("native_batch_norm_backward", "cudnn_batch_norm_backward", "miopen_batch_norm_backward",
                       "batch_norm_backward")


def _op(name: str) -> str:
    return f"aten.{name}.default"


@pytest.mark.parametrize("group", (ATTENTION_BACKWARD, BATCH_NORM, BATCH_NORM_BACKWARD))
def test_every_member_aligns_as_one_kind(group):
    kinds = {kind_of(_op(name)) for name in group}
    assert len(kinds) == 1 and None not in kinds
    assert kind_of(_op(group[0])) != kind_of("aten.native_layer_norm.default")


def test_a_cudnn_batch_norms_saved_statistics_are_not_compared_with_the_cpus():
    cpu, cuda = _op("native_batch_norm"), _op("cudnn_batch_norm")
    assert kernel_specific(cpu, cuda, "out0") is None
    assert "kernel-specific" in kernel_specific(cpu, cuda, "out1")
    assert kernel_specific(cpu, cpu, "out1") is None  # one kernel on both sides: all outputs compared
    assert kernel_specific(cpu, cpu, "out1", ("(16,)", "(16,)")) is None


def test_one_kernel_whose_saved_statistics_are_a_placeholder_on_one_device_is_not_compared_there():
    """CPU's eval-mode native_batch_norm returns an empty save_mean, CUDA's one of C elements
    (real H200 dumps: tests/fixtures/cuda-h200, resnet/dev_bf16); the output itself still is."""
    op = _op("native_batch_norm")
    assert "placeholder" in kernel_specific(op, op, "out1", ("(0,)", "(16,)"))
    assert kernel_specific(op, op, "out0", ("(1, 16, 8, 8)", "(2, 16, 8, 8)")) is None  # a primary: compared


def _attention_call(causal: bool, scale: float | None):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.float64, generator=g) for _ in range(3))
    grad = torch.randn(2, 4, 16, 8, dtype=torch.float64, generator=g)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        q, k, v, 0.0, causal, scale=scale)
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        grad, q, k, v, out, lse, 0.0, causal, scale=scale)
    return dict(query=q, key=k, value=v, out=out, logsumexp=lse), grad, grads


@pytest.mark.parametrize("name", ATTENTION_BACKWARD)
@pytest.mark.parametrize("causal,scale", ((False, None), (True, 0.3)))
def test_attention_backward_reference_reproduces_the_cpu_kernel_under_each_members_names(name, causal, scale):
    values, grad, expected = _attention_call(causal, scale)
    schema = {a.name for a in getattr(torch.ops.aten, name).default._schema.arguments}
    grad_name = "grad_out_" if "grad_out_" in schema else "grad_out"
    call = {**values, grad_name: grad, "is_causal": causal, "scale": scale, "dropout_p": 0.0}
    call = {key: value for key, value in call.items() if key in schema}
    got = reference_of(_op(name))(call)
    assert len(got) == 3
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)  # both float64: one computation


def test_attention_backward_with_dropout_has_no_reference():
    values, grad, _ = _attention_call(False, None)
    with pytest.raises(ValueError, match="dropout"):
        reference_of(_op(ATTENTION_BACKWARD[0]))({**values, "grad_out": grad, "dropout_p": 0.1})


def _bn_inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64, generator=g) * 2 + 1
    w, b = torch.rand(3, dtype=torch.float64, generator=g) + 0.5, torch.randn(3, dtype=torch.float64, generator=g)
    mean, var = torch.randn(3, dtype=torch.float64, generator=g), torch.rand(3, dtype=torch.float64, generator=g) + 0.5
    return x, w, b, mean, var


FIXED_MODE = {"_native_batch_norm_legit_no_training": False, "_batch_norm_no_update": False,
              "_batch_norm_with_update": True}  # the mode these kernels' names imply


@pytest.mark.parametrize("name,training", [(n, t) for n in BATCH_NORM for t in (False, True)
                                           if FIXED_MODE.get(n, t) == t])
def test_batch_norm_reference_reproduces_native_batch_norm(name, training):
    x, w, b, mean, var = _bn_inputs()
    schema = [a.name for a in getattr(torch.ops.aten, name).default._schema.arguments]
    expected = torch.ops.aten.native_batch_norm.default(x, w, b, mean.clone(), var.clone(), training, 0.1, 1e-5)[0]
    values = dict(input=x, weight=w, bias=b, running_mean=mean.clone(), running_var=var.clone(), training=training,
                  momentum=0.1, exponential_average_factor=0.1, eps=1e-5, epsilon=1e-5)
    got = reference_of(_op(name))({key: v for key, v in values.items() if key in schema})
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("training", (False, True))
@pytest.mark.parametrize("name", BATCH_NORM_BACKWARD)
def test_batch_norm_backward_reference_reproduces_native_batch_norm_backward(name, training):
    x, w, b, mean, var = _bn_inputs()
    grad = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    _, save_mean, save_invstd = torch.ops.aten.native_batch_norm.default(x, w, b, mean.clone(), var.clone(),
                                                                         training, 0.1, 1e-5)
    expected = torch.ops.aten.native_batch_norm_backward.default(grad, x, w, mean, var, save_mean, save_invstd,
                                                                 training, 1e-5, [True, True, True])
    schema = [a.name for a in getattr(torch.ops.aten, name).default._schema.arguments]
    # cudnn and miopen take no mode: they are given the batch's statistics in training, none in eval
    saved = (save_mean, save_invstd) if training or "train" in schema or "update" in schema else (None, None)
    values = dict(grad_out=grad, grad_output=grad, input=x, weight=w, running_mean=mean, running_var=var,
                  save_mean=saved[0], save_invstd=saved[1], save_var=saved[1], train=training, update=training,
                  eps=1e-5, epsilon=1e-5, output_mask=[True, True, True], reserveSpace=torch.empty(0),
                  reserve=torch.empty(0))
    got = reference_of(_op(name))({key: v for key, v in values.items() if key in schema})
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


def test_batch_norm_backward_reference_leaves_out_what_the_call_did_not_ask_for():
    x, w, b, mean, var = _bn_inputs()
    grad = torch.ones_like(x)
    got = reference_of(_op("native_batch_norm_backward"))(dict(
        grad_out=grad, input=x, weight=w, running_mean=mean, running_var=var, save_mean=None, save_invstd=None,
        train=False, eps=1e-5, output_mask=[True, False, True]))
    assert got[0] is not None and got[1] is None and got[2] is not None


# -- end to end: a ResNet at 224x224 whose batch norms run another real kernel ------------------------
def _resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(num_channels=3, embedding_size=32, hidden_sizes=[32, 64],
                                                      depths=[1, 1], layer_type="basic", num_labels=10))
    return archs.calibrated(model, seed=1, size=224, batch=2)


@pytest.fixture(scope="module")
def resnet_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("bn_kernel")
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    bench_model, target_model = _resnet(), _resnet()
    legit = torch.ops.aten._native_batch_norm_legit_no_training.default
    for bn in target_model.modules():
        if isinstance(bn, torch.nn.BatchNorm2d):
            bn.forward = lambda x, bn=bn: legit(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, 0.0, bn.eps)[0]
    bench = record_forward(bench_model, root / "bench", pixels, **RECORD_ALL)
    target = record_forward(target_model, root / "target", pixels, **RECORD_ALL)
    corrupt = CorruptCall(str(legit), 3, relative(1e-3))  # below the recorder: the kernel's own output
    faulty = record_forward(target_model, root / "faulty", pixels, fault=corrupt, **RECORD_ALL)
    assert corrupt.hit
    return root, bench, target, faulty


@pytest.mark.slow
def test_batch_norms_of_another_kernel_pair_with_eagers_and_compare_clean(resnet_pair):
    _, bench, target, _ = resnet_pair
    result = compare_dumps(bench, target)
    norms = [r for r in result.rows if "batch_norm" in r.bench_op + r.target_op]
    count = sum(isinstance(m, torch.nn.BatchNorm2d) for m in _resnet().modules())
    assert len(norms) == 3 * count  # three outputs each
    assert all(r.bench_op and r.target_op for r in norms), "a batch norm left unmatched"
    assert {r.status for r in norms if r.tensor == "out0"} == {"pass"}
    assert {r.status for r in norms if r.tensor != "out0"} == {"skip"}  # the kernels' own saved statistics
    assert result.summary.failed == 0 and result.summary.first_divergence is None


def test_a_bug_in_the_other_kernel_is_born_in_its_batch_norm(resnet_pair):
    _, bench, _, faulty = resnet_pair
    fd = compare_dumps(bench, faulty).summary.first_divergence
    assert fd["target_op"] == "aten._native_batch_norm_legit_no_training.default"
    assert fd["op"] == "aten.native_batch_norm.default"
    assert fd["origin"] == "born" and fd["cause"] != "target-only op"
    # judged by the family's reference (F.batch_norm in float64): the kernel's own error
    assert float(fd["local_err"]) > 10 * float(fd["local_floor"])


# -- F.rms_norm: several ops on CPU, one _fused_rms_norm kernel on CUDA -------------------------------
@pytest.mark.parametrize("shape,normalized,weighted", [((2, 5, 8), [8], True), ((3, 4, 6), [4, 6], True),
                                                      ((2, 8), [8], False)])
def test_fused_rms_norm_backward_reference_is_autograds_gradient(shape, normalized, weighted):
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(*normalized, dtype=torch.float64, generator=g, requires_grad=True) if weighted else None
    y = F.rms_norm(x, normalized, w, 1e-5)
    grad = torch.randn(y.shape, dtype=torch.float64, generator=g)
    expected = torch.autograd.grad(y, [x, w] if weighted else [x], grad)
    dims = tuple(range(-len(normalized), 0))
    rstd = torch.rsqrt(x.detach().pow(2).mean(dims, keepdim=True) + 1e-5)  # what the forward kernel saves
    got = reference_of(_op("_fused_rms_norm_backward"))(dict(
        grad_out=grad, input=x.detach(), normalized_shape=normalized, rstd=rstd,
        weight=None if w is None else w.detach(), output_mask=[True, True]))
    torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=1e-12)
    assert (got[1] is None) == (not weighted)
    if weighted:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # a real-size Llama layer recorded three times with every tensor (~12 s)
def test_a_fused_rms_norm_kernel_at_real_size_is_clean_and_its_bug_is_named_with_its_local_error(tmp_path):
    """Hidden 1024, GQA (16 heads, 4 KV), 512 tokens: the target runs F.rms_norm as one fused
    kernel (a CPU kernel registered for ``_fused_rms_norm``, as CUDA has), the bench as pow, mean,
    rsqrt and muls. Clean: no FAIL row. With the kernel 1e-3 off in its second call: that call is
    named, measured wrong on its own inputs through the family's reference."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=1024, intermediate_size=2816,
                                         num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=4,
                                         max_position_embeddings=1024, attn_implementation="sdpa")).eval()
    functional_rms_norms(model)
    ids = torch.randint(0, 512, (1, 512), generator=torch.Generator().manual_seed(1))

    def record(name, fault=None):
        with FusedRmsNormKernel() if name != "bench" else nullcontext():
            return record_forward(model, tmp_path / name, ids, fault=fault, **RECORD_ALL)

    bench, clean = record("bench"), record("clean")
    fault = CorruptCall("aten._fused_rms_norm.default", 1, relative(1e-3))
    faulty = record("faulty", fault)
    assert fault.hit
    result = compare_dumps(bench, clean)
    assert result.summary.failed == 0 and result.summary.first_divergence is None
    fused = [r for r in result.rows if r.target_op == "aten._fused_rms_norm.default"]
    assert len(fused) == 2 * 3 and {r.status for r in fused} == {"unmatched"}  # 3 norms, out and rstd each
    fd = compare_dumps(bench, faulty).summary.first_divergence
    (seq,) = [r.seq for r in xray.load_dump(faulty).records if r.op == "aten._fused_rms_norm.default"][1:2]
    _born_at_the_kernel(fd, "aten._fused_rms_norm.default", seq)


def test_a_generated_test_of_a_closed_form_family_runs_the_devices_own_kernel(tmp_path):
    """A generated test of ``_fused_rms_norm_backward`` (recorded on CUDA) must test that kernel:
    its reference is a closed form, not a public op, so the device runs the op itself and only
    the CPU references run the closed form. Here the CPU plays a device with that kernel."""
    from xray.gen.runtime import OpCheck, OpCheckFailed, T, public_form

    op = torch.ops.aten._fused_rms_norm_backward.default
    device_op, reference_op = public_form(op)
    assert device_op is op and reference_op is not op
    bn = torch.ops.aten.native_batch_norm.default
    device_bn, reference_bn = public_form(bn)
    assert device_bn is reference_bn and device_bn is not bn  # F.batch_norm: each device its own kernel

    def call(check):
        return check.check(op, T((4, 16), torch.float32, lo=-1.0, hi=1.0, mean=0.0),
                           T((4, 16), torch.float32, lo=-2.0, hi=2.0, mean=0.0), [16],
                           T((4, 1), torch.float32, lo=0.5, hi=1.5, mean=1.0),
                           T((16,), torch.float32, lo=0.5, hi=1.5, mean=1.0), [True, True])

    with pytest.raises(pytest.skip.Exception, match="has no kernel on cpu"):
        call(OpCheck("t_plain", tmp_path, device="cpu"))
    with FusedRmsNormKernel():
        assert call(OpCheck("t_kernel", tmp_path, device="cpu")).is_pass
    right = faults._fused_rms_norm_backward
    faults._fused_rms_norm_backward = lambda *a: (right(*a)[0] * (1 + 1e-3), right(*a)[1])
    try:
        with FusedRmsNormKernel(), pytest.raises(OpCheckFailed):
            call(OpCheck("t_bad_kernel", tmp_path, device="cpu"))
    finally:
        faults._fused_rms_norm_backward = right


# -- F.linear: addmm on a contiguous input, mm then add(bias) on a strided one -----------------------
class _Head(torch.nn.Module):
    """A Linear after a transpose; ``contiguous`` decides how F.linear runs it."""

    def __init__(self, contiguous: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.contiguous = torch.nn.Linear(32, 16), contiguous

    def forward(self, x):
        x = x.transpose(1, 2)
        return torch.relu(self.proj(x.contiguous() if self.contiguous else x) + 1.0)


def _born_at_the_kernel(fd: dict | None, op: str, seq: int | None = None) -> None:
    """The target's own kernel (no partner on the bench) is the first divergence, wrong on its
    own inputs (causality._judge_the_target_only)."""
    assert fd is not None and fd["target_op"] == op and fd["origin"] == "born", fd
    assert fd["cause"] == "local error" and "on its own inputs" in fd["culprit"], fd
    assert seq is None or fd["target_seq"] == seq, fd


def _linear_ops(folder):
    return [r.op for r in xray.load_dump(folder).records if r.kind == "op"]


@pytest.mark.parametrize("saved", (64, 0), ids=("tensors", "statistics"))
def test_a_linear_run_as_mm_and_add_against_addmm_compares_clean_and_keeps_a_bug(tmp_path, saved):
    """The bench runs the layer as mm + add(bias), the target as addmm (a device's layout can make
    either side either). An mm's output lacks the bias an addmm's holds: pairing them failed
    every row after it ("parameter ...bias differs", held-out set 7's SegFormer under TF32)."""
    x = torch.randn(2, 32, 24, generator=torch.Generator().manual_seed(1))
    kw = dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=saved)

    bench = record_forward(_Head(False), tmp_path / "b", x, **kw)
    target = record_forward(_Head(True), tmp_path / "t", x, **kw)
    faulty = record_forward(_Head(True), tmp_path / "f", x, fault=CorruptCall("aten.addmm.default", 0, relative(1e-2)), **kw)
    assert "aten.mm.default" in _linear_ops(bench) and "aten.addmm.default" not in _linear_ops(bench)
    assert "aten.addmm.default" in _linear_ops(target)
    clean = compare_dumps(bench, target)
    assert clean.summary.failed == 0 and clean.summary.first_divergence is None
    assert not [r for r in clean.rows if r.bench_op == "aten.mm.default" and r.target_op == "aten.addmm.default"]
    # the addmm, unmatched, is wrong on its own inputs (saved tensors, or its self-check): born there
    fd = compare_dumps(bench, faulty).summary.first_divergence
    assert fd is not None and fd["target_op"] == "aten.addmm.default" and fd["origin"] == "born", fd
    assert fd["cause"] == "local error" and "on its own inputs" in fd["culprit"], fd


# -- recurrent layers: one _cudnn_rnn on CUDA, mkldnn_rnn_layer per layer on CPU -----------------------
def _rnn_args(lstm: torch.nn.Module, x, h0, c0, **extra) -> dict:
    """``_cudnn_rnn``'s arguments by schema name for ``lstm`` (an nn.LSTM or nn.GRU) on ``x``."""
    mode = 2 if isinstance(lstm, torch.nn.LSTM) else 3
    return {"input": x, "weight": lstm._flat_weights, "weight_stride0": 4 if lstm.bias else 2, "weight_buf": None,
            "hx": h0, "cx": c0, "mode": mode, "hidden_size": lstm.hidden_size, "proj_size": 0,
            "num_layers": lstm.num_layers, "batch_first": lstm.batch_first, "dropout": 0.0, "train": False,
            "bidirectional": lstm.bidirectional, "batch_sizes": [], "dropout_state": None, **extra}


@pytest.mark.parametrize("cell,bidirectional,bias", [("LSTM", False, True), ("GRU", True, True), ("LSTM", True, False)])
def test_rnn_reference_reproduces_torchs_rnn_under_the_cudnn_kernels_arguments(cell, bidirectional, bias):
    torch.manual_seed(0)
    rnn = getattr(torch.nn, cell)(8, 16, num_layers=2, batch_first=True, bidirectional=bidirectional,
                                  bias=bias).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 8, dtype=torch.float64, generator=g)
    h0 = torch.randn(2 * (2 if bidirectional else 1), 3, 16, dtype=torch.float64, generator=g)
    c0 = torch.randn_like(h0) if cell == "LSTM" else None
    out, state = rnn(x, (h0, c0) if cell == "LSTM" else h0)
    got = reference_of("aten._cudnn_rnn.default")(_rnn_args(rnn, x, h0, c0))
    torch.testing.assert_close(got[0], out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], state[0] if cell == "LSTM" else state, rtol=1e-12, atol=1e-12)
    assert got[2].numel() == 0 if cell == "GRU" else torch.equal(got[2], state[1])
    grad = torch.randn_like(out)
    dx, dh, dc, dw = reference_of("aten._cudnn_rnn_backward.default")(
        _rnn_args(rnn, x, h0, c0, grad_output=grad, grad_hy=None, grad_cy=None, train=True,
                  output_mask=[True, True, cell == "LSTM", True]))
    xs = x.clone().requires_grad_()
    rnn(xs, (h0, c0) if cell == "LSTM" else h0)[0].backward(grad)
    torch.testing.assert_close(dx, xs.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw[0], rnn._flat_weights[0].grad, rtol=1e-10, atol=1e-12)
    assert (dc is None) == (cell == "GRU") and len(dw) == len(rnn._flat_weights)


def _record_lm(arch: str, folder, kernel: bool, fault=None, backward: bool = False, lm=None) -> Path:
    model = lm() if lm else archs.ARCHS[arch].build()
    inputs = archs.ARCHS[arch].inputs() if lm is None else {"input_ids": torch.randint(
        0, archs.VOCAB, (1, 512), generator=torch.Generator().manual_seed(1))}
    with faults.CudnnRnnKernel() if kernel else nullcontext(), fault if fault else nullcontext():
        with torch.enable_grad() if backward else torch.no_grad(), \
                xray.dump(dump_dir=folder, **{**RECORD_ALL, "X_DEBUG": 0x10A if backward else 0x102}) as d:
            out = model(**inputs)[0]
            if backward:
                out.square().mean().backward()
    return d.folder


@pytest.mark.slow
@pytest.mark.parametrize("arch,backward", [("lstm-lm", False), ("gru-lm", False), ("lstm-lm", True)])
def test_a_cudnn_rnn_kernel_compares_clean_against_onednns_layers_and_its_bug_is_named(arch, backward, tmp_path):
    """The target runs each multi-layer RNN as one ``_cudnn_rnn`` (a CPU kernel registered for it,
    each step's GEMMs on TF32-rounded operands as cuDNN's default allows), the bench as oneDNN's
    ``mkldnn_rnn_layer`` per layer. The kernel had no reference, so it was "target-only op" born:
    3 FAIL rows forward, 24 with the backward. Judged through the RNN family's reference it computed
    right; 2e-2 off in its output (or its backward's), it is named, wrong on its own inputs."""
    from xray.numerics.rules import Rules

    rules = Rules(tf32=True)  # a CUDA run's header: cudnn's allow_tf32, on by default
    bench = _record_lm(arch, tmp_path / "bench", kernel=False, backward=backward)
    clean = _record_lm(arch, tmp_path / "clean", kernel=True, backward=backward)
    summary = compare_dumps(bench, clean, rules=rules).summary
    assert summary.failed == 0 and summary.first_divergence is None, summary.first_divergence
    op = "aten._cudnn_rnn_backward.default" if backward else "aten._cudnn_rnn.default"
    fault = CorruptCall(op, 0, relative(2e-2), "backward" if backward else "forward")
    faulty = _record_lm(arch, tmp_path / "faulty", kernel=True, fault=fault, backward=backward)
    assert fault.hit
    fd = compare_dumps(bench, faulty, rules=rules).summary.first_divergence
    (seq,) = [r.seq for r in xray.load_dump(faulty).records if r.op == op][:1]
    _born_at_the_kernel(fd, op, seq)


class _LargeLSTM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Embedding(archs.VOCAB, 1024)
        self.rnn = torch.nn.LSTM(1024, 1024, num_layers=1, batch_first=True)
        self.decoder = torch.nn.Linear(1024, archs.VOCAB)

    def forward(self, input_ids):
        return (self.decoder(self.rnn(self.encoder(input_ids))[0]),)


@pytest.mark.slow
@pytest.mark.real_size
def test_a_cudnn_lstm_at_real_size_is_clean_and_its_bug_is_named(tmp_path):
    """Hidden 1024, 512 tokens: the same, at a size where TF32's rounding compounds over 512 steps."""
    from xray.numerics.rules import Rules

    rules = Rules(tf32=True)
    bench = _record_lm("lstm-lm", tmp_path / "bench", kernel=False, lm=_LargeLSTM)
    clean = _record_lm("lstm-lm", tmp_path / "clean", kernel=True, lm=_LargeLSTM)
    summary = compare_dumps(bench, clean, rules=rules).summary
    assert summary.failed == 0 and summary.first_divergence is None, summary.first_divergence
    fault = CorruptCall("aten._cudnn_rnn.default", 0, relative(2e-2))
    faulty = _record_lm("lstm-lm", tmp_path / "faulty", kernel=True, fault=fault, lm=_LargeLSTM)
    fd = compare_dumps(bench, faulty, rules=rules).summary.first_divergence
    assert fault.hit
    _born_at_the_kernel(fd, "aten._cudnn_rnn.default")


def test_a_generated_test_of_onednns_rnn_layer_leaves_its_workspace_out(tmp_path):
    """``mkldnn_rnn_layer`` returns output, h_n, c_n and oneDNN's workspace: bytes of the kernel's
    own, which its float64 reference run does not reproduce. The generated test of a recorded
    LSTM failed on the CPU that recorded it ("output 3: 9983 integer/bool element(s) differ");
    it compares the family's primary outputs only."""
    from xray.gen.runtime import OpCheck

    lstm = torch.nn.LSTM(32, 48, batch_first=True)
    g = torch.Generator().manual_seed(0)
    x, h, c = torch.randn(16, 1, 32, generator=g), torch.zeros(1, 48), torch.zeros(1, 48)
    w = [p.detach() for p in lstm._flat_weights]
    op = torch.ops.aten.mkldnn_rnn_layer.default
    check = OpCheck("t_rnn_layer", tmp_path, device="cpu")
    assert check.check(op, x, *w, h, c, False, [], 2, 48, 1, True, False, True, True).is_pass


_OFFS = torch.tensor([3, 8, 8, 16], dtype=torch.int32)  # four groups, one of them empty


@pytest.mark.parametrize("a_shape,b_shape,offs", [
    ((16, 16), (4, 16, 8), _OFFS),  # an MoE's tokens sorted by expert, each expert's weight
    ((4, 8, 16), (4, 16, 8), None),  # a batch
    ((4, 8, 16), (16, 16), _OFFS),  # groups along b's columns
    ((8, 16), (16, 8), _OFFS),  # groups along the shared dimension: the experts' weight gradients
], ids=["2d-3d", "3d-3d", "3d-2d", "2d-2d"])
def test_grouped_mm_reference_reproduces_the_kernel_and_recomputes_it_in_float64(a_shape, b_shape, offs, tmp_path):
    """``_grouped_mm`` refuses float64, so an MoE's expert matmuls had no local error: a 1 % bug
    in one, in a backward, passed as "within the accumulation-order bound" with every tensor
    saved (Mellum, the sweep's first run). Its family's reference is one matmul per group."""
    from xray.compare.local import local_error

    torch.manual_seed(0)
    a, b = torch.randn(a_shape), torch.randn(b_shape).transpose(-1, -2).contiguous().transpose(-1, -2)
    got = torch._grouped_mm(a, b, offs=offs)
    ref = reference_of("aten._grouped_mm.default")({"self": a.double(), "mat2": b.double(), "offs": offs})
    assert ref.shape == got.shape and torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-5)

    def record(folder, scale):
        class Wrong(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                return out * scale if func is torch.ops.aten._grouped_mm.default else out

        with Wrong(), xray.dump(dump_dir=folder, X_DEBUG=0x102, X_DEDUP=False):
            torch._grouped_mm(a, b, offs=offs)
        dump = xray.load_dump(next(folder.iterdir()))
        return dump, next(r for r in dump.records if r.op == "aten._grouped_mm.default")

    for scale, wrong in ((1.0, False), (1.01, True)):
        dump, rec = record(tmp_path / str(scale), scale)
        le = local_error(rec, dump, next(m for _, m in rec.output_tensors()), 0)
        assert le is not None and (le.local > 1e-3) == wrong, le


def test_a_transposed_convolution_has_a_local_error(tmp_path):
    """A transposed convolution (an upsampler) is its own float64 reference: it was refused, so a
    TF32 run's upsampler, with no local error, was born on "inputs agree" (Nemotron's
    transcriber, the sweep's first run)."""
    import xray
    from xray.compare.local import local_error

    torch.manual_seed(0)
    up = torch.nn.ConvTranspose1d(32, 16, 2, stride=2)
    x = torch.randn(1, 32, 8)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEDUP=False, X_DUMP_NUM=100) as d:
        up(x)
    dump = xray.load_dump(d.folder)
    conv = next(r for r in dump.records if r.op == "aten.convolution.default")
    out = next(m for _, m in conv.output_tensors())
    got = local_error(conv, dump, out, 0)
    assert got is not None and got.local <= 8 * got.floor + 1e-6, got


def test_an_rnn_kernels_workspace_is_never_compared(tmp_path):
    """oneDNN's LSTM layer returns its workspace as a fourth output: bytes only its backward reads,
    left partly unwritten. Two identical runs of a 2-layer LSTM (weights requiring grad, so the
    kernel keeps one) differed there: a FAIL row between identical runs (the sweep's Parakeet
    RNN-T, every call). It is skipped as the kernel's own bytes; its three values are compared."""
    torch.manual_seed(0)
    lstm, x = torch.nn.LSTM(32, 64, num_layers=2, batch_first=True).eval(), torch.randn(2, 16, 32)
    folders = []
    for name in ("a", "b"):
        torch.randn(1000, 1000).sum()  # other allocations between the runs, as a real process has
        with xray.dump(dump_dir=tmp_path / name, X_DEDUP=False, X_DUMP_NUM=100) as d:
            lstm(x)
        folders.append(d.folder)
    result = compare_dumps(*folders)
    rows = [r for r in result.rows if r.target_op == "aten.mkldnn_rnn_layer.default"]
    assert [r.status for r in rows if r.tensor != "out3"] == ["pass"] * 6, [(r.tensor, r.status) for r in rows]
    assert all(r.status == "skip" and "workspace" in r.note for r in rows if r.tensor == "out3")
    assert result.summary.failed == 0
