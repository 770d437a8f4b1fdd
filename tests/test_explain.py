"""xray explain / xray fix on real transformers models (random weights): the demo Llama with a
bf16 target and one broken matmul call, and a T5 whose FF outliers overflow fp16."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xray.cli import main
from xray.explain import analysis, hooks
from xray.explain.cli import parse_inject
from xray.explain.ops import GraftOps
from xray.explain.examples import OUTLIER_FF, demo_llama, t5_fp16_overflow
from xray.explain.search import fix
from xray.explain.spec import Spec, SpecError, parse_spec
from xray.explain.trees import error

FAULT = "aten.mm.default#5+0.05"  # the demo's broken call: layer 0's up_proj matmul
FAULT_MODULE = "model.layers.0.mlp.up_proj"


def test_spec_parsing():
    assert parse_spec("cpu") == Spec("cpu", "fp32")
    assert parse_spec("cpu:bf16") == Spec("cpu", "bf16")
    assert parse_spec("cuda:1:tf32") == Spec("cuda:1", "tf32")
    assert parse_spec("cuda:1") == Spec("cuda:1", "fp32")
    assert parse_spec("cpu:fp16-cast").cast_dtype == torch.float16
    for bad in ("cpu:int3", "gpu:bf16", "cpu:tf32", ""):
        with pytest.raises(SpecError):
            parse_spec(bad)


@pytest.fixture(scope="module")
def demo_cli(tmp_path_factory):
    out = tmp_path_factory.mktemp("explain")
    rc = main(["explain", "xray.explain.examples:demo_llama", "--target", "cpu:bf16", "--inject", FAULT,
               "--out", str(out)])
    assert rc == 0
    return json.loads((out / "explain.json").read_text()), out


@pytest.mark.slow
def test_demo_fault_ranked_first_and_call_named(demo_cli):
    x, out = demo_cli
    modules = sorted((r for r in x["rows"] if r["kind"] == "module"), key=lambda r: -r["self_share"])
    assert modules[0]["name"] == FAULT_MODULE
    assert x["top"] == FAULT_MODULE
    assert x["top_op"].startswith(FAULT_MODULE + "/aten.mm.default#")
    op = next(r for r in x["rows"] if r["name"] == x["top_op"])
    assert op["origin"] == "born"  # compare's verdict on the same call
    assert x["compare"]["born"] == [x["top_op"]]  # no other call is wrong on its own inputs
    html = (out / "explain.html").read_text()
    assert FAULT_MODULE in html and "<script" not in html


@pytest.mark.slow
def test_demo_graft_leaves_bf16_noise(demo_cli):
    x, _ = demo_cli
    model, args = demo_llama()
    _, runs, tcap, _ = analysis.capture_both(model, args, {}, "cpu", "cpu:bf16")  # bf16, no fault
    clean = error(tcap.final, runs.bench.final)
    assert x["error"] > 5 * clean  # the fault dominates the final error
    assert abs(x["error_without_top"] - clean) <= 0.2 * clean
    assert x["rest"]["spread"] is True and x["rest"]["best_share"] < analysis.MOST
    assert "bf16 noise spread over the model" in x["verdict"]


def test_fp32_graft_removes_an_fp32_fault_entirely():
    """Bench and target both fp32: the only difference is the broken call, and grafting its
    module restores the bench's output bit for bit."""
    model, args = demo_llama()
    x = analysis.explain(model, args, target="cpu", target_context=parse_inject(FAULT), op_modules=0,
                         residual=False)
    assert x.error > 0
    top = x.ranking()[0]
    assert top.name == FAULT_MODULE and top.error_grafted == 0.0 and top.self_share == pytest.approx(1.0)
    assert x.row("model.layers.0.mlp").prefix_error == 0.0  # everything up to the MLP fixed: nothing left


def test_same_precision_has_nothing_to_explain():
    model, args = demo_llama()
    x = analysis.explain(model, args, target="cpu", op_modules=0)
    assert x.error == 0.0 and x.top is None and "nothing to explain" in x.verdict


@pytest.fixture(scope="module")
def t5_fix():
    model, args, kwargs = t5_fp16_overflow()
    return fix(model, args, kwargs, target="cpu:fp16", max_error=1e-2)


@pytest.mark.slow
def test_fix_finds_fp32_islands_for_an_fp16_overflow(t5_fix):
    f = t5_fix
    assert f.error_before > 1e-2  # NaN logits: the normwise error is inf
    assert f.found and 1 <= len(f.modules) <= 3 and f.error_after <= 1e-2
    assert f.modules == [OUTLIER_FF]  # narrowed down to the layer whose output overflows
    assert f.ops == {OUTLIER_FF: ["aten.mm.default"]}  # then ops: only its matmul needs fp32
    assert f.error_after_ops <= 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("which", ["code", "op_code"])
def test_fix_printed_code_does_the_same_when_pasted(t5_fix, which):
    model, args, kwargs = t5_fp16_overflow()  # a fresh model, as a user's script builds it
    namespace = {"model": model}
    exec(getattr(t5_fix, which), namespace)  # noqa: S102 - the code xray printed, as a user pastes it
    with analysis.capped_threads(1):
        bench = hooks.run(t5_fp16_overflow()[0], args, kwargs, parse_spec("cpu")).final
        fixed = hooks.run(namespace["model"], args, kwargs, parse_spec("cpu:fp16")).final
        plain = hooks.run(t5_fp16_overflow()[0], args, kwargs, parse_spec("cpu:fp16")).final
    assert error(plain, bench) > 1e-2
    assert error(fixed, bench) == (t5_fix.error_after if which == "code" else t5_fix.error_after_ops)


@pytest.mark.slow
def test_fix_cli_writes_code(tmp_path, capsys):
    rc = main(["fix", "xray.explain.examples:t5_fp16_overflow", "--target", "cpu:fp16", "--max-error", "1e-2",
               "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert rc == 0 and f"keep 1 module(s) in fp32: {OUTLIER_FF}" in printed
    assert "def keep_in_fp32" in (tmp_path / "fix.py").read_text()
    assert "def keep_ops_in_fp32" in (tmp_path / "fix_ops.py").read_text()
    assert json.loads((tmp_path / "fix.json").read_text())["modules"] == [OUTLIER_FF]


@pytest.mark.parametrize("argv, message", [
    (["--target", "cpu:int3"], "unknown precision mode"),
    (["--target", "cpu:bf16", "--inject", "mm"], "--inject"),
    (["--target", "cpu:bf16", "--bench", "cuda"] if not torch.cuda.is_available() else ["--target", "cpu:int3"],
     "no CUDA device here" if not torch.cuda.is_available() else "unknown precision mode"),
])
def test_bad_input_one_line_error(argv, message, capsys):
    rc = main(["explain", "xray.explain.examples:demo_llama", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]


def test_bad_factory_one_line_error(capsys):
    rc = main(["fix", "no_such_module_xyz:f", "--target", "cpu:fp16", "--max-error", "1e-2"])
    assert rc == 2 and "cannot import" in capsys.readouterr().err


def test_op_graft_replaces_the_numbered_call_and_refuses_another_op():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    value = torch.full((4, 4), 7.0)
    with torch.no_grad(), GraftOps({1: ("aten.mm.default", 0, value)}) as mode:
        x = torch.add(a, b)  # call 0
        y = torch.mm(x, b)  # call 1: grafted
        z = torch.mm(y, b)  # call 2: computed on the grafted value
    assert mode.done == 1 and torch.equal(y, value) and torch.allclose(z, value @ b)
    with pytest.raises(RuntimeError, match="does not issue the same calls"):
        with torch.no_grad(), GraftOps({0: ("aten.mm.default", 0, value)}):
            torch.add(a, b)


@pytest.mark.parametrize("command", ["explain", "fix"])
def test_help_is_light(command):
    """``xray explain --help`` answers without importing torch (as every xray --help does)."""
    root = Path(__file__).resolve().parents[1]
    code = ("import sys, contextlib, io\nfrom xray.cli import main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n    try:\n"
            f"        main([{command!r}, '--help'])\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules, 'FACTORY' in out.getvalue() or 'factory' in out.getvalue())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.stdout.split()[-2:] == ["False", "True"], proc.stdout + proc.stderr
