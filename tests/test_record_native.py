"""The recorder's common call in C (xray/record/_fastpath.c): that it is the path a model's
forward takes, that it keeps no tensor alive, and that a failure inside it stops the recording
and never the user's code. That it writes the same index as the Python paths is
tests/test_record_rows.py's job."""
from __future__ import annotations

import sys
import weakref

import pytest
import torch

import xray
from xray.record import rows as rows_mod
from xray.record import tracer as tracer_mod

pytestmark = pytest.mark.skipif(rows_mod._fastpath is None, reason="the C row path is not built")


def count_python_calls(monkeypatch) -> dict[str, int]:
    """How many calls the Recorder's Python code took whole (on_op) or after the op (_after)."""
    calls = {"on_op": 0, "_after": 0}
    for name in calls:
        real = getattr(tracer_mod.Recorder, name)

        def counted(self, *args, _real=real, _name=name):
            calls[_name] += 1
            return _real(self, *args)

        monkeypatch.setattr(tracer_mod.Recorder, name, counted)
    return calls


@pytest.mark.parametrize("dedup", [False, True])
def test_a_llama_forward_runs_on_the_c_path(dedup, llama, tokens, tmp_path, monkeypatch):
    """Once the first forward has interned its texts (under de-dup, once each key has its
    records: two forwards), the calls of a no_grad forward are taken
    in C, statistics included: the speed of full recording rests on it. A checked op's new
    record is Python's, for its self-check (xray/record/self_check.py): a few per layer, each a
    real product. Its calls that de-dup folds take no check, and are C's like any other."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from xray.record.self_check import OPS

    class CountMatmuls(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountMatmuls.n += str(func) in OPS
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), CountMatmuls():
        llama(tokens)
    assert CountMatmuls.n > 0
    monkeypatch.delenv("XRAY_NATIVE_ROWS", raising=False)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEDUP=dedup, X_DUMP_NUM=0) as session:
        for _ in range(session.recorder.config.dedup_records if dedup else 1):  # each key's records made
            llama(tokens)
        calls = count_python_calls(monkeypatch)
        before = (session.recorder.op_calls, session.recorder.native.reductions)
        llama(tokens)
        op_calls = session.recorder.op_calls - before[0]
        reduced = session.recorder.native.reductions - before[1]
    assert session.recorder.failed is None
    assert op_calls > 100
    # a few calls may take Python's steps (a result Python keys by its text); nearly none do
    checked = 0 if dedup else CountMatmuls.n  # the second forward's matmuls all fold under de-dup
    assert calls["on_op"] - checked + calls["_after"] - checked <= op_calls // 20, calls
    if dedup:
        assert reduced <= 20  # folded calls describe nothing: only the weights read again
    else:
        assert reduced > op_calls // 2


def test_recording_keeps_no_tensor_alive(tmp_path):
    """The statistics cache and the data edges hold weak references only: a tensor the user
    drops is freed at once, and a long-lived one keeps its reference count."""
    x = torch.randn(64, 64)
    refs = sys.getrefcount(x)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEDUP=False, X_DUMP_NUM=0) as session:
        assert session.recorder.native is not None
        for _ in range(3):
            y = (x @ x).relu()
            parts = torch.split(y, 16)  # several results
            z = torch.cat(parts[::2]).sum()
            dead = [weakref.ref(t) for t in (y, z, *parts)]
            del y, z, parts
            assert all(r() is None for r in dead)
        assert sys.getrefcount(x) == refs
    assert sys.getrefcount(x) == refs


def test_an_internal_failure_stops_the_recording_not_the_forward(llama, tokens, tmp_path, monkeypatch):
    """A broken invariant inside the C path (here the writer's pending chunk, which only the C
    path reads this way) must end the recording with a warning; the forward goes on and returns
    exactly what it returns without xray."""
    from xray.dump.column_builder import ColumnBuilder

    with torch.no_grad():
        expected = llama(tokens).logits
        with xray.dump(dump_dir=tmp_path, X_DEDUP=False, X_DUMP_NUM=0) as session:
            llama(tokens)
            monkeypatch.setattr(ColumnBuilder, "row_lists", lambda self: ())
            session.writer.flush()  # a new chunk: the C path asks for its lists
            with pytest.warns(RuntimeWarning, match="recording stopped: RuntimeError: xray fast path"):
                got = llama(tokens).logits
    assert torch.equal(got, expected)
    assert session.recorder.failed is not None
    records = xray.load_dump(tmp_path).records
    assert len(records) >= session.recorder.op_calls // 2  # the first forward is all there


@torch.library.custom_op("xray_test::interrupt", mutates_args=())
def _interrupt(t: torch.Tensor) -> torch.Tensor:
    raise KeyboardInterrupt


def test_a_keyboard_interrupt_in_the_op_reaches_the_caller(tmp_path):
    """Only Exceptions stop the recording quietly; an interrupt raised inside the op propagates
    through the C path untouched, and the recording goes on."""
    x = torch.ones(3)
    with xray.dump(dump_dir=tmp_path, X_DEDUP=False, X_DUMP_NUM=0) as session:
        with pytest.raises(KeyboardInterrupt):
            _interrupt(x * 2)
        (x + 1).sum()
    assert session.recorder.failed is None
    assert [r.op for r in xray.load_dump(tmp_path).records][-2:] == ["aten.add.Tensor", "aten.sum.default"]
