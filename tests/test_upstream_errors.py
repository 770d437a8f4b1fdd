"""What an input carries is at least what the records that held its values measured on them
(xray/compare/upstream_errors.py): a transposed key samples other elements than the norm that
made it, and a rotary embedding's multiply of it is no origin for the difference that norm made."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import sweep_noise_run

from xray.compare.op_classes import keeps_every_element
from xray.compare.upstream_errors import upstream_errors
from xray.dump.model import Stats, TensorMeta


def _meta(source: str | None, lo: float = -2.0, hi: float = 2.0) -> TensorMeta:
    return TensorMeta(shape=(4, 4), dtype="float32", source=source, stats=Stats(min=lo, max=hi, mean=0.0, std=1.0))


def _entry(pos: int, op: str, inputs: list, out: TensorMeta) -> SimpleNamespace:
    return SimpleNamespace(pos=pos, op=op, inputs=inputs, outputs=[("out0", out)])


def _walker(entries: dict, errors: dict):
    rows = {e.pos: [SimpleNamespace(err=errors.get(seq))] for seq, e in entries.items() if seq in errors}
    return upstream_errors(entries, rows, lambda r: r.err)


def test_a_move_carries_what_the_op_before_it_measured():
    norm_out = _meta("op:1:0")
    entries = {1: _entry(0, "aten.mul.Tensor", [("self", _meta("op:0:0"))], norm_out),
               2: _entry(1, "aten.transpose.int", [("self", norm_out)], _meta("op:1:0")),
               3: _entry(2, "aten.alias.default", [("self", _meta("op:2:0"))], _meta("op:2:0"))}
    error = _walker(entries, {1: 0.3, 2: 0.006, 3: 0.006})
    assert error(_meta("op:3:0")) == pytest.approx(0.3)  # through the alias and the transpose to the norm
    assert error(_meta("op:1:0")) == pytest.approx(0.3)
    assert error(_meta(None)) == 0.0


def test_a_part_does_not_carry_what_the_whole_measured():
    whole = _meta("op:1:0")
    entries = {1: _entry(0, "aten.mul.Tensor", [], whole),
               2: _entry(1, "aten.slice.Tensor", [("self", whole)], _meta("op:1:0"))}
    error = _walker(entries, {1: 0.3, 2: 0.01})
    assert error(_meta("op:2:0")) == pytest.approx(0.01)  # a slice need not hold the elements that differed
    assert not keeps_every_element("aten.slice.Tensor") and not keeps_every_element("aten.select.int")
    assert keeps_every_element("aten.transpose.int") and keeps_every_element("aten._to_copy.default")
    assert not keeps_every_element("aten.mul.Tensor")


def test_a_concatenated_part_counts_at_its_share_of_the_range():
    small = _meta("op:1:0", -0.5, 0.5)  # its error is relative to 0.5, the output's range is 2
    entries = {1: _entry(0, "aten.mul.Tensor", [], small),
               2: _entry(1, "aten.cat.default", [("tensors.0", small)], _meta("op:1:0"))}
    error = _walker(entries, {1: 0.2})
    assert error(_meta("op:2:0")) == pytest.approx(0.05)


@pytest.mark.slow
def test_a_rotary_multiply_of_a_key_whose_norm_rounded_rows_off_is_no_origin(tmp_path):
    """transformers' MiniMax-M3-VL text model (built tiny, as the architecture sweep builds it),
    fp32 against bf16 autocast, a training step in training mode, the recorder's defaults. Its
    key norm rounds a few rows 15-35 % off under bf16 (its sample shows it); the key, transposed
    and cast, samples other elements (0.6 %), and the rotary embedding's ``k * cos`` moves its
    minimum 4 %, which read "born: statistics error 0.0403 beyond 3x what its inputs carry". It
    has no bug: no row may fail."""
    o = sweep_noise_run("minimax_m3_vl_text", tmp_path, noise="bf16", backward=True, train_mode=True)
    assert o.summary["failed"] == 0, o.summary["verdict"]
