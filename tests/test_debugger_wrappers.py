"""PrecisionDebugger's forward wrappers (xray/debugger/hooks.py) on every argument and result
structure a model may use, on NaN, on an exception in the forward, on an error inside the
capture, and on a copy of the model made mid-step."""
from __future__ import annotations

import collections
import os
import warnings

import pytest
import torch

import xray
from xray.debugger.hooks import CapturedForward
from xray.dump.module_layout import INDEX_DTYPE
from xray.demo.models import tiny_llama

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

Pair = collections.namedtuple("Pair", "first second")


class _Out(collections.OrderedDict):
    """Like transformers' ModelOutput: an OrderedDict subclass."""


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
    def forward(self, *xs):  # hundreds of positional tensors
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


def _rows(model, inputs, steps, *, tmp_path, **kwargs):
    """Every held row of ``steps`` debugged steps, as comparable tuples, and the outputs."""
    dbg = xray.PrecisionDebugger(dump_path=tmp_path / "dump", model=model, task="statistics",
                                 flush_secs=3600, **kwargs)
    outs = []
    with torch.no_grad():
        for _ in range(steps):
            dbg.start()
            wrapper = vars(model).get("forward")
            outs.append(model(*inputs))
            dbg.stop()
            dbg.step()
    assert isinstance(wrapper, CapturedForward)
    rows = [row for step in range(steps) for row in dbg._writer.rows.get(step, ())]  # sealed: plain values
    dbg.close()
    return rows, outs, dbg


def test_rows_for_every_argument_and_result_structure(tmp_path):
    torch.manual_seed(0)
    model, inputs = _Zoo(), (torch.randn(4, 8),)
    with torch.no_grad():
        eager = model(*inputs)
    rows, outs, _ = _rows(model, inputs, 3, tmp_path=tmp_path)
    assert len(rows) > 100
    names = {r[1] for r in rows}
    assert "_Zoo.0.forward_input.0" in names and "many._Many.0.forward_input.299" in names
    assert "leaf._Leaf.1.forward_input.1" in names  # extra={"k": x}, numbered after x
    assert not any(n.startswith("leaf.proj.Linear.0.forward_params.bias") for n in names)
    # the norm's output before the in-place ReLU: its statistics differ from the ReLU's output
    min_of = {r[1]: r[INDEX_DTYPE.names.index("min")] for r in rows}
    assert min_of["norm.LayerNorm.0.forward_output.0"] < 0 == min_of["act.ReLU.0.forward_output.0"]
    for out in outs:  # the debugged forward computes exactly what the eager one does
        assert all(torch.equal(out[k], eager[k]) for k in ("h", "s"))


class _Fails(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.inner(x)
        if x.sum() > 1e9:
            raise ValueError("device fault")
        return y * float("nan")


def test_reports_nan_and_lets_the_forwards_exception_through(tmp_path):
    torch.manual_seed(0)
    model = _Fails()
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=model, task="statistics")
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


def test_an_error_inside_the_capture_stops_the_capture_but_not_the_forward(tmp_path):
    torch.manual_seed(0)
    model = _Fails()
    x = torch.ones(2, 4)
    with torch.no_grad():
        expected = model.inner(x)
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=model, task="statistics")

    def broken(t):
        raise RuntimeError("statistics failed")

    dbg._capture.stats_cache.get = broken  # the first capture fails
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
