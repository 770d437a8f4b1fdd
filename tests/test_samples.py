"""Every recorded tensor keeps a sample of its elements (xray/dump/samples.py, docs/format.md
"Samples"): drawn at positions that depend on the shape alone, recorded on every path, carried by
the index and the JSON form, refused when corrupt, and never changing the model's numbers."""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch

import xray
from xray.dump.errors import DumpFormatError
from xray.dump.model import TensorMeta
from xray.dump.samples import SAMPLE_SIZE, positions, take
from xray.dump.stats import sample_bytes, tensor_stats
from xray.record import rows as rows_mod

# (XRAY_ROW_PATH, XRAY_NATIVE_ROWS, XRAY_DEFERRED_STATS)
PATHS = {"record": ("0", "1", "0"), "python rows": ("1", "0", "0"), "native rows": ("1", "1", "0"),
         "deferred": ("1", "1", "1"), "deferred record": ("0", "1", "1")}


def test_positions_depend_on_the_shape_alone():
    # hard-coded: a change of the generator (seed, mixing, draw order) is a format change
    assert positions((4, 6, 8)) == (134, 76, 55, 93, 97, 67, 160, 181, 184, 134, 123, 31, 50, 138, 58, 14, 145, 8,
                                    151, 68, 181, 21, 100, 120, 73, 115, 180, 47, 42, 187, 14, 17)
    assert positions((3, 4)) == tuple(range(12))  # small tensors are sampled whole
    assert positions((6, 4, 8)) != positions((4, 6, 8))  # the shape, not only numel
    assert len(set(positions((1000, 1000)))) == SAMPLE_SIZE  # an axis of >= 32 gives distinct draws


@pytest.mark.parametrize("shapes", [((2, 64, 128), (2, 64, 1)), ((2, 64, 128), (128,)), ((4, 8, 40, 40), (4, 1, 40, 40)),
                                    ((4, 8, 40, 40), (1, 1, 1, 40)), ((300, 7), (300, 1))])
def test_a_broadcast_inputs_draw_is_the_element_the_outputs_draw_reads(shapes):
    out_shape, in_shape = shapes
    x = torch.randn(in_shape, dtype=torch.float64)
    out = x.expand(out_shape)
    assert np.array_equal(take(out), take(x))  # draw j of the input is what draw j of the output reads
    # and the positions are spread over the axes, not drawn along a diagonal
    rows, cols = np.unravel_index(np.asarray(positions((1000, 1000))), (1000, 1000))
    assert abs(np.corrcoef(rows, cols)[0, 1]) < 0.5


def test_samples_drawn_otherwise_are_not_read(tmp_path):
    with xray.dump(dump_dir=tmp_path / "d", X_DEBUG=0x102, X_DEDUP=False):
        torch.randn(64, 64) * 2
    folder = next((tmp_path / "d").iterdir())
    assert any(m.sample for r in xray.load_dump(folder).records for _, m in r.output_tensors())
    head = json.loads((folder / "dump.json").read_text())
    del head["sample_positions"]  # a dump of an xray that drew its positions another way
    (folder / "dump.json").write_text(json.dumps(head))
    assert not any(m.sample for r in xray.load_dump(folder).records for _, m in r.output_tensors())


def test_every_layout_samples_the_same_elements():
    x = torch.randn(2, 3, 5, 7)
    expected = x.reshape(-1)[list(positions(tuple(x.shape)))].double().numpy()
    channels_last = x.to(memory_format=torch.channels_last)
    transposed = x.transpose(1, 3).contiguous().transpose(1, 3)
    assert not channels_last.is_contiguous() and not transposed.is_contiguous()
    for t in (x, channels_last, transposed):
        assert np.array_equal(take(t), expected)
        assert np.array_equal(np.frombuffer(sample_bytes(t)), expected)  # the C gather where built
        assert np.array_equal(np.frombuffer(sample_bytes(t, native=False)), expected)
    assert tensor_stats(x.to(torch.bfloat16)).sample == tuple(x.to(torch.bfloat16).reshape(-1)[
        list(positions(tuple(x.shape)))].double().tolist())


def _scenario():
    torch.manual_seed(0)
    x = torch.randn(6, 8)
    y = (x * 2).t()  # a view: its statistics are handed on, its sample is its own
    z = y.reshape(48) + 1
    w = torch.where(z > 1, z, torch.zeros_like(z)).to(torch.bfloat16)
    m = torch.zeros(3, device="meta") + 1  # unreadable: no sample
    return x, y, z, w, m


@pytest.mark.parametrize("path", PATHS)
def test_every_path_records_each_tensors_own_sample(path, tmp_path, monkeypatch):
    row_path, native, deferred = PATHS[path]
    monkeypatch.setenv("XRAY_ROW_PATH", row_path)
    monkeypatch.setenv("XRAY_NATIVE_ROWS", native)
    monkeypatch.setenv("XRAY_DEFERRED_STATS", deferred)
    with xray.dump(dump_dir=tmp_path, X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0) as session:
        _scenario()
    assert session.recorder.failed is None
    if path == "native rows" and rows_mod._fastpath is not None:
        assert session.recorder.native is not None
    x, y, z, w, _ = _scenario()
    dump = xray.load_dump(tmp_path)
    outs = {}
    for r in dump.records:  # each op's first call
        outs.setdefault(r.op, [m for _, m in r.output_tensors()][0])
    for op, t in (("aten.randn.default", x), ("aten.t.default", y), ("aten.add.Tensor", z),
                  ("aten._to_copy.default", w)):
        meta = outs[op]
        want = t.reshape(-1)[list(positions(tuple(t.shape)))].double().tolist()
        assert meta.sample == tuple(want), op
    meta_tensor = [m for r in dump.records for _, m in r.output_tensors() if m.device == "meta"]
    assert meta_tensor and all(m.sample is None for m in meta_tensor)
    assert dump.columns.sample.shape == (len(dump.columns.tensors), SAMPLE_SIZE)
    assert dump.columns.sample_n.dtype == np.uint8


def test_no_statistics_no_sample(tmp_path):
    with xray.dump(dump_dir=tmp_path, X_DEBUG=0x100, X_DEDUP=False):
        torch.ones(4) * 3
    dump = xray.load_dump(tmp_path)
    assert dump.columns.sample is None and dump.columns.sample_n is None
    assert all(m.sample is None for r in dump.records for _, m in r.output_tensors())


def test_samples_round_trip_through_json():
    st = tensor_stats(torch.tensor([1.0, float("nan"), float("inf"), -2.0]))
    meta = TensorMeta((4,), "float32", stats=st)
    text = json.dumps(meta.to_json())
    assert '"sample": [1.0, "nan", "inf", -2.0]' in text
    back = TensorMeta.from_json(json.loads(text))
    assert np.array_equal(np.array(back.sample), np.array(meta.sample), equal_nan=True)
    assert TensorMeta.from_json({"t": "tensor", "shape": [2], "dtype": "float32"}).sample is None
    for bad in ([1.0, 2.0, 3.0], ["x"], [True], "1.0"):
        with pytest.raises(ValueError):
            TensorMeta.from_json({**meta.to_json(), "shape": [2], "sample": bad})


def test_a_dump_without_samples_opens_as_before():
    dump = xray.load_dump("dumps/llama-fp32")
    assert dump.columns.sample is None and dump.columns.sample_n is None
    assert all(m.sample is None for r in list(dump.records)[:20] for _, m in r.input_tensors())


def _index(folder):
    return next(folder.glob("index-*.h5"))


@pytest.mark.parametrize("damage", ["dtype", "length", "missing", "size", "too many"])
def test_a_corrupt_sample_column_is_refused(damage, tmp_path):
    with xray.dump(dump_dir=tmp_path / "d", X_DEBUG=0x102, X_DEDUP=False):
        torch.arange(40, dtype=torch.float32).reshape(5, 8).exp()
    folder = next((tmp_path / "d").iterdir())
    with h5py.File(_index(folder), "a") as f:
        n = f["sample_n"][()]
        if damage == "dtype":
            del f["sample_n"]
            f["sample_n"] = n.astype(np.int64)
        elif damage == "length":
            del f["sample"]
            f["sample"] = np.zeros(3)
        elif damage == "missing":
            del f["sample"]
        elif damage == "size":
            f.attrs["sample_size"] = 16
        else:  # a row claims more values than its tensor has
            n[0] = SAMPLE_SIZE + 1
            f["sample_n"][...] = n
    if damage == "too many":  # one record's values: that record is left out, the rest opens
        with pytest.warns(UserWarning):
            dump = xray.load_dump(folder)
        assert dump.columns.refused and "sample" in dump.columns.refused[0].reason
        return
    with pytest.raises(DumpFormatError, match="sample"):
        xray.load_dump(folder)


def test_recording_never_changes_the_numbers(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)

    def step():
        model.zero_grad(set_to_none=True)
        out = model(x)
        out.pow(2).mean().backward()
        return out.detach().clone(), [p.grad.clone() for p in model.parameters()]

    plain_out, plain_grads = step()
    with xray.dump(dump_dir=tmp_path, X_DEBUG=0x10a, X_DEDUP=False):
        out, grads = step()
    assert torch.equal(out, plain_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    dump = xray.load_dump(tmp_path)
    assert any(m.sample for r in dump.records for _, m in r.output_tensors())


@pytest.mark.skipif(rows_mod._fastpath is None, reason="the C row path is not built")
def test_the_c_path_gathers_its_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("XRAY_NATIVE_ROWS", "1")
    with xray.dump(dump_dir=tmp_path, X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0) as session:
        torch.randn(16, 16).exp()
    assert session.recorder.native is not None and session.recorder.native.reductions > 0
    dump = xray.load_dump(tmp_path)
    assert all(m.sample and len(m.sample) == SAMPLE_SIZE for r in dump.records for _, m in r.output_tensors())
