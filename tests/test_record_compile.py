"""A torch.compile'd function called inside a recording session runs eagerly and is recorded.

The recorder's dispatch mode replaces TorchDispatchMode's per-call ``torch._disable_dynamo``
wrapper with a cheaper guard of its own (xray/record/tracer.py, ``_dynamo_guard``). Without any
guard, Dynamo traces the recorder's own code from inside a compiled function (it failed on the
writer's flush): compiled code inside a session must give eager's numbers, every op it runs
must be recorded, and the recorder must not fail.
"""
from __future__ import annotations

import warnings

import torch

import xray
import pytest

pytestmark = pytest.mark.slow  # a real model end to end, a deployment backend or the wheel (.ci/run)


def _f(x: torch.Tensor) -> torch.Tensor:
    return (x.sin() * 2.0).cos().sum()


def test_compiled_function_inside_a_session_runs_eagerly_and_is_recorded(tmp_path):
    torch._dynamo.reset()
    compiled = torch.compile(_f, backend="eager")
    x = torch.linspace(-3.0, 3.0, 64)
    expected = _f(x)
    assert torch.equal(compiled(x), expected)  # compiled once, before any recording
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with xray.dump(dump_dir=tmp_path / "warm", X_DEDUP=False, X_DUMP_NUM=0) as warm:
            got = compiled(x)
        assert torch.equal(got, expected)
        with xray.dump(dump_dir=tmp_path / "cold", X_DEDUP=False, X_DUMP_NUM=0) as cold:
            got = torch.compile(_f, backend="eager")(x + 1.0)  # first compiled call inside the session
        assert torch.equal(got, _f(x + 1.0))
    # Dynamo warns when it tries to trace the recorder's frames (and then graph-breaks in them)
    assert not [w for w in caught if "Dynamo" in str(w.message) or "dynamo" in str(w.filename)], \
        [str(w.message)[:200] for w in caught]
    for session, folder in ((warm, tmp_path / "warm"), (cold, tmp_path / "cold")):
        assert session.recorder.failed is None
        ops = [r.op for r in xray.load_dump(folder).records]
        for op in ("aten.sin.default", "aten.mul.Tensor", "aten.cos.default", "aten.sum.default"):
            assert op in ops, (folder.name, ops)


FALLBACK = r"""
import sys, warnings, torch, torch._dynamo.eval_frame as ef
del ef.skip_code  # a torch whose Dynamo lacks it
import xray, importlib
tracer = importlib.import_module("xray.record.tracer")
def f(x): return (x.sin() * 2.0).cos().sum()
x = torch.linspace(-3, 3, 64)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with xray.dump(dump_dir=sys.argv[1], X_DEDUP=False, X_DUMP_NUM=0) as s:
        got = torch.compile(f, backend="eager")(x)
assert torch.equal(got, f(x)) and s.recorder.failed is None
assert tracer._SKIP_CODE is False, "the guard did not notice skip_code is missing"
assert not [w for w in caught if "Dynamo" in str(w.message)], [str(w.message)[:200] for w in caught]
ops = {r.op for r in xray.load_dump(sys.argv[1]).records}
assert {"aten.sin.default", "aten.cos.default", "aten.sum.default"} <= ops, ops
print("OK")
"""


def test_without_skip_code_the_recorder_falls_back_to_torchs_wrapper(tmp_path):
    """The fallback path runs in a fresh interpreter: it replaces the mode's dispatch method."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", FALLBACK, str(tmp_path / "dump")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-1000:] + proc.stderr[-3000:]


def test_a_session_leaves_no_global_module_hook_behind(tmp_path):
    """The recorder tracks modules through global forward hooks registered ``with_kwargs``;
    removing them leaves their ids in torch's ``_global_forward_hooks_with_kwargs`` (torch 2.13),
    and every later compiled module call then warns of global hooks. A session removes both."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with xray.dump(dump_dir=tmp_path / "d", X_DEDUP=False, X_DUMP_NUM=0):
        model(torch.ones(2, 4))
    assert not torch.nn.modules.module._has_any_global_hook()
