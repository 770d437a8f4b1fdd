"""Dynamic shapes (``dynamic=batch|seq``): one exported program run at two sizes, on ONNX Runtime
and ExecuTorch XNNPACK, for single ops (xray-replay) and whole transformers models (xray drift)."""
from __future__ import annotations

import pytest
import torch

from xray.backends.registry import UnknownBackendError, parse_spec
from xray.backends.shapes import dynamic_shapes, second_inputs, tile


def test_second_size_doubles_each_free_symbol_and_follows_expressions():
    a, b = torch.arange(6).reshape(2, 3), torch.arange(4).reshape(2, 2)
    facts = {"dynamic_inputs": [["s0", 3], ["s0", 2]], "dynamic_ranges": {"s0": [2, 8]}, "dynamic_dims": 2}
    second, what = second_inputs((a, b), facts)
    assert what == "s0: 2 -> 4" and second[0].shape == (4, 3) and second[1].shape == (4, 2)
    assert torch.equal(second[0], torch.cat([a, a])), "tiled: token ids and masks stay valid"
    expr = {"dynamic_inputs": [["s0", "2*s0"]], "dynamic_ranges": {"s0": [2, 3]}, "dynamic_dims": 2}
    second, what = second_inputs((torch.zeros(2, 4),), expr)
    assert what == "s0: 2 -> 3" and second[0].shape == (3, 6)  # bounded by the range; the expression follows


def test_no_second_size_says_why():
    assert second_inputs((torch.zeros(1, 4),), {"dynamic_inputs": [[1, 4]], "dynamic_dims": 0})[1].startswith(
        "no input dimension stayed dynamic")
    assert tile(torch.arange(3), [5]).tolist() == [0, 1, 2, 0, 1]


def test_dims_marked_bounded_and_varargs_wrapped():
    class Varargs(torch.nn.Module):
        def forward(self, *tensors):
            return tensors

    spec = dynamic_shapes(Varargs(), (torch.zeros(2, 8), torch.zeros(3), 1.0), "seq")
    assert len(spec) == 1 and len(spec[0]) == 3 and spec[0][1] is None and spec[0][2] is None
    assert str(spec[0][0][1]) == str(torch.export.Dim.AUTO(max=32))
    assert dynamic_shapes(torch.nn.Linear(2, 2), (torch.zeros(2, 2),), None) is None


def test_dynamic_option_is_checked_per_backend():
    assert parse_spec("onnxrt-cpu:dynamic=seq")[1] == {"dynamic": "seq"}
    assert parse_spec("executorch-xnnpack:dynamic=batch,quant=int8")[1] == {"dynamic": "batch", "quant": "int8"}
    with pytest.raises(UnknownBackendError, match="dynamic='time' is not supported; dynamic takes batch, seq"):
        parse_spec("onnxrt-cpu:dynamic=time")
    with pytest.raises(UnknownBackendError, match="takes no option 'dynamic'"):
        parse_spec("torch-cpu:dynamic=batch")


@pytest.mark.slow  # a transformers Llama exported, lowered and run on ONNX Runtime and XNNPACK (~30 s CPU)
@pytest.mark.parametrize("preset", ["onnxrt-cpu:dynamic=seq", "executorch-xnnpack:dynamic=seq"])
def test_llama_with_dynamic_sequence_runs_at_two_sizes(preset):
    from xray.backends.registry import create
    from xray.backends.shapes import two_sizes
    from xray.drift.examples import tiny_llama

    model, args = tiny_llama(layers=1, hidden=32, seq=8)
    found = two_sizes(create(preset), model, args, {})
    assert found["sizes"] == ["2x8", "2x16"] and found["dynamic_dims"] == 1, found
    # fp32 kernels at both sizes: the outputs stay at rounding level of their peak (measured: ~1e-7)
    assert all(e is not None and e < 1e-5 for e in found["output_err"]), found


@pytest.mark.slow  # xray drift on a two-layer MLP with ONNX Runtime (a few seconds)
def test_drift_reports_the_dynamic_run_beside_the_static_one(tmp_path):
    import xray

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    result = xray.drift(model, (torch.randn(3, 8),), ["onnxrt-cpu:dynamic=batch"], tmp_path)
    b = result.backends[0]
    assert b.status == "OK" and b.facts["dynamic"]["status"] == "OK", b.facts
    assert b.facts["dynamic"]["sizes"] == ["3x8", "6x8"]
    assert any(n.startswith("dynamic=batch: one program (1 symbolic input dims) ran at 3x8 and 6x8") for n in b.notes)
