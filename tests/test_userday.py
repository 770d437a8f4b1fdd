"""A new user's day (issue 33): ``xray record`` and ``xray drift`` as a newcomer runs them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _xray(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """The ``xray`` console script as a user runs it: sys.path[0] is the script's own folder,
    not the current one (``python -m`` would add the current folder and hide the bug)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    code = "import sys; sys.path[0] = '/nonexistent'; from xray.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _project(tmp: Path, body: str) -> Path:
    """A script beside its own helper module, as users lay them out."""
    proj = tmp / "proj"
    proj.mkdir()
    (proj / "mymodel.py").write_text(textwrap.dedent("""
        import torch
        def build():
            torch.manual_seed(0)
            return torch.nn.Linear(16, 16), (torch.randn(4, 16),)
    """))
    (proj / "script.py").write_text(textwrap.dedent(body))
    return proj


@pytest.mark.slow
def test_record_imports_the_scripts_own_modules(tmp_path):
    proj = _project(tmp_path, """
        from mymodel import build
        m, (x,) = build()
        m(x).sum().backward()
    """)
    r = _xray("record", "-o", str(tmp_path / "out"), "--", str(proj / "script.py"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "dump written" in r.stderr
    from xray import load_dump

    with load_dump(tmp_path / "out") as d:
        assert any(rec.op.startswith("aten.addmm") for rec in d.records)
        assert "program" in d.summary and d.summary["program"]["failure"] is None


@pytest.mark.slow
def test_record_of_a_failing_script_is_no_finished_dump(tmp_path):
    proj = _project(tmp_path, """
        from mymodel import build
        m, (x,) = build()
        y = m(x)
        raise ValueError("bad batch")
    """)
    r = _xray("record", "-o", str(tmp_path / "out"), str(proj / "script.py"), cwd=tmp_path)
    assert r.returncode == 1
    assert "dump written" not in r.stderr
    assert "ValueError: bad batch" in r.stderr  # the script's traceback, as python shows it
    assert "raised ValueError: bad batch" in r.stderr and "holds only what ran before" in r.stderr
    from xray import load_dump

    with load_dump(tmp_path / "out") as d:
        assert d.summary["program"] == {"script": str(proj / "script.py"), "status": 1,
                                        "failure": "raised ValueError: bad batch"}
        assert any(rec.op.startswith("aten.addmm") for rec in d.records)  # what ran before is kept
    info = _xray("info", str(tmp_path / "out"), cwd=tmp_path)
    assert info.returncode == 0 and "INCOMPLETE RUN" in info.stdout


@pytest.mark.slow
def test_record_passes_on_the_scripts_exit_status(tmp_path):
    proj = _project(tmp_path, "import sys\nsys.exit(3)\n")
    r = _xray("record", "-o", str(tmp_path / "out"), str(proj / "script.py"), cwd=tmp_path)
    assert r.returncode == 3 and "exited with status 3" in r.stderr and "dump written" not in r.stderr


@pytest.mark.slow
def test_record_of_a_missing_script_is_one_line(tmp_path):
    r = _xray("record", "-o", str(tmp_path / "out"), "--", "nosuch.py", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "xray record: no such script: nosuch.py"
    assert not (tmp_path / "out").exists()


def test_drift_model_from_the_current_folder(tmp_path, monkeypatch):
    from xray.drift.load import ModelSpecError, load_model

    proj = _project(tmp_path, "")
    monkeypatch.chdir(proj)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd(), str(proj))])
    monkeypatch.delitem(sys.modules, "mymodel", raising=False)
    model, args, kwargs = load_model("mymodel:build")
    assert model.in_features == 16 and args[0].shape == (4, 16) and kwargs == {}
    with pytest.raises(ModelSpecError, match=r"write path/to/nosuch\.py:build"):
        load_model("nosuch:build")


@pytest.mark.slow
def test_drift_refuses_an_unknown_backend_at_once(tmp_path):
    proj = _project(tmp_path, "")
    (proj / "mymodel.py").write_text("def build():\n    open('built', 'w').close()\n    raise SystemExit(9)\n")
    started = time.perf_counter()
    r = _xray("drift", "mymodel:build", "-b", "onnxrt-cpu", "--backend", "nope", "--out", str(tmp_path / "d"),
              cwd=proj, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("xray drift: unknown backend 'nope'; presets: ")
    assert "\n" not in r.stderr.strip()
    assert not (proj / "built").exists() and not (tmp_path / "d").exists()  # nothing built, nothing exported
    # the same one check as xray-replay's
    from xray.backends.registry import UnknownBackendError
    from xray.drift.run import drift

    with pytest.raises(UnknownBackendError, match="'nope'"):
        drift(None, (), ["nope"], tmp_path / "d2")
    assert not (tmp_path / "d2").exists()
    del started


def _llama(use_cache: bool):
    from transformers import LlamaConfig, LlamaForCausalLM
    import torch

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=1,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024,
                      use_cache=use_cache, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    return model, (torch.randint(0, 1000, (1, 512), generator=torch.Generator().manual_seed(0)),)


@pytest.mark.slow  # torch.compile of a hidden-1024 Llama
def test_drift_runs_a_transformers_model_with_its_default_use_cache(tmp_path):
    """transformers' default use_cache=True: drift switches it off for its run, says so, and
    leaves the model as it was (hidden 1024, 512 tokens, GQA sdpa attention)."""
    from xray.drift.run import drift

    model, args = _llama(use_cache=True)
    said = []
    result = drift(model, args, ["torch-compile"], tmp_path / "d", progress=said.append)
    assert model.config.use_cache is True
    assert any("use_cache=False" in s for s in said) and any("use_cache=False" in n for n in result.notes)
    (b,) = result.backends
    assert b.status == "OK", b.error
    assert json.loads((tmp_path / "d" / "drift.json").read_text())["notes"] == result.notes
    from xray.drift.report import terminal_report

    assert "note: use_cache=False for this run" in terminal_report(result)


def test_drift_export_failure_on_a_cache_names_the_fix(tmp_path):
    """An explicit use_cache=True keyword is the caller's: the export error carries the fix."""
    from xray.drift.reference import ReferenceError
    from xray.drift.run import drift

    model, args = _llama(use_cache=False)
    with pytest.raises(ReferenceError, match="pass use_cache=False"):
        drift(model, args, ["onnxrt-cpu"], tmp_path / "d", kwargs={"use_cache": True})


def test_a_contiguous_5d_tensor_loads(tmp_path):
    """A GQA attention at 512 tokens records a contiguous (1, 4, 4, 512, 64) tensor whose strides
    multiply past 2**48: the dump must load (strides are not held to the shape's element limit)."""
    import torch

    from xray import begin_dump, end_dump, load_dump

    x = torch.randn(1, 4, 4, 512, 64)
    folder = begin_dump(X_DEBUG=0x102, dump_dir=tmp_path / "d")
    y = x * 2
    end_dump()
    with load_dump(folder) as d:
        (meta,) = [m for r in d.records if r.op == "aten.mul.Tensor" for _, m in r.output_tensors()]
        assert meta.shape == (1, 4, 4, 512, 64) and meta.stride == (524288, 131072, 32768, 64, 1)
    assert y.shape == x.shape


NOISY_IMPORT = """
import sys
if sys.argv[1] == "quiet":
    import xray
    xray.quiet_third_party()
import logging
from transformers import LlamaConfig, LlamaForCausalLM
LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                             vocab_size=100))
logging.getLogger("torchao").warning("a user's own torchao line")
"""


@pytest.mark.slow  # two processes importing transformers and torchao
@pytest.mark.skipif(__import__("importlib").util.find_spec("torchao") is None, reason="torchao is not installed")
def test_quiet_third_party_in_a_users_own_program(tmp_path):
    (tmp_path / "noisy.py").write_text(NOISY_IMPORT)

    def run(mode: str) -> str:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop("TRANSFORMERS_VERBOSITY", None)
        return subprocess.run([sys.executable, str(tmp_path / "noisy.py"), mode], capture_output=True, text=True,
                              env=env, timeout=300, check=True).stderr

    loud, quiet = run("loud"), run("quiet")
    assert "Failed to load" in loud and "is an Enum subclass" in loud  # the noise is real here
    assert "Failed to load" not in quiet and "is an Enum subclass" not in quiet
    assert "a user's own torchao line" in quiet  # only the known lines go


@pytest.mark.slow  # a deployment backend (ExecuTorch) in a subprocess
@pytest.mark.skipif(__import__("importlib").util.find_spec("executorch") is None, reason="executorch not installed")
def test_drift_output_has_no_executorch_cpuinfo_lines(tmp_path):
    """XNNPACK's runtime logs its CPU probing ('[cpuinfo_utils.cpp:71] Reading file ...') on
    every program load; drift's output is free of it, and other stderr lines still pass."""
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "lin.py").write_text(textwrap.dedent("""
        import torch
        def build():
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024))
            return m.eval(), (torch.randn(1, 512, 1024),)
    """))
    r = _xray("drift", "lin:build", "-b", "executorch-xnnpack", "--out", str(tmp_path / "d"), cwd=proj)
    assert r.returncode == 0, r.stderr
    assert "cpuinfo_utils" not in r.stderr + r.stdout
    assert "xray drift: backend executorch-xnnpack" in r.stderr
    drift = json.loads((tmp_path / "d" / "drift.json").read_text())
    assert drift["backends"][0]["status"] == "OK"


def test_executorch_log_filter_passes_other_lines(capsys):
    from xray.quiet import executorch_logs

    with executorch_logs():
        print("[cpuinfo_utils.cpp:71] Reading file /sys/devices/soc0/image_version", file=sys.stderr)
        print("[method.cpp:1] a real ExecuTorch error", file=sys.stderr)
    err = capsys.readouterr().err
    assert err == "[method.cpp:1] a real ExecuTorch error\n"


@pytest.mark.slow
def test_guide_states_the_demos_real_counts(tmp_path):
    """docs/guide.md quotes what `xray demo` shows: its numbers are the demo's own."""
    import re

    import torch

    from xray.compare import compare_dumps
    from xray.demo.examples import record_pair

    guide = (REPO / "docs" / "guide.md").read_text()
    text = " ".join(guide.split())
    quoted = re.search(r"`xray demo` plays this out on (\d+) compared pairs: bf16 autocast gives (\d+) warnings "
                       r"\(and (\d+) passes\).*? Of the (\d+) failing pairs, (\d+) inherit", text)
    assert quoted, "the guide's demo paragraph changed shape"
    pairs, warned, passed, failed, inherited = map(int, quoted.groups())
    with torch.no_grad():  # the demo's own sizes and calls (xray/demo/run.py, not --small)
        bench, target, hit = record_pair(tmp_path / "dumps", layers=2, hidden=64, seq=16, dump_num=8)
    assert hit
    result = compare_dumps(bench, target, progress=False)
    s = result.summary
    assert (s.warned, s.passed, s.failed) == (warned, passed, failed)
    assert s.passed + s.warned + s.failed + s.nan_inf + s.skipped == pairs
    assert sum(r.status == "fail" and r.origin == "inherited" for r in result.rows) == inherited
