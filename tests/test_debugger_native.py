"""PrecisionDebugger's C fast path (xray/debugger/_tap.c) against its Python reference.

Statistics-only dumps run plain module calls through _tap.Tap; XRAY_NATIVE_HOOKS=0 (here:
hooks.NATIVE = False) runs the Python wrappers. Both must write the same rows in the same
order, for every argument and result structure a model may use, and behave the same on NaN,
on an exception in the forward and on an error inside the capture.
"""
from __future__ import annotations

import collections
import os
import warnings

import pytest
import torch

import xray
from xray.debugger import hooks
from xray.dump.module_layout import INDEX_DTYPE
from xray.demo.models import tiny_llama, token_batch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

pytestmark = pytest.mark.skipif(os.environ.get("XRAY_NATIVE_HOOKS", "1") == "0",
                                reason="the C fast path is switched off (XRAY_NATIVE_HOOKS=0)")

Pair = collections.namedtuple("Pair", "first second")


class _Out(collections.OrderedDict):
    """Like transformers' ModelOutput: an OrderedDict subclass (Python flattens it for C)."""


class _Leaf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False)  # _parameters holds bias=None

    def forward(self, x, scale=None, *, extra=(), flag=True, note="n"):
        y = self.proj(x)
        if scale is not None:
            y = y * scale
        for e in torch.utils._pytree.tree_leaves(extra):
            y = y + e.sum()
        return Pair(y, [x.t(), {"n": torch.arange(3)}])


class _Many(torch.nn.Module):
    def forward(self, *xs):  # more positional tensors than the C table of keys ("0".."255")
        return torch.stack(xs).sum(0)


class _Zoo(torch.nn.Module):
    """Argument and result structures of every kind, a module called twice, an in-place ReLU
    after a norm (the norm's output statistics must be taken before the ReLU rewrites them)."""

    def __init__(self):
        super().__init__()
        self.leaf = _Leaf()
        self.norm = torch.nn.LayerNorm(8)
        self.act = torch.nn.ReLU(inplace=True)
        self.many = _Many()
        self.weightless = torch.nn.Identity()

    def forward(self, x, mask=None):
        a = self.leaf(x, torch.tensor(2.0), extra=(x[0], [x[1]]), flag=False)
        b = self.leaf(a.first, extra={"k": x})  # the second call of the same module
        h = self.act(self.norm(b.first))
        s = self.many(*[h[i % 4] for i in range(300)])
        nothing = self.weightless(None)
        return _Out(h=h, s=s, parts=(a.second[0], [b.second[1]["n"]]), nothing=nothing,
                    param=self.weightless(self.leaf.proj.weight), strided=self.weightless(h.t()))


def _rows(model, inputs, steps, *, native: bool, tmp_path, **kwargs):
    """Every held row of ``steps`` debugged steps, as comparable tuples, and the outputs."""
    hooks.NATIVE = native
    dbg = xray.PrecisionDebugger(dump_path=tmp_path / f"native-{native}", model=model, task="statistics",
                                 flush_secs=3600, **kwargs)
    outs = []
    with torch.no_grad():
        for _ in range(steps):
            dbg.start()
            wrapper = vars(model).get("forward")
            outs.append(model(*inputs))
            dbg.stop()
            dbg.step()
    assert (type(wrapper).__name__ == "Tap") == native  # the path under test was the one taken
    rows = [row for step in range(steps) for row in dbg._writer.rows.get(step, ())]  # sealed: plain values
    dbg.close()
    return rows, outs, dbg


@pytest.fixture(autouse=True)
def _restore_native():
    before = hooks.NATIVE
    yield
    hooks.NATIVE = before


@pytest.mark.parametrize("case", ["zoo", "llama"])
def test_c_and_python_paths_write_the_same_rows(tmp_path, case):
    assert hooks._tap is not None, "xray.debugger._tap was not built: the install needs a C compiler"
    if case == "zoo":
        torch.manual_seed(0)
        model, inputs = _Zoo(), (torch.randn(4, 8),)
    else:
        model, inputs = tiny_llama(layers=2, hidden=32), (token_batch(),)
    fast, fast_out, _ = _rows(model, inputs, 3, native=True, tmp_path=tmp_path)
    slow, slow_out, _ = _rows(model, inputs, 3, native=False, tmp_path=tmp_path)
    assert len(fast) == len(slow) > 100
    for a, b in zip(fast, slow):
        assert a == b
    names = {r[1] for r in fast}
    if case == "zoo":
        assert "_Zoo.0.forward_input.0" in names and "many._Many.0.forward_input.299" in names
        assert "leaf._Leaf.1.forward_input.1" in names  # extra={"k": x}, numbered after x
        assert not any(n.startswith("leaf.proj.Linear.0.forward_params.bias") for n in names)
        # the norm's output before the in-place ReLU: its statistics differ from the ReLU's output
        min_of = {r[1]: r[INDEX_DTYPE.names.index("min")] for r in fast}
        assert min_of["norm.LayerNorm.0.forward_output.0"] < 0 == min_of["act.ReLU.0.forward_output.0"]
    for x, y in zip(fast_out, slow_out):
        if case == "llama":
            assert torch.equal(x.logits, y.logits)
        else:
            assert all(torch.equal(x[k], y[k]) for k in ("h", "s"))


class _Fails(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.inner(x)
        if x.sum() > 1e9:
            raise ValueError("device fault")
        return y * float("nan")


def test_c_path_reports_nan_and_lets_the_forwards_exception_through(tmp_path):
    torch.manual_seed(0)
    model = _Fails()
    for native in (True, False):
        hooks.NATIVE = native
        dbg = xray.PrecisionDebugger(dump_path=tmp_path / str(native), model=model, task="statistics")
        with torch.no_grad():
            dbg.start()
            model(torch.ones(2, 4))
            dbg.stop()
            assert dbg.first_overflow is not None and dbg.first_overflow.name == "_Fails.0.forward_output.0"
            dbg.step()
            dbg.start()
            with pytest.raises(ValueError, match="device fault"):
                model(torch.full((2, 4), 1e10))
            dbg.stop()
        names = [r[0] for r in dbg._writer.csv_rows(1)]
        assert names == ["_Fails.0.forward_input.0", "inner.Linear.0.forward_input.0", "inner.Linear.0.forward_params.weight",
                         "inner.Linear.0.forward_params.bias", "inner.Linear.0.forward_output.0"]
        assert dbg.failed is None
        dbg.close()


def test_an_error_inside_the_c_capture_stops_the_capture_but_not_the_forward(tmp_path):
    torch.manual_seed(0)
    model = _Fails()
    x = torch.ones(2, 4)
    with torch.no_grad():
        expected = model.inner(x)
    hooks.NATIVE = True
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=model, task="statistics")

    def broken(t):
        raise RuntimeError("statistics failed")

    dbg._hooks._state.cells_of = broken  # every new tensor version is a miss: the first capture fails
    calls = []
    model.inner.register_forward_hook(lambda m, a, o: calls.append(o))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg.start()
        model(x)
        dbg.stop()
    assert len(calls) == 1 and torch.equal(calls[0], expected)  # the forward ran once, unchanged
    assert dbg.failed == "RuntimeError: statistics failed"
    assert any("capture stopped" in str(w.message) for w in caught)
    assert "forward" not in vars(model) and "forward" not in vars(model.inner)  # nothing left on the model
    dbg.close()


def test_a_module_is_not_copied_mid_step_but_is_after_stop(tmp_path):
    """A copy made between start() and stop() would carry a wrapper that runs the original
    module's forward: deepcopy and pickle refuse it with the reason; after stop() they work."""
    import copy
    import pickle

    hooks.NATIVE = True
    model = tiny_llama(layers=1, hidden=32)
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=model, task="statistics")
    dbg.start()
    for copier in (copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="between start\\(\\) and stop\\(\\)"):
            copier(model)
    dbg.stop()
    twin = copy.deepcopy(model)
    assert not any("forward" in vars(m) for m in twin.modules())
    dbg.close()
