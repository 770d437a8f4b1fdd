"""The validator's limits against legitimate extremes (issue 30): every dump a real model can make
opens, and a record the validator does refuse never takes the rest of the dump with it.

Each limit of xray/dump/model.py and skeleton.py gets a legitimate value at or past the old
limit: strides (huge, 0), storage offsets, 0-size and expanded dims, 6-D and 64-D tensors, names
at the limit. The real case that found the bug is a dump recorded on an H100
(tests/fixtures/corrupt_index_fp32_h1024_dedup, /work/shared/fixtures/README.md): a Llama's
repeat_kv gives a stride list whose product is past 2**48, which the old check read as a shape.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

import xray
from xray.cli import main as xray_main
from xray.dump import RefusedRecordsWarning
from xray.dump.column_builder import columns_of
from xray.dump.model import MAX_DIMS, MAX_NAME, Record, TensorMeta

FIXTURE = Path(__file__).parent / "fixtures" / "corrupt_index_fp32_h1024_dedup"


def _record(tmp_path: Path, fn, **config) -> xray.dump:
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEDUP=False, **config) as d:
        fn()
    return d


def _open(folder: Path):
    """load_dump, failing the test on any refusal warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RefusedRecordsWarning)
        dump = xray.load_dump(folder)
    assert dump.refused == []
    return dump


def _outputs(dump, op: str) -> list[TensorMeta]:
    return [m for r in dump.records if r.op == op for _, m in r.output_tensors()]


def test_h100_llama_dump_with_repeat_kv_strides_opens(capsys):
    dump = _open(FIXTURE)
    assert len(dump.records) == 97 and dump.summary["op_calls"] == 6048
    strides = [m.stride for r in dump.records for _, m in (*r.input_tensors(), *r.output_tensors()) if m.stride]
    assert max(math.prod(s) for s in strides) > 2**48  # the stride that was read as a shape
    assert any(0 in s for s in strides)  # repeat_kv's expand
    assert xray_main(["info", str(FIXTURE)]) == 0
    assert "refused" not in capsys.readouterr().out


def test_softmax_over_4x16x512x512_opens(tmp_path):
    """Eager attention's scores at 4x512 tokens: contiguous strides multiply to 2**49."""
    x = torch.randn(4, 16, 512, 512)
    dump = _open(_record(tmp_path, lambda: x.softmax(-1), X_DUMP_NUM=0).folder)
    (out,) = _outputs(dump, "aten._softmax.default")
    assert out.stride == (4194304, 262144, 512, 1) and math.prod(out.stride) == 2**49
    assert out.stats.numel == x.numel() and 0 < out.stats.max <= 1


def test_expand_past_2_48_elements_opens_with_its_statistics(tmp_path):
    """Stride 0 and a shape of 2**52 elements: statistics of the one stored value, counts of all
    2**52; and it is never copied to be saved (statistics only, with a note)."""
    one = torch.full((1,), 3.0)
    dump = _open(_record(tmp_path, lambda: one.expand(2**20, 2**20, 2**12)[:1, :1, :3] + 1, X_DUMP_NUM=8).folder)
    (big,) = _outputs(dump, "aten.expand.default")
    assert big.shape == (2**20, 2**20, 2**12) and big.stride == (0, 0, 0)
    assert big.stats.numel == 2**52 and big.stats.min == big.stats.max == big.stats.mean == 3.0
    assert big.data is None and big.note.startswith("not saved")
    (added,) = _outputs(dump, "aten.add.Tensor")
    assert added.stats.mean == 4.0 and added.data is not None


def test_nan_counts_of_an_expand_count_every_element(tmp_path):
    row = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    dump = _open(_record(tmp_path, lambda: row.expand(3, 2**25, 4)[0, :2] * 1, X_DUMP_NUM=0).folder)
    (big,) = _outputs(dump, "aten.expand.default")
    assert (big.stats.nan, big.stats.posinf, big.stats.numel) == (3 * 2**25, 3 * 2**25, 3 * 2**27)
    assert (big.stats.min, big.stats.max, big.stats.mean) == (1.0, 2.0, 1.5)


def test_storage_offsets_zero_size_and_6d_views_open(tmp_path):
    flat = torch.arange(2**20, dtype=torch.float32)
    six = torch.randn(2, 3, 4, 5, 6, 7)

    def run():
        flat[2**20 - 3:] * 2  # a view at offset 2**20 - 3
        torch.zeros(0, 2**40) + 1  # 0-size, with strides of 2**40
        six.permute(5, 4, 3, 2, 1, 0) * 2  # 6-D, every stride out of order
        torch.zeros([1] * MAX_DIMS) * 2  # as many dims as the format allows

    dump = _open(_record(tmp_path, run, X_DUMP_NUM=0).folder)
    assert any(m.storage_offset == 2**20 - 3 for r in dump.records for _, m in r.input_tensors())
    assert any(m.shape == (0, 2**40) and m.stride == (2**40, 1) for m in _outputs(dump, "aten.add.Tensor"))
    muls = _outputs(dump, "aten.mul.Tensor")
    assert any(m.shape == (7, 6, 5, 4, 3, 2) and m.stride == (1, 7, 42, 210, 840, 2520) for m in muls)
    assert any(len(m.shape) == MAX_DIMS for m in muls)


def test_int64_extremes_of_strides_offsets_and_shapes_validate():
    """Values no CPU tensor reaches, but meta and expanded tensors can: every int64 a stride,
    offset or size may hold, and an expand's numel up to torch's own int64 limit."""
    metas = [
        TensorMeta(shape=(2**62,), dtype="float32", stride=(2**63 - 1,), storage_offset=2**63 - 1),
        TensorMeta(shape=(2**31, 2**31, 1), dtype="bfloat16", stride=(0, 0, 0)),  # numel 2**62
        TensorMeta(shape=(0, 2**62), dtype="float16", stride=(2**62, 1)),
    ]
    rec = Record(seq=0, kind="op", op="aten.mul.Tensor", inputs={"self": metas[0], "other": metas[2]},
                 outputs=[metas[1]])
    columns = columns_of([rec]).validate()
    assert columns.refused == []
    back = columns.record(0)
    assert back.inputs["self"].stride == (2**63 - 1,) and back.inputs["self"].storage_offset == 2**63 - 1
    assert back.outputs[0].shape == (2**31, 2**31, 1)


class _Deep(torch.nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.add_module(name, torch.nn.Linear(4, 4))
        self.name = name

    def forward(self, x):
        return getattr(self, self.name)(x)


def test_module_path_at_the_name_limit_opens(tmp_path):
    model = _Deep("m" * MAX_NAME)
    dump = _open(_record(tmp_path, lambda: model(torch.ones(2, 4)), X_DUMP_NUM=0).folder)
    assert any(r.module == "m" * MAX_NAME for r in dump.records)


def test_a_refused_record_leaves_the_rest_and_info_lists_it(tmp_path, capsys, monkeypatch):
    """A module path past the name limit (as a writer that did not cut it wrote it; today's cuts
    it: test_hostile_values): that op's records are refused, each named with why; the records
    before and after it open, and `xray info` lists the refusals."""
    import xray.record.modules

    monkeypatch.setattr(xray.record.modules, "fit_name", lambda name: name)
    model = _Deep("m" * (MAX_NAME + 1))
    x = torch.ones(2, 4)
    folder = _record(tmp_path, lambda: torch.tanh(model(x.exp())), X_DUMP_NUM=0).folder
    with pytest.warns(RefusedRecordsWarning, match="the rest opened"):
        dump = xray.load_dump(folder)
    ops = [r.op for r in dump.records]
    assert ops[0] == "aten.exp.default" and ops[-1] == "aten.tanh.default"
    assert dump.refused and all("characters long (limit 1024)" in x.reason for x in dump.refused)
    assert {x.op for x in dump.refused} == {"aten.t.default", "aten.addmm.default"}
    assert len(dump.records) + len(dump.refused) == dump.summary["records"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RefusedRecordsWarning)
        assert xray_main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"refused records: {len(dump.refused)}" in out and "aten.addmm.default" in out
    assert max(map(len, out.splitlines())) < 600  # the 1025-character path is not echoed whole
