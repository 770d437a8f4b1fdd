"""mindstudio-probe (msprobe) dumps read as xray dumps, made by the real msprobe package on CPU.

msprobe patches torch's APIs process-wide, so every msprobe run is its own subprocess.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xray import load_dump
from xray.dump import DumpFormatError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("msprobe") is None,
                                reason="mindstudio-probe is not installed (pip install mindstudio-probe)")

REPO = Path(__file__).resolve().parents[1]

# One model both tools run: real sizes (hidden 1024, 512 tokens), same seed, same input.
MODEL = """
import torch
def build():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024))
    x = torch.randn(1, 512, 1024)
    return m, x
"""

MSPROBE_RUN = """
import json, sys, torch
sys.path.insert(0, sys.argv[4])
from model import build
from msprobe.pytorch import PrecisionDebugger
task, level, out = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = {"task": task, "dump_path": out, "rank": [], "step": [], "level": level, "async_dump": False,
       task: {"scope": [], "list": [], "data_mode": ["all"]}}
with open(out + ".json", "w") as f:
    json.dump(cfg, f)
m, x = build()
dbg = PrecisionDebugger(config_path=out + ".json")
dbg.start(model=m)
m(x).sum().backward()
dbg.stop()
dbg.step()
"""


def _msprobe(tmp: Path, task: str, level: str) -> Path:
    (tmp / "model.py").write_text(MODEL)
    (tmp / "msprobe_run.py").write_text(MSPROBE_RUN)
    out = tmp / f"{task}_{level}"
    subprocess.run([sys.executable, str(tmp / "msprobe_run.py"), task, level, str(out), str(tmp)], check=True,
                   capture_output=True, timeout=600)
    return out / "step0"  # msprobe: <dump_path>/step0/proc<pid>/dump.json


class _Dumps(dict):
    """msprobe's dump of each (task, level), made on first use: one subprocess (tens of seconds)
    a mode, and the fast set reads three of the six."""

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, key: tuple[str, str]) -> Path:
        self[key] = _msprobe(self.tmp, *key)
        return self[key]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> _Dumps:
    return _Dumps(tmp_path_factory.mktemp("msprobe"))


SLOW = pytest.mark.slow  # another msprobe subprocess run (.ci/run runs them with -m slow)


def _reference():
    ns: dict = {}
    exec(MODEL, ns)
    m, x = ns["build"]()
    return m, x


@pytest.mark.slow
@pytest.mark.parametrize("level, task", [
    pytest.param(level, task, marks=() if (level, task) == ("L1", "tensor") else SLOW, id=f"{level}-{task}")
    for level in ("L0", "L1", "mix") for task in ("statistics", "tensor")])
def test_every_mode_reads_with_msprobes_own_numbers(dumps, task, level):
    m, x = _reference()
    h = m[0](x).detach()
    with load_dump(dumps[task, level]) as d:
        assert d.format == "msprobe" and d.header["task"] == task and d.header["level"] == level
        kinds = {r.kind for r in d.records}
        assert kinds == {"L0": {"module"}, "L1": {"op"}, "mix": {"module", "op"}}[level]
        first = next(r for r in d.records if r.direction == "forward" and (r.op in ("Linear", "Functional.linear")))
        assert first.step == 0
        assert first.module == (None if level == "L1" else "0")  # L1 dumps carry no module (empty construct.json)
        (_, out), = first.output_tensors()
        assert out.shape == (1, 512, 1024) and out.dtype == "float32"
        assert out.stats.max == pytest.approx(float(h.max()), rel=1e-6)
        assert out.stats.std == pytest.approx(float(h.std(unbiased=False)), rel=1e-4)  # from Norm and Mean
        if task == "tensor":
            assert d.has_data(out)
            torch.testing.assert_close(d.load_tensor(out), h, rtol=0, atol=0)
        else:
            assert out.data is None
        if level != "L1":  # parameter gradients ride on the module's backward call, as in xray's module dumps
            back = next(r for r in d.records if r.kind == "module" and r.direction == "backward" and r.module == "2")
            assert {"params_grad.weight", "params_grad.bias"} <= set(back.inputs)


@SLOW
def test_summary_and_compare_cli_on_msprobe_dumps(dumps, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    s = subprocess.run([sys.executable, "-m", "xray.summary.cli", str(dumps["statistics", "mix"])],
                       capture_output=True, text=True, env=env, timeout=300)
    assert s.returncode == 0, s.stderr
    assert "Functional.linear" in s.stdout
    c = subprocess.run([sys.executable, "-m", "xray.compare.cli", str(dumps["tensor", "mix"]), str(dumps["tensor", "L1"]),
                        str(tmp_path / "c.csv")], capture_output=True, text=True, env=env, timeout=300)
    assert c.returncode == 0, c.stderr
    import pandas as pd

    rows = pd.read_csv(tmp_path / "c.csv")
    assert (rows["status"] == "pass").sum() >= 8 and not (rows["status"] == "fail").any()


XRAY_RUN = """
import sys, torch
sys.path.insert(0, sys.argv[2])
from model import build
from xray.debugger import PrecisionDebugger
m, x = build()
if sys.argv[3] == "fault":  # a x1.01 scaling bug in the second Linear's output
    m[2].register_forward_hook(lambda mod, i, o: o * 1.01)
d = PrecisionDebugger(sys.argv[1], model=m, task="tensor")
d.start(); m(x).sum().backward(); d.stop(); d.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("fault", [pytest.param(False, marks=SLOW), True])
def test_msprobe_run_against_an_xray_run(dumps, tmp_path, fault):
    """msprobe L0 on one side, xray's PrecisionDebugger on the other: module calls pair up, and a
    x1.01 scaling bug in layer 2 is the first divergence."""
    from xray.compare import compare_dumps

    model_dir = dumps["tensor", "L0"].parent.parent
    (tmp_path / "x.py").write_text(XRAY_RUN)
    subprocess.run([sys.executable, str(tmp_path / "x.py"), str(tmp_path / "xray"), str(model_dir),
                    "fault" if fault else "clean"], check=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                   timeout=300)
    result = compare_dumps(dumps["tensor", "L0"], tmp_path / "xray" / "globalrank-0_localrank-0.h5")
    s = result.summary
    assert s.matched >= 5
    if fault:
        assert s.failed >= 1 and s.first_divergence["module"] == "2"
    else:
        assert s.failed == 0 and s.passed >= 5


@pytest.mark.slow
def test_bad_msprobe_dump_is_one_line_error(dumps, tmp_path):
    src = next(dumps["tensor", "L1"].glob("proc*"))
    bad = tmp_path / "step0" / "proc1"
    bad.mkdir(parents=True)
    data = json.loads((src / "dump.json").read_text())
    entry = next(iter(data["data"].values()))
    entry["output"][0]["data_name"] = "../../etc/passwd"
    (bad / "dump.json").write_text(json.dumps(data))
    with pytest.raises(DumpFormatError, match="not a plain file name"):
        load_dump(bad)
