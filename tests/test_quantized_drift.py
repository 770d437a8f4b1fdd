"""Quantization as a drift axis: int8 flows run for real (ONNX Runtime QDQ, ExecuTorch PT2E with
the XNNPACK quantizer), per-layer SQNR and relative error against float eager, a budget from int8
rounding, and injected quantization bugs named as the layer beyond it."""
from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xray
from xray.drift import examples as ex
from xray.numerics import quantization as qn

ROOT = Path(__file__).resolve().parent.parent
SLOW = pytest.mark.slow
ORT = "onnxrt-cpu:quant=int8"


def _layers(b) -> dict[str, dict]:
    return {lr["layer"]: lr for lr in b.quant["layers"]}


def _assert_named(b, layer: str) -> None:
    """``layer`` is the worst and the only layer beyond int8; every other layer is within."""
    rows = _layers(b)
    assert b.quant["worst"][0] == layer, b.quant
    assert b.quant["first_beyond"] == layer
    assert rows[layer]["verdict"] == "beyond int8"
    others = {k: v["verdict"] for k, v in rows.items() if k != layer}
    assert set(others.values()) == {"within int8"}, others


# --- the budget -------------------------------------------------------------------------------

def test_int8_rounding_noise_matches_the_uniform_model():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    step = qn.activation_step(x)
    q = torch.round(x / step) * step
    measured = qn.nsr(x, q)
    assert 0.7 < measured / qn.activation_nsr(x) < 1.3
    assert qn.sqnr_db(measured) == pytest.approx(-10 * math.log10(measured))
    assert qn.rel_err(x, q) == pytest.approx(math.sqrt(measured))
    assert qn.within(measured, qn.Budget(0.0, 0.0, qn.activation_nsr(x), step))
    assert not qn.within(qn.nsr(x, 1.05 * x), qn.Budget(0.0, 0.0, qn.activation_nsr(x), step))


def test_per_channel_weights_cost_less_than_one_scale_would():
    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    w[:2] *= 30  # two wide channels
    per_channel = qn.weight_nsr(w)
    step = float(w.abs().max()) / 127
    per_tensor = qn.nsr(w, torch.round(w / step) * step)
    assert per_tensor > 3 * per_channel


def test_a_layer_norm_raises_the_nsr_it_is_fed_by_its_mean():
    x = torch.randn(8, 64) + 3.0
    assert qn.normalization_gain(x, 1) == pytest.approx(float((x ** 2).mean() / x.var(dim=1, unbiased=False).mean()))
    assert qn.combine("mm", [(1e-4, 1.0), (2e-4, 1.0)], 1.0) == pytest.approx(3e-4)
    assert qn.combine("add", [(1e-4, 1.0), (1e-4, 3.0)], 4.0) == pytest.approx(1e-4)


# --- options ----------------------------------------------------------------------------------

def test_an_unknown_scheme_is_refused_before_any_work(tmp_path):
    from xray.backends.registry import UnknownBackendError

    with pytest.raises(UnknownBackendError, match=r"quant='int3' is not supported; quant takes int8, int8-dynamic, int4$"):
        xray.drift(torch.nn.Linear(2, 2), (torch.randn(1, 2),), ["onnxrt-cpu:quant=int3"], tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_scheme_a_backend_does_not_run_is_refused_naming_the_ones_it_does(tmp_path):
    from xray.backends.registry import UnknownBackendError

    with pytest.raises(UnknownBackendError, match=r"'executorch-xnnpack': quant='int4' is not supported; "
                                                  r"quant takes int8, int8-dynamic$"):
        xray.drift(torch.nn.Linear(2, 2), (torch.randn(1, 2),), ["executorch-xnnpack:quant=int4"], tmp_path)
    with pytest.raises(UnknownBackendError, match=r"quant takes int8-weights, int4$"):
        xray.drift(torch.nn.Linear(2, 2), (torch.randn(1, 2),), ["coreml:quant=int8"], tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_the_cli_refuses_an_unknown_scheme_with_exit_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "xray.cli", "drift", "xray.drift.examples:tiny_mlp",
                           "--backend", "executorch-xnnpack:quant=int4", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "int8" in proc.stderr and "Traceback" not in proc.stderr


# --- ONNX Runtime QDQ -------------------------------------------------------------------------

def test_ort_int8_mlp_clean_layers_pass_and_a_wrong_weight_scale_is_named(tmp_path):
    model, args = ex.tiny_mlp()
    faulty = ORT + ",threads=1"  # a second name for the same flow: one clean run, one with the bug
    r = xray.drift(model, args, [ORT, faulty], tmp_path, edits={faulty: ex.onnx_weight_scale_fault("fc2", 1.5)})
    clean, bad = r.backends
    assert clean.status == "OK" and bad.status == "OK", (clean.error, bad.error)
    assert clean.facts["quantize_nodes"] > 0 and clean.facts["quant"].startswith("int8 onnxruntime")
    rows = _layers(clean)
    assert {"fc1", "fc2", "fc3", "head"} <= set(rows)
    assert clean.quant["first_beyond"] is None
    assert {v["verdict"] for v in rows.values()} == {"within int8"}
    assert all(v["sqnr_db"] > 30 for v in rows.values()), rows  # int8 of a 4-layer MLP: ~40 dB
    assert clean.quant["output_sqnr_db"] > 30
    _assert_named(bad, "fc2")
    assert _layers(bad)["fc2"]["sqnr_db"] < 15 and _layers(bad)["fc1"]["sqnr_db"] > 30
    with open(tmp_path / "quant-onnxrt-cpu_quant_int8_threads_1.csv") as fh:
        table = list(csv.DictReader(fh))
    assert {"layer", "verdict", "sqnr_db", "rel_err"} <= set(table[0])
    assert [t["layer"] for t in table if t["verdict"] == "beyond int8"] == ["fc2"]
    from xray.drift.report import terminal_report

    text = terminal_report(r)
    assert "beyond int8 quantization: fc2" in text and "none beyond int8 quantization" in text


@pytest.mark.parametrize("scheme", ["int8", "int8-dynamic"])
def test_int8_stored_as_uint8_computes_the_same_model(scheme, tmp_path, monkeypatch):
    """ONNX Runtime's uint8 x int8 GEMM saturates pair sums on x86 without VNNI: both int8 flows
    store ORT's int8 result as uint8 around 128, which every CPU sums exactly. The stored model
    must compute what ORT's int8 model computes, bit for bit where int8 sums exactly (here; on a
    CPU where they saturate, the uint8 model is the one that stays within int8's budget)."""
    import copy

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto

    from xray.backends import quantize

    model, args = ex.tiny_mlp()
    feed = {"x": args[0].numpy()}
    torch.onnx.export(model, args, tmp_path / "float.onnx", dynamo=False, input_names=["x"])
    with monkeypatch.context() as m:  # the flow as ORT leaves it: int8, stored as it is
        m.setattr(quantize, "as_uint8", lambda model, facts: model)
        int8 = quantize.ort_quantize(onnx.load(tmp_path / "float.onnx"), [feed], {}, scheme)
    facts = {}
    stored = quantize.as_uint8(copy.deepcopy(int8), facts)
    assert TensorProto.INT8 in {i.data_type for i in int8.graph.initializer}
    assert TensorProto.INT8 not in {i.data_type for i in stored.graph.initializer}
    assert facts["int8_storage"].startswith("uint8 + 128")
    for before, after in zip(int8.graph.initializer, stored.graph.initializer):  # the same integers, shifted
        a, b = onnx.numpy_helper.to_array(before), onnx.numpy_helper.to_array(after)
        assert np.array_equal(a.astype(np.int16) + (128 if a.dtype == np.int8 else 0), b.astype(np.int16))
    floats, q8, u8 = [ort.InferenceSession(graph, providers=["CPUExecutionProvider"]).run(None, feed)[0].astype(np.float64)
                      for graph in (str(tmp_path / "float.onnx"), int8.SerializeToString(), stored.SerializeToString())]
    nsr = {name: float(((y - floats) ** 2).sum() / (floats ** 2).sum()) for name, y in (("int8", q8), ("uint8", u8))}
    assert nsr["uint8"] < 1e-3, nsr  # int8 of a 4-layer MLP: about 40 dB
    # bit for bit where ORT's int8 kernel sums exactly; where it saturates, int8 is the worse one
    assert np.array_equal(q8, u8) or nsr["int8"] > nsr["uint8"], nsr


@SLOW
def test_ort_int8_bert_encoder_names_a_wrong_scale_in_one_dense_layer(tmp_path):
    model, args = ex.tiny_bert()
    layer = "encoder.layer.1.intermediate.dense"
    faulty = ORT + ",threads=1"
    r = xray.drift(model, args, [ORT, faulty], tmp_path, edits={faulty: ex.onnx_weight_scale_fault(layer, 1.5)})
    clean, bad = r.backends
    assert clean.quant["first_beyond"] is None, [lr for lr in clean.quant["layers"] if lr["verdict"] != "within int8"]
    _assert_named(bad, layer)


@SLOW
def test_ort_int8_at_real_size_names_the_fault(tmp_path):
    model, args = ex.tiny_mlp(hidden=1024, batch=32)
    faulty = ORT + ",threads=1"
    r = xray.drift(model, args, [ORT, faulty], tmp_path, edits={faulty: ex.onnx_weight_scale_fault("fc3", 1.25)})
    clean, bad = r.backends
    assert clean.quant["first_beyond"] is None
    _assert_named(bad, "fc3")


# --- ExecuTorch PT2E (XNNPACK quantizer) --------------------------------------------------------

@SLOW
def test_pt2e_int8_portable_names_a_wrong_weight_scale(tmp_path):
    model, args = ex.tiny_mlp()
    faulty = "executorch-portable:quant=int8,partitioner=None"
    r = xray.drift(model, args, ["executorch-portable:quant=int8", faulty], tmp_path,
                   edits={faulty: ex.pt2e_weight_scale_fault("fc2", 1.5)})
    clean, bad = r.backends
    assert clean.status == "OK", clean.error
    assert clean.mapped == clean.eager_records  # the portable kernels log every node
    assert clean.quant["first_beyond"] is None, clean.quant
    _assert_named(bad, "fc2")


@SLOW
def test_pt2e_int8_xnnpack_runs_and_judges_its_delegate_boundaries(tmp_path):
    model, args = ex.tiny_mlp()
    faulty = "executorch-xnnpack:quant=int8,partitioner=xnnpack"
    r = xray.drift(model, args, ["executorch-xnnpack:quant=int8", faulty], tmp_path,
                   edits={faulty: ex.pt2e_weight_scale_fault("fc2", 1.5)})
    clean, bad = r.backends
    assert clean.status == "OK", clean.error
    assert clean.facts["delegated_nodes"] >= 1 and clean.quant["output_sqnr_db"] > 30
    assert clean.quant["first_beyond"] is None
    # inside one delegate nothing is exposed: the bug shows at the delegate's output
    assert bad.quant["first_beyond"] is not None and bad.quant["output_sqnr_db"] < 15


# --- a weighted layer fed float inputs: its own rounding, predicted exactly --------------------

def _round_per_channel(w: torch.Tensor) -> torch.Tensor:
    s = w.abs().reshape(w.shape[0], -1).amax(dim=1).reshape(-1, *([1] * (w.dim() - 1))) / 127
    return torch.round(w / s) * s


def _round_per_tensor(w: torch.Tensor) -> torch.Tensor:
    s = w.abs().max() / 127
    return torch.round(w / s) * s


def test_a_layers_local_noise_is_what_per_channel_weight_rounding_predicts_and_per_tensor_is_not():
    g = torch.Generator().manual_seed(0)
    x = torch.relu(torch.randn(16, 64, generator=g)).double()
    w = (0.05 * torch.randn(96, 64, generator=g)).double()  # transformers' normal init: channels share a range
    predicted, _ = qn.local_noise_power("mm", x, w)
    per_channel = float(((x @ (_round_per_channel(w) - w).t()) ** 2).sum())
    per_tensor = float(((x @ (_round_per_tensor(w) - w).t()) ** 2).sum())
    assert 0.85 < per_channel / predicted < 1.15
    assert per_tensor / predicted > 1.5 * qn.LOCAL_MARGIN

    conv = torch.randn(2, 3, 12, 12, generator=g).double()
    k = (0.1 * torch.randn(8, 3, 3, 3, generator=g)).double()
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    f = torch.ops.aten.convolution.default
    predicted, _ = qn.local_noise_power("convolution", conv, k, args)
    measured = float(((f(conv, _round_per_channel(k), None, *args) - f(conv, k, None, *args)) ** 2).sum())
    assert 0.8 < measured / predicted < 1.2


def test_the_input_and_output_rounding_of_a_layer_are_predicted_too():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 48, generator=g).double()
    w = (0.1 * torch.randn(40, 48, generator=g)).double()
    step = qn.activation_step(x)
    _, predicted = qn.local_noise_power("mm", x, w, input_step=step)
    measured = float((((torch.round(x / step) * step - x) @ w.t()) ** 2).sum())
    assert 0.8 < measured / predicted < 1.2
    y = x @ w.t()
    out_step = qn.activation_step(y)
    assert qn.grid_step(torch.round(y / out_step) * out_step) == pytest.approx(out_step, rel=1e-6)
    assert qn.grid_step(y) is None  # float values: no grid


@SLOW
def test_ort_int8_names_a_per_tensor_weight_where_per_channel_was_meant(tmp_path):
    """The accumulated budget cannot see it (2-3x one layer's weight noise, inside its margin);
    the layer fed float inputs shows it against what per-channel rounding predicts."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_quant_faults import onnx_per_tensor_fault

    model, args = ex.tiny_mlp()
    with torch.no_grad():  # transformers-style normal init (nn.Linear's uniform init gives every channel one range)
        for i, m in enumerate(m for m in model.modules() if isinstance(m, torch.nn.Linear)):
            m.weight.copy_(0.1 * torch.randn(m.weight.shape, generator=torch.Generator().manual_seed(i)))
    faulty = ORT + ",threads=1"
    r = xray.drift(model, args, [ORT, faulty], tmp_path, edits={faulty: onnx_per_tensor_fault("fc2")})
    clean, bad = r.backends
    assert clean.quant["first_beyond"] is None, clean.quant["layers"]
    assert all(lr["local_ratio"] <= qn.LOCAL_MARGIN for lr in clean.quant["layers"] if lr.get("local_ratio") is not None)
    _assert_named(bad, "fc2")
    assert _layers(bad)["fc2"]["local_ratio"] > qn.LOCAL_MARGIN
    # fed float, ONNX Runtime's int8 kernel rounds each row of the input in blocks (fc2..head)
    # or reads it from its per-tensor Q/DQ (fc1, the model input): both explained, not guessed
    budgets = clean.quant["local_budgets"]
    assert {b["input_rounding"] for b in budgets.values()} <= {"per tensor", "blocks", "float"}
    assert budgets["addmm"]["input_rounding"] == "per tensor" and budgets["addmm_1"]["input_rounding"] == "blocks"
    assert all(0.8 < b["ratio"] < 1.2 for b in budgets.values()), budgets


def test_an_elementwise_ops_gain_is_measured_at_its_float_input():
    angle = torch.linspace(0, 7, 256, dtype=torch.float64)  # a rotary angle: position x frequency
    gain = qn.elementwise_gain(angle, torch.cos, 1e-5)
    assert gain > 3 * qn.NONLINEAR_GAIN  # cos near its zeros: a small relative error on the angle grows
    assert qn.elementwise_gain(angle, lambda t: t.clone(), 1e-5) == pytest.approx(1.0)
    assert qn.combine("cos", [(1e-5, 1.0)], 1.0, gain) == pytest.approx(gain * 1e-5)
    assert qn.combine("relu", [(1e-5, 1.0)], 1.0, 0.5) == pytest.approx(qn.NONLINEAR_GAIN * 1e-5)


def _simulated_layer(weights):
    """A layer fed float input whose kernel rounded that input per row in blocks (ONNX Runtime's
    MatMulNBits) and multiplied by ``weights(w)``: (its error against float, x, w)."""
    g = torch.Generator().manual_seed(2)
    x = torch.nn.functional.gelu(3 * torch.randn(24, 64, generator=g)).double()  # a wide GELU range
    w = (0.05 * torch.randn(48, 64, generator=g)).double()
    xq = qn.input_roundings(x, qn.activation_step(x), "mm")["blocks"]
    return xq @ weights(w).t() - x @ w.t(), x, w


def test_a_layers_known_input_rounding_is_taken_out_and_its_weights_judged_alone():
    err, x, w = _simulated_layer(_round_per_channel)
    left, predicted, how = qn.weight_error_alone("mm", err, x, w, (), qn.activation_step(x))
    assert how == "blocks" and 0.85 < left / predicted < 1.15
    err, x, w = _simulated_layer(_round_per_tensor)
    left, predicted, how = qn.weight_error_alone("mm", err, x, w, (), qn.activation_step(x))
    assert left / predicted > 1.3 * qn.LOCAL_MARGIN  # 2.2x: per-tensor on weights whose channels share a range


class _NormThenRow(torch.nn.Module):
    """ViT's tail: a residual sum, its layer norm, the class token's row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1.0
        return torch.nn.functional.layer_norm(h, (h.shape[-1],))[:, 0]


def test_a_layer_norm_and_a_row_of_it_inherit_what_their_captured_input_carries_row_by_row():
    """The class token's row has a small variance: a layer norm raises its NSR far more than
    the tensor's mean over variance says, and its row keeps that NSR, not the tensor's."""
    from xray.drift.quant import quant_report
    from torch.fx.interpreter import Interpreter

    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 17, 32, generator=g)
    x[:, 0] = 0.5 + 0.02 * torch.randn(32, generator=g)  # the class token: a row of small variance
    program = torch.export.export(_NormThenRow(), (x,)).run_decompositions()
    eager: dict[str, list[torch.Tensor]] = {}

    class Record(Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            eager[n.name] = [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)] \
                if isinstance(out, (list, tuple)) else []
            return out

    Record(program.module()).run(x)
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    mul, norm = next(n for n in nodes if "mul" in str(n.target)), next(n for n in nodes if "layer_norm" in str(n.target))
    row = nodes[-1]
    step = qn.activation_step(eager[mul.name][0])
    h = torch.round(eager[mul.name][0] / step) * step  # int8 rounding of the sum
    normed = torch.nn.functional.layer_norm(h, (32,))
    captured = {mul.name: [h], norm.name: [normed], row.name: [normed[:, 0]]}
    placeholders = {n.name: x for n in program.graph.nodes if n.op == "placeholder"}
    layers = {n.name: "m" for n in nodes}
    report = quant_report(program, eager, placeholders, captured, layers, "int8")
    assert report.first_beyond is None, report.layers
    assert qn.nsr(eager[row.name][0], normed[:, 0]) > 10 * qn.nsr(eager[norm.name][0], normed)  # the row's is far larger


class _IndexedLinear(torch.nn.Module):
    """A linear layer read through integer index arithmetic (transformers' Llama builds its mask
    indices as ``arange + 0``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(x.shape[0]) + 0
        return self.fc(x)[rows] * 2.0


@SLOW
def test_pt2e_int8_keeps_integer_index_arithmetic_integer():
    from xray.backends.quantize import pt2e_quantize

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    source = torch.export.export(_IndexedLinear().eval(), (x,))
    facts: dict = {}
    converted, _ = pt2e_quantize(source, (x,), {}, facts)
    assert facts["quantize_nodes"] > 0
    assert qn.sqnr_db(qn.nsr(source.module()(x), converted(x))) > 25  # int8 of one small layer: ~35 dB
