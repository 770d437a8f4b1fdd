"""Declarative sweeps (``xray-replay --spec``): a YAML grid of ATen ops and torch.nn modules runs
through the same workers, statuses, matrix, heatmap and replay dumps as a recorded dump.

Real backends (torch eager baseline, ONNX Runtime), no mocks. Hostile specs are refused with one
line that names the file and the entry, and exit status 2, before anything runs.
"""
from __future__ import annotations

import textwrap

import pandas as pd
import pytest

import xray
from xray.ops.nondeterminism import nondeterministic
from xray.replay.cli import main as replay_main
from xray.replay.runner import ReplayConfig
from xray.replay.sweep import SweepError, load_sweep, replay_sweep

SMALL = """\
ops:
  - op: aten.mm.default
    inputs: {self: [[8, 16]], mat2: [[16, 8]]}
    dtypes: [float32, bfloat16]
  - op: aten.softmax.int
    inputs: {self: [[4, 32]]}
    args: {dim: [-1, 0]}
  - op: aten.rsqrt
    inputs: {self: [[4, 8]]}
    positive: true
    dtypes: [float32, float16]
  - op: aten.embedding.default
    inputs:
      weight: [[50, 8]]
      indices: {shapes: [[2, 5]], dtype: int64, range: [40, 49]}
modules:
  - module: torch.nn.Conv2d
    init: {in_channels: 3, out_channels: 4, kernel_size: [3, 5], padding: 1}
    inputs: [[1, 3, 8, 8]]
    dtypes: [float32, float16]
"""

# Combination labels (the matrix's module column) of SMALL, in order.
SMALL_CASES = [
    ("aten.mm.default", "self=8x16 mat2=16x8 float32"),
    ("aten.mm.default", "self=8x16 mat2=16x8 bfloat16"),
    ("aten.softmax.int", "self=4x32 float32 dim=-1"),
    ("aten.softmax.int", "self=4x32 float32 dim=0"),
    ("aten.rsqrt.default", "self=4x8 float32"),
    ("aten.rsqrt.default", "self=4x8 float16"),
    ("aten.embedding.default", "weight=50x8 indices=2x5 float32"),
    ("Conv2d", "in_channels=3 out_channels=4 kernel_size=3 padding=1 input=1x3x8x8 float32"),
    ("Conv2d", "in_channels=3 out_channels=4 kernel_size=3 padding=1 input=1x3x8x8 float16"),
    ("Conv2d", "in_channels=3 out_channels=4 kernel_size=5 padding=1 input=1x3x8x8 float32"),
    ("Conv2d", "in_channels=3 out_channels=4 kernel_size=5 padding=1 input=1x3x8x8 float16"),
]


def _spec(tmp_path, text: str, name: str = "sweep.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.slow
def test_every_combination_runs_on_onnxrt_with_real_statuses(tmp_path):
    spec = _spec(tmp_path, SMALL)
    cfg = ReplayConfig(backends=["onnxrt-cpu"], out=tmp_path / "out", repeats=1, progress=False, timeout=180)
    sweep, result = replay_sweep(spec, cfg)
    assert [(c.op, c.label) for c in sweep.cases] == SMALL_CASES and not sweep.left_out

    matrix = pd.read_csv(result.out / "matrix.csv", keep_default_na=False)
    assert len(matrix) == 2 * len(SMALL_CASES)
    for backend in ("torch-cpu", "onnxrt-cpu"):
        rows = matrix[matrix.backend == backend]
        assert list(zip(rows.op, rows.module)) == SMALL_CASES
    status = {(r.module, r.backend): r.status for r in matrix.itertuples()}
    assert set(status[k, "torch-cpu"] for _, k in SMALL_CASES) == {"OK"}
    # ONNX Runtime runs every float32 and float16 case within tolerance; bfloat16 cannot be fed
    # to it through numpy (docs/replay.md): a real RUN_FAIL, with the runtime's reason.
    bf16 = "self=8x16 mat2=16x8 bfloat16"
    assert status[bf16, "onnxrt-cpu"] == "RUN_FAIL"
    assert matrix[(matrix.module == bf16) & (matrix.backend == "onnxrt-cpu")].error.iloc[0]
    assert {status[k, "onnxrt-cpu"] for _, k in SMALL_CASES if k != bf16} == {"OK"}, matrix.to_string()

    # The per-backend replay dumps are ordinary trace dumps; inputs were drawn inside the spec's ranges.
    replayed = {r.module: r for r in xray.load_dump(result.dumps["onnxrt-cpu"]).records}
    assert len(replayed) == len(SMALL_CASES) - 1  # the bfloat16 mm produced nothing
    rsqrt_in = replayed["self=4x8 float16"].inputs["self"].stats
    assert 0.1 <= rsqrt_in.min and rsqrt_in.max <= 2.0
    indices = replayed["weight=50x8 indices=2x5 float32"].inputs["indices"]
    assert indices.dtype == "int64" and 40 <= indices.stats.min and indices.stats.max <= 49
    conv = replayed["in_channels=3 out_channels=4 kernel_size=5 padding=1 input=1x3x8x8 float16"]
    assert conv.outputs[0].shape == (1, 4, 6, 6) and conv.outputs[0].dtype == "float16"
    assert "bfloat16" in (result.out / "heatmap.html").read_text()
    assert (result.out / "spec-dump" / "dump.json").exists()


@pytest.mark.slow  # the shipped spec on a real backend; hostile specs and the cap stay fast
def test_shipped_common_spec_expands_and_a_slice_runs(tmp_path, capsys):
    sweep = load_sweep("common")
    assert (sweep.entries, len(sweep.cases), sweep.left_out) == (50, 206, [])
    ops = {c.op for c in sweep.cases}
    for name in ("mm", "addmm", "bmm", "linear", "_softmax", "native_layer_norm", "pow", "mean", "rsqrt", "gelu",
                 "silu", "embedding", "scaled_dot_product_attention", "conv2d", "batch_norm", "max_pool2d",
                 "avg_pool2d", "relu", "add", "mul", "cat", "transpose", "permute", "view"):
        assert f"aten.{name}" in {op.rsplit(".", 1)[0] for op in ops}, name
    assert {"Linear", "Conv2d", "LayerNorm", "RMSNorm", "BatchNorm2d", "Embedding", "MultiheadAttention"} <= ops
    # Schema defaults are recorded as the recorder records them: SDPA's dropout_p=0.0 makes its
    # values comparable (it carries the nondeterministic_seeded tag).
    sdpa = [r for r in sweep.records() if r.op == "aten.scaled_dot_product_attention.default"]
    assert len(sdpa) == 6 and all(r.inputs["dropout_p"] == 0.0 and nondeterministic(r) is None for r in sdpa)

    out = tmp_path / "out"
    rc = replay_main(["--spec", "common", "-b", "onnxrt-cpu", "--op", "RMSNorm", "--op", "aten.silu*",
                      "--module", "*16", "--out", str(out), "--repeats", "1", "-q"])  # float16, bfloat16
    assert rc == 0
    assert "sweep common: 206 combinations from 50 entries" in capsys.readouterr().out
    matrix = pd.read_csv(out / "matrix.csv", keep_default_na=False)
    ort = matrix[matrix.backend == "onnxrt-cpu"]
    got = dict(zip(ort.module, ort.status))
    assert len(got) == 4, got  # 2 entries x 2 dtypes
    assert {s for m, s in got.items() if not m.endswith("bfloat16")} == {"OK"}, got
    assert {s for m, s in got.items() if m.endswith("bfloat16")} == {"RUN_FAIL"}, got


HOSTILE = {
    "unknown op": ("ops: [{op: aten.not_an_op.default, inputs: {self: [[2]]}}]",
                   "entry 1 (aten.not_an_op.default): unknown op"),
    "python attribute as op": ("ops: [{op: aten.__class__, inputs: {self: [[2]]}}]",
                               "entry 1 (aten.__class__): unknown op 'aten.__class__'"),
    "file-touching op": ("ops: [{op: aten.from_file, args: {filename: [/etc/passwd]}}]",
                         "entry 1 (aten.from_file): refused op"),
    "module outside torch.nn": ("modules: [{module: os.system, init: {}, inputs: [[2]]}]",
                                "entry 1 (os.system): module 'os.system' is not a torch.nn layer class"),
    "torch.nn container": ("modules: [{module: torch.nn.Sequential, inputs: [[2]]}]",
                           "is not a torch.nn layer class"),
    "python tag": ("ops: [{op: !!python/object/apply:os.system [touch PWNED], inputs: {self: [[2]]}}]",
                   "not a valid sweep (YAML)"),
    "python name in init": ("modules: [{module: Linear, init: {in_features: !!python/name:os.system ''}, "
                            "inputs: [[2]]}]", "not a valid sweep (YAML)"),
    "non-plain argument": ("ops: [{op: aten.softmax.int, inputs: {self: [[2]]}, args: {dim: [{a: 1}]}}]",
                           "entry 1 (aten.softmax.int): args.dim: expected an integer"),
    "unknown argument": ("ops:\n  - {op: aten.mm.default, inputs: {self: [[2, 2]], mat2: [[2, 2]]}}\n"
                         "  - {op: aten.relu, inputs: {input: [[2]]}}",
                         "entry 2 (aten.relu.default): inputs: unknown key 'input' (allowed: self)"),
    "too many combinations": ("ops: [{op: aten.softmax.int, inputs: {self: [[8, 8]]}, args: {dim: [0, 1, -1, -2]},"
                              " dtypes: [float32, float16, bfloat16]}]", "more than 10 combinations"),
    "shapes that never fit": ("ops: [{op: aten.mm.default, inputs: {self: [[2, 3]], mat2: [[4, 5]]}}]",
                              "none of its 1 combinations runs"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_spec_is_one_line_error_and_exit_2(case, tmp_path, capsys):
    text, expected = HOSTILE[case]
    spec = _spec(tmp_path, text + "\n")
    rc = replay_main(["--spec", str(spec), "-b", "onnxrt-cpu", "--out", str(tmp_path / "out"), "--max-cases", "10",
                      "-q"])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith(f"xray-replay: error: {spec}: ") and "\n" not in err, err
    assert expected in err, err
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "out").exists()


def test_default_cap_on_combinations(tmp_path):
    spec = _spec(tmp_path, "ops: [{op: aten.softmax.int, inputs: {self: [[4, 4, 4]]},"
                           " args: {dim: [-3, -2, -1, 0, 1, 2]}, dtypes: [float32, float16, bfloat16]}]\n")
    assert len(load_sweep(spec).cases) == 18
    big = _spec(tmp_path, "ops: [{op: aten.add.Tensor, inputs: {self: %s, other: [[2]]}, args: {alpha: %s}}]\n"
                % ([[2]] * 200, list(range(20))), "big.yaml")
    with pytest.raises(SweepError, match=r"big.yaml: entry 1 \(aten.add.Tensor\): the spec expands to more than 2000"):
        load_sweep(big)


def test_init_values_cross_input_shapes_and_misfits_are_left_out(tmp_path):
    spec = _spec(tmp_path, """\
        modules:
          - module: nn.Conv2d
            init: {in_channels: [3, 16], out_channels: 8, kernel_size: 3}
            inputs: [[1, 3, 32, 32], [1, 16, 32, 32]]
        """)
    sweep = load_sweep(spec)
    assert [c.label for c in sweep.cases] == ["in_channels=3 out_channels=8 kernel_size=3 input=1x3x32x32 float32",
                                              "in_channels=16 out_channels=8 kernel_size=3 input=1x16x32x32 float32"]
    assert len(sweep.left_out) == 2 and all("entry 1 (torch.nn.Conv2d)" in x for x in sweep.left_out)
    rec = sweep.records()[1]
    assert rec.kind == "module" and rec.op == "Conv2d" and rec.inputs["init.in_channels"] == 16
    assert set(rec.params) == {"weight", "bias"} and rec.params["weight"].shape == (8, 16, 3, 3)
