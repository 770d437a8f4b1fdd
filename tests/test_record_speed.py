"""What keeps recording cheap (docs/performance.md): each value reduced once, strided tensors on
the native one-pass path, and the same numbers as the torch path."""
from __future__ import annotations

import importlib

import pytest
import torch

import xray

stats_mod = importlib.import_module("xray.dump.stats")
tracer_mod = importlib.import_module("xray.record.tracer")

_BASE = torch.randn(2, 4, 16, 64, generator=torch.Generator().manual_seed(0))
STRIDED = {
    "transpose": _BASE.transpose(1, 2),
    "half_width_slice": _BASE[..., :32],
    "narrow_slice": _BASE[..., 1:4],
    "permute": _BASE.permute(3, 1, 0, 2),
    "step_slice_outer": _BASE[:, :, ::2],
    "broadcast": torch.randn(5, 1).expand(5, 7),
    "broadcast_t": torch.randn(3)[None].expand(4, 3).t(),
    "bf16_slice": _BASE.bfloat16()[..., 8:40],
    "int_t": torch.arange(24, dtype=torch.int32).reshape(4, 6).t(),
    "no_unit_stride": _BASE[..., ::2],  # no contiguous run: the torch path
}


@pytest.mark.skipif(not stats_mod.NATIVE, reason="the C extension is not built")
@pytest.mark.parametrize("name", sorted(STRIDED))
def test_native_strided_statistics_equal_the_torch_path(name):
    t = STRIDED[name]
    native, torch_path = stats_mod.tensor_stats(t), stats_mod.tensor_stats(t, native=False)
    assert (native.min, native.max, native.numel) == (torch_path.min, torch_path.max, torch_path.numel)
    assert native.mean == pytest.approx(torch_path.mean, rel=1e-5, abs=1e-6)
    assert native.std == pytest.approx(torch_path.std, rel=1e-5)


def test_native_strided_statistics_see_nan_and_inf():
    t = _BASE.clone()
    t[0, 0, 0, 3] = float("nan")
    t[1, 2, 3, 4] = float("inf")
    got = stats_mod.tensor_stats(t[..., :32])
    assert (got.nan, got.posinf) == (1, 1) and got.max == float(_BASE[..., :32].amax())


@pytest.mark.parametrize("row_path,native", [("0", "0"), ("1", "0"), ("1", "1")])
def test_each_weight_is_reduced_once_per_use(row_path, native, tmp_path, monkeypatch):
    """t(weight) holds the weight's values and its output gets the weight's version counter only
    after the call: neither may cost a second reduction (it cost two, then a third in mm), on
    the Record path (Stats), the row path (cells) or its C path (which counts its own)."""
    computed = []

    def counting(real):
        def count(t, **kw):
            computed.append(tuple(t.shape))
            return real(t, **kw)
        return count

    monkeypatch.setattr(tracer_mod, "tensor_stats", counting(tracer_mod.tensor_stats))
    monkeypatch.setattr(tracer_mod, "stats_row", counting(tracer_mod.stats_row))
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "0")
    monkeypatch.setenv("XRAY_ROW_PATH", row_path)
    monkeypatch.setenv("XRAY_NATIVE_ROWS", native)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEDUP=False, X_DUMP_NUM=0) as session:
        lin(x)
    assert (session.recorder.rows is not None) == (row_path == "1")
    c_path = session.recorder.native
    if c_path is None:
        assert computed.count((4, 8)) == 1 and (8, 4) not in computed, computed
    # x, the weight, the bias and the result: each once
    assert len(computed) + (0 if c_path is None else c_path.reductions) == 4, computed


def test_positional_construction_matches_the_model_fields():
    """The hot path builds TensorMeta and Stats positionally (half the cost of keywords): a
    reordered field in xray/dump/model.py must fail here, not silently swap values."""
    import dataclasses

    from xray.dump.model import Stats, TensorMeta
    from xray.record.encode import tensor_meta

    assert [f.name for f in dataclasses.fields(TensorMeta)][:9] == [
        "shape", "dtype", "stride", "storage_offset", "device", "requires_grad", "stats", "data", "source"]
    assert [f.name for f in dataclasses.fields(Stats)][:8] == [
        "min", "max", "mean", "std", "nan", "posinf", "neginf", "numel"]
    t = torch.randn(3, 4).t()
    s = stats_mod.tensor_stats(t)
    assert tensor_meta(t, s, True, "op:1:0") == TensorMeta(
        shape=(4, 3), dtype="float32", stride=(1, 4), storage_offset=0, device="cpu", requires_grad=False,
        stats=s, source="op:1:0")
    assert tensor_meta(t, None, False) == TensorMeta(shape=(4, 3), dtype="float32")
