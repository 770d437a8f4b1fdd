"""xray drift on three real models built from transformers configs (random weights): a decoder LLM
(Llama), a vision model (ViT) and an audio encoder (Whisper), each run whole on ONNX Runtime,
ExecuTorch XNNPACK and portable, and torch.compile; and a wrong weight shipped in an ExecuTorch
program, named by the driver at its consumer."""
from __future__ import annotations

import pytest

import xray
from xray.compare import compare_dumps
from xray.drift import examples

pytestmark = pytest.mark.slow  # a real model end to end, a deployment backend or the wheel (.ci/run)

pytest.importorskip("executorch.devtools")
pytest.importorskip("onnxruntime")

BACKENDS = ["onnxrt-cpu", "executorch-xnnpack", "executorch-portable", "torch-compile"]
MODELS = {"llama": examples.tiny_llama_1layer, "vit": examples.tiny_vit, "whisper": examples.tiny_whisper_encoder}

# Share of the eager records (with a tensor output) each backend's values map onto: the least it
# may report. Every backend runs every model here: no stage failure is expected, and one fails the
# test with its error. Measured (mapped / records): llama 156, vit 87, whisper 87 records.
#   onnxrt-cpu: 100% on all three; the bar is 90%.
#   executorch-portable: 83% / 72% / 71%. Every record it leaves out is an aten.view, which
#     ExecuTorch plans as a view of its input's memory (memory.view): no instruction runs, so ETDump
#     logs nothing (asserted exactly below). The bound is the views' share, rounded down.
#   executorch-xnnpack: 48% / 41% / 32%. The linear layers, the MLP and most of attention run inside
#     delegate calls (9 / 6 / 7 of them), which log their inputs and outputs only. The bound leaves
#     a fifth of margin under the lowest (Whisper's) for a partitioner that takes a little more.
#   torch-compile: the program's outputs only (inductor fuses everything), 1 record.
MIN_SHARE = {"onnxrt-cpu": 90.0, "executorch-portable": 65.0, "executorch-xnnpack": 25.0}


@pytest.fixture(scope="module", params=sorted(MODELS))
def run(request, tmp_path_factory):
    """One drift run per model on all four backends (one export each)."""
    model, args = MODELS[request.param]()
    return xray.drift(model, args, BACKENDS, tmp_path_factory.mktemp(f"drift-{request.param}"))


def _by(result, name):
    return next(b for b in result.backends if b.backend == name)


def test_every_backend_runs_every_model_and_writes_a_dump_compare_reads(run):
    assert [b.backend for b in run.backends] == BACKENDS
    for b in run.backends:
        assert b.status == "OK", (b.backend, b.status, b.error)
        assert b.eager_records == run.eager_records and b.mapped > 0
        result = compare_dumps(run.eager_dump, b.dump)  # what `xray-compare eager dump` runs
        assert result.summary.matched == b.eager_records
        assert all(r.bench_seq == r.target_seq for r in result.rows)
        assert len({r.bench_seq for r in result.rows if r.status != "skip"}) == b.mapped
        assert b.output_err is not None and b.output_err < 1e-5, (b.backend, b.output_err)


def test_mapping_shares(run):
    for name, least in MIN_SHARE.items():
        b = _by(run, name)
        assert b.mapped_pct >= least, (name, b.mapped, b.eager_records, b.notes)
    assert _by(run, "onnxrt-cpu").granularity == "every node"
    assert _by(run, "executorch-portable").granularity == "every node"
    xnn = _by(run, "executorch-xnnpack")
    assert xnn.granularity == "delegate boundaries" and xnn.facts["delegated_nodes"] > 0
    assert xnn.mapped < _by(run, "executorch-portable").mapped
    tc = _by(run, "torch-compile")
    assert tc.granularity == "outputs only" and tc.mapped == 1


def test_portable_leaves_out_views_only(run):
    portable = _by(run, "executorch-portable")
    skipped = [r for r in compare_dumps(run.eager_dump, portable.dump).rows if r.status == "skip"]
    assert skipped and {r.bench_op for r in skipped} == {"aten.view.default"}
    assert any("views not captured" in n for n in portable.notes)


def test_noise_only_runs_name_no_bug(run):
    """fp32 everywhere: each backend differs from the program run in eager by summation order only,
    and compare's rules (fp32 tolerance, local error against the op's float64 floor) call no row a bug."""
    for b in run.backends:
        assert b.first is None or b.first["cause"] == "precision loss", (b.backend, b.first)


WEIGHT = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def et_fault(tmp_path_factory):
    """The Llama with one wrong element in down_proj's weight, injected into the ExecuTorch edge
    program before to_executorch: the .pte ships it, the reference does not."""
    model, args = examples.tiny_llama_1layer()
    return xray.drift(model, args, ["executorch-portable"], tmp_path_factory.mktemp("et-fault"),
                      edits={"executorch-portable": examples.executorch_weight_fault(WEIGHT)})


def test_a_wrong_executorch_weight_is_named_at_its_consumer(et_fault):
    b = et_fault.backends[0]
    assert b.status == "OK", b.error
    consumers = [r for r in xray.load_dump(et_fault.eager_dump).records
                 if any(m.source == f"param:{WEIGHT}" for _, m in r.input_tensors())]
    assert len(consumers) == 1
    fd = b.first
    assert fd["bench_seq"] == consumers[0].seq and fd["origin"] == "born" and fd["cause"] == "parameter", fd
    assert b.first_layer == "model.layers.0.mlp.down_proj" and b.first_node.startswith("permute")
    layer = next(lr for lr in b.layers if lr.layer == "model.layers.0.mlp.down_proj")
    assert layer.born == 1 and layer.accumulated_err > 0.01
