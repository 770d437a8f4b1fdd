"""The deployment configuration matrix: flows x dtypes x shapes x quant x threads as one support
matrix (``xray-replay --matrix``), and the int8 verdict of a quantized op."""
from __future__ import annotations

import json
import textwrap

import pandas as pd
import pytest
import torch

from xray.replay.cli import main as replay_main
from xray.replay.configs import config_of, load_matrix
from xray.replay.matrix import FACT_COLUMNS, MATRIX_COLUMNS
from xray.replay.sweep import load_sweep


def _file(tmp_path, text, name="m.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_axes_cross_into_one_backend_spec_per_configuration(tmp_path):
    m = load_matrix(_file(tmp_path, """\
        sweep: common
        flows: [onnxrt-cpu, "executorch-xnnpack:partitioner=xnnpack"]
        dtypes: [float32, float16]
        shapes: [static, batch]
        quant: [none, int8]
        threads: [1, 2]
        """))
    specs = m.specs()
    assert len(specs) == 2 * 2 * 2 * 2 and len(set(specs)) == len(specs)
    assert specs[:4] == ["onnxrt-cpu:threads=1", "onnxrt-cpu:threads=2", "onnxrt-cpu:quant=int8,threads=1",
                         "onnxrt-cpu:quant=int8,threads=2"]
    assert "executorch-xnnpack:partitioner=xnnpack,dynamic=batch,quant=int8,threads=2" in specs
    assert m.sweep == "common" and m.dtypes == ["float32", "float16"]
    assert config_of("executorch-xnnpack:partitioner=xnnpack,dynamic=batch,quant=int8,threads=2", "float16") == {
        "flow": "executorch-xnnpack,partitioner=xnnpack", "dtype": "float16", "shapes": "batch", "quant": "int8",
        "threads": 2}
    # torch.compile's own ``dynamic`` flag is not a shapes configuration: it stays in the flow
    assert config_of("torch-compile:dynamic=true", "float32")["flow"] == "torch-compile,dynamic=True"


def test_matrix_dtypes_replace_every_entrys_dtype_grid(tmp_path):
    spec = _file(tmp_path, """\
        ops:
          - {op: aten.relu.default, inputs: {self: [[4]]}, dtypes: [float32, bfloat16]}
          - {op: aten.neg.default, inputs: {self: [[4]]}}
          - {op: aten.embedding.default, inputs: {weight: [[8, 4]], indices: {shapes: [[3]], dtype: int64}}}
        modules:
          - {module: nn.ReLU, inputs: [[4]]}
        """, "s.yaml")
    labels = [c.label for c in load_sweep(spec, dtypes=["float32", "float16"]).cases]
    assert labels == ["self=4 float32", "self=4 float16", "self=4 float32", "self=4 float16",
                      "weight=8x4 indices=3 float32", "weight=8x4 indices=3 float16", "input=4 float32",
                      "input=4 float16"]


BAD = {
    "unknown key": ("flows: [onnxrt-cpu]\nshape: [batch]\n", "unknown key 'shape'"),
    "no flows": ("shapes: [batch]\n", "'flows' lists the backend presets"),
    "bad shapes": ("flows: [onnxrt-cpu]\nshapes: [dynamic]\n", "shapes: 'dynamic' is not one of static, batch, seq"),
    "bad quant": ("flows: [onnxrt-cpu]\nquant: [int3]\n", "quant: 'int3' is not one of none, int8, int8-dynamic, int4"),
    "a scheme the flow does not run": ("flows: [executorch-xnnpack]\nquant: [int4]\n",
                                       "quant='int4' is not supported; quant takes int8, int8-dynamic"),
    "bad threads": ("flows: [onnxrt-cpu]\nthreads: [0]\n", "threads: a list of positive integers"),
    "flow without the option": ("flows: [torch-cpu]\nshapes: [batch]\n", "backend 'torch-cpu' takes no option 'dynamic'"),
    "unknown flow": ("flows: [tensorrt]\n", "unknown backend 'tensorrt'"),
    "not yaml": ("flows: [onnxrt-cpu\n", "not a valid matrix (YAML)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_matrix_is_one_line_error_and_exit_2(case, tmp_path, capsys):
    text, expected = BAD[case]
    path = _file(tmp_path, text)
    rc = replay_main(["--matrix", str(path), "--spec", "common", "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and err.startswith(f"xray-replay: error: {path}: "), err
    assert expected in err, err
    assert not (tmp_path / "out").exists()


def test_matrix_dtypes_need_a_sweep(tmp_path, capsys):
    path = _file(tmp_path, "flows: [onnxrt-cpu]\ndtypes: [float16]\n")
    rc = replay_main(["some-dump", "--matrix", str(path), "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "'dtypes' sets a sweep's dtypes" in err


def _fake_int8(t: torch.Tensor) -> torch.Tensor:
    """Per-tensor asymmetric int8 rounding, as a calibrated activation quantizer does it."""
    lo, hi = min(float(t.min()), 0.0), max(float(t.max()), 0.0)
    s = (hi - lo) / 255
    z = round(-lo / s) - 128
    return (torch.clamp(torch.round(t / s) + z, -128, 127) - z) * s


def test_int8_verdict_passes_correct_rounding_and_fails_a_wrong_weight_scale():
    from xray.replay.quant_budget import allowed_nsr
    from xray.replay.opmodule import op_module
    from xray.replay.tolerance import judge_quantized

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(16, 64, generator=g), torch.randn(32, 64, generator=g), torch.randn(32, generator=g)
    module, inputs, _ = op_module(torch.ops.aten.linear.default, (x, w, b), {}, [False, True, True])
    ref = [module(*inputs)[0]]
    allowed = allowed_nsr(module, inputs, ref)  # the weight is a constant: rounded per channel
    step = w.abs().amax(1, keepdim=True) / 127
    w_int8 = torch.clamp(torch.round(w / step), -127, 127)
    right = _fake_int8(torch.nn.functional.linear(_fake_int8(x), w_int8 * step, b))
    wrong = _fake_int8(torch.nn.functional.linear(_fake_int8(x), w_int8 * step * 1.05, b))  # a scale 5 % off
    ok, bad = judge_quantized(ref, [right], allowed), judge_quantized(ref, [wrong], allowed)
    assert ok.ok and ok.mean_rel is not None and ok.max_abs > 0, ok.message
    assert not bad.ok and "beyond int8" in bad.message, bad.outputs


def test_int4_and_dynamic_int8_verdicts_come_from_their_own_steps():
    """A linear under int4 weight-only (float activations) and dynamic int8 (its input rounded at
    run time, its output float): correct rounding passes, a weight scale 20% off does not, and
    static int8's budget would pass int4's error (that is why each scheme has its own)."""
    from xray.numerics.quantization import SCHEMES, weight_rounding_variance
    from xray.replay.opmodule import op_module
    from xray.replay.quant_budget import allowed_nsr
    from xray.replay.tolerance import judge_quantized

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(16, 64, generator=g), torch.randn(32, 64, generator=g), torch.randn(32, generator=g)
    module, inputs, _ = op_module(torch.ops.aten.linear.default, (x, w, b), {}, [False, True, True])
    ref = [module(*inputs)[0]]
    blocks = w.reshape(32, 2, 32)
    peak = blocks.gather(2, blocks.abs().argmax(2, keepdim=True))
    step = -peak / 8  # ONNX Runtime's symmetric int4: the largest magnitude at -8
    w4 = (torch.clamp(torch.round(blocks / step), -8, 7) * step).reshape(32, 64)
    assert torch.allclose((w4 - w).pow(2).reshape(32, 2, 32).mean(-1),
                          weight_rounding_variance(w, SCHEMES["int4"]).reshape(32, 2, 32)[..., 0].float())
    int4 = allowed_nsr(module, inputs, ref, "int4")
    right = torch.nn.functional.linear(x, w4, b)
    wrong = torch.nn.functional.linear(x, w4 * 1.2, b)
    assert judge_quantized(ref, [right], int4, "int4").ok
    bad = judge_quantized(ref, [wrong], int4, "int4")
    assert not bad.ok and "beyond int4" in bad.message
    assert not judge_quantized(ref, [right], allowed_nsr(module, inputs, ref, "int8")).ok  # int8's is too tight

    sx = (float(x.max()) - float(x.min())) / 255
    sw = w.abs().amax(1, keepdim=True) / 127
    w8 = torch.round(w / sw) * sw
    dyn = allowed_nsr(module, inputs, ref, "int8-dynamic")
    right = torch.nn.functional.linear(torch.round(x / sx) * sx, w8, b)
    wrong = torch.nn.functional.linear(torch.round(x / sx) * sx, w8 * 1.2, b)
    assert judge_quantized(ref, [right], dyn, "int8-dynamic").ok
    assert not judge_quantized(ref, [wrong], dyn, "int8-dynamic").ok


LINEAR_OP = """\
    ops:
      - op: aten.linear.default
        inputs:
          input: [[8, 64]]
          weight: {shapes: [[32, 64]], param: true}
          bias: {shapes: [[32]], param: true}
    """


@pytest.mark.slow  # real ONNX Runtime and ExecuTorch: one op x 8 configurations (~40 s CPU)
def test_matrix_runs_on_real_backends_one_row_per_op_and_configuration(tmp_path, capsys):
    spec = _file(tmp_path, LINEAR_OP, "ops.yaml")
    matrix = _file(tmp_path, """\
        flows: [onnxrt-cpu, executorch-xnnpack]
        dtypes: [float32]
        shapes: [static, batch]
        quant: [none, int8]
        """)
    out = tmp_path / "out"
    rc = replay_main(["--spec", str(spec), "--matrix", str(matrix), "--out", str(out), "--repeats", "1", "-q"])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_csv(out / "matrix.csv")
    assert tuple(df.columns) == MATRIX_COLUMNS
    configs = df[df.backend != "torch-cpu"]
    assert len(configs) == 8 and not configs.duplicated(["op", "backend"]).any()
    assert set(zip(configs.flow, configs.shapes, configs.quant)) == {
        (f, s, q) for f in ("onnxrt-cpu", "executorch-xnnpack") for s in ("static", "batch") for q in ("none", "int8")}
    assert (configs.status == "OK").all(), configs[["op", "backend", "status", "error"]].to_string()
    for col in ("max_abs_err", "max_rel_err", "mean_abs_err", "mean_rel_err", "latency_ms", "aot_s", "aot_peak_mb"):
        assert configs[col].notna().all(), col
    et = configs[configs.flow == "executorch-xnnpack"]
    for col in ("delegated_nodes", "delegated_ops", "delegated_pct", "partitioned_ops", "delegate_bytes", "pte_bytes"):
        assert et[col].notna().all(), col
    assert (et.delegated_pct == 100).all() and (et.delegate_bytes > 0).all()
    ort = configs[configs.flow == "onnxrt-cpu"]
    assert ort.opset.notna().all() and (ort.model_bytes > 0).all()
    dyn = configs[configs.shapes == "batch"]
    assert (dyn.dynamic_dims >= 1).all() and dyn.second_size.str.contains("->").all()
    quant = configs[configs.quant == "int8"]
    facts = [json.loads(f) for f in quant.facts]
    assert all(f["quantized"] and f["quantize_nodes"] > 0 for f in facts)  # quantized on both flows
    assert (quant.max_rel_err > configs[configs.quant == "none"].max_rel_err.max()).all()  # int8 really ran
    assert set(FACT_COLUMNS) <= set(df.columns) and (out / "matrix.html").is_file()


def test_dtype_column_reads_a_modules_parameters_when_its_inputs_are_indices(tmp_path):
    from xray.replay.runner import _dtype_of

    spec = _file(tmp_path, """\
        modules:
          - module: nn.Embedding
            init: {num_embeddings: 10, embedding_dim: 4}
            inputs: {input: {shapes: [[2, 3]], dtype: int64, range: [0, 9]}}
            dtypes: [float16]
        """, "e.yaml")
    assert _dtype_of(load_sweep(spec).records()[0]) == "float16"


@pytest.mark.slow  # real ONNX Runtime and ExecuTorch: one op x 3 configurations
def test_matrix_runs_the_dynamic_and_int4_schemes_and_judges_each_by_its_budget(tmp_path, capsys):
    spec = _file(tmp_path, LINEAR_OP, "ops.yaml")
    matrix = _file(tmp_path, """\
        flows: [onnxrt-cpu]
        dtypes: [float32]
        quant: [int8-dynamic, int4]
        """)
    out = tmp_path / "out"
    rc = replay_main(["--spec", str(spec), "--matrix", str(matrix), "-b", "executorch-xnnpack:quant=int8-dynamic",
                      "--out", str(out), "--repeats", "1", "-q"])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_csv(out / "matrix.csv")
    configs = df[df.backend != "torch-cpu"]
    assert set(configs.quant) == {"int8-dynamic", "int4"} and len(configs) == 3
    assert (configs.status == "OK").all(), configs[["backend", "status", "error"]].to_string()
    facts = {b: json.loads(f) for b, f in zip(configs.backend, configs.facts)}
    assert all(f["quantized"] and f["quantize_nodes"] > 0 for f in facts.values())
    assert {f["quant_scheme"] for f in facts.values()} == {"int8-dynamic", "int4"}
    int4 = configs[configs.quant == "int4"].max_rel_err.max()
    assert int4 > configs[configs.quant == "int8-dynamic"].max_rel_err.max()  # 16 levels cost more than 256
