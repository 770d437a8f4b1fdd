"""The console scripts: `xray record`/`info`, fast --help everywhere, clear one-line errors, plain
output in files and pipes, and nothing printed that is not xray's."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import xray

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib


def test_xray_record_runs_an_unmodified_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys, torch\nx = torch.ones(3) * float(sys.argv[1])\nprint('SUM', x.sum().item())\n")
    proc = subprocess.run([sys.executable, "-m", "xray.cli", "record", "-o", str(tmp_path / "d"), "--dedup", "0",
                           "--", str(script), "2.5"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SUM 7.5" in proc.stdout
    dump = xray.load_dump(tmp_path / "d")
    assert [r.op for r in dump.records] == ["aten.ones.default", "aten.mul.Tensor", "aten.sum.default",
                                            "aten._local_scalar_dense.default"]


@pytest.mark.slow
def test_xray_info_summarises_and_rejects_bad_paths(tmp_path):
    import torch

    with xray.dump(dump_dir=tmp_path, X_DEDUP=False) as session:
        torch.tensor([1.0, float("nan")]) * 2
    proc = subprocess.run([sys.executable, "-m", "xray.cli", "info", str(session.folder)], capture_output=True, text=True)
    assert proc.returncode == 0 and "aten.mul.Tensor" in proc.stdout and "first NaN/Inf output" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "xray.cli", "info", str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 2 and "no such file" in bad.stderr


# -- every console script: fast --help, clear errors, plain output in pipes ------------------------------

ROOT = Path(__file__).resolve().parents[1]
DUMPS = ROOT / "dumps"
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
HEAVY = ("torch", "h5py", "pandas", "matplotlib", "transformers")
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")


def _heavy_imports(target: str, argv: list[str]) -> tuple[list[str], str]:
    """Run console-script entry point ``module:function`` with argv in a fresh interpreter; return
    the heavy modules it imported and what it printed."""
    module, function = target.split(":")
    code = (f"import sys, json, io, contextlib\nfrom {module} import {function} as main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n    try:\n"
            f"        main({argv!r})\n    except SystemExit:\n        pass\n"
            f"print(json.dumps([[m for m in {HEAVY!r} if m in sys.modules], out.getvalue()]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_does_not_import_torch(script):
    heavy, text = _heavy_imports(SCRIPTS[script], ["--help"])
    assert heavy == [], f"{script} --help imported {heavy}"
    assert text.startswith("usage:")


@pytest.mark.parametrize("command", ["demo", "info", "record", "drift"])
def test_xray_subcommand_help_is_light_and_explained(command):
    heavy, text = _heavy_imports(SCRIPTS["xray"], [command, "--help"])
    assert heavy == [], f"xray {command} --help imported {heavy}"
    body = text.split("\n\n", 1)[1]  # after the usage line: a description of the command
    assert len(body.split("\n\n")[0]) > 40, text
    if command == "info":
        assert "module-level .h5" in text and "most called first" in text


@pytest.mark.slow
def test_import_xray_is_light_and_names_still_resolve():
    code = ("import sys, xray; light = 'torch' not in sys.modules\n"
            "import xray.dump.model\n"  # the subpackage import must not hide the session function
            "print(light, callable(xray.dump), xray.load_dump.__module__, xray.PrecisionDebugger.__name__)\n"
            "missing = [n for n in [*xray.__all__, *dir(xray)] if not hasattr(xray, n)]; print(missing or 'ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.stdout.split() == ["True", "True", "xray.dump", "PrecisionDebugger", "ok"], proc.stderr[-2000:]


def _run(*cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from {} import {} as m; sys.exit(m())".format(
        *SCRIPTS[cmd[0]].split(":")), *cmd[1:]], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_gen_refuses_a_module_level_dump(tmp_path):
    proc = _run("xray-gen", str(DUMPS / "llama-module.h5"), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "module-level dump (PrecisionDebugger) with no ATen op records" in proc.stderr
    assert "pass a trace dump" in proc.stderr and "dump_torch_api=True" in proc.stderr
    assert not list((tmp_path / "out").glob("test_*.py"))


@pytest.mark.slow
def test_missing_dump_is_named_once(tmp_path):
    for script in ("xray-gen", "xray-summary", "xray-replay", "xray-compare"):
        extra = {"xray-replay": ["-b", "onnxrt-cpu"], "xray-compare": [str(DUMPS / "llama-fp32"), "o.csv"]}
        proc = _run(script, "nonexist/dump.json", *extra.get(script, []), cwd=tmp_path)
        assert proc.returncode == 2, (script, proc.stderr)
        assert proc.stderr.count("nonexist/dump.json") == 1, (script, proc.stderr)


@pytest.mark.slow
def test_summary_names_the_steps_a_dump_has(tmp_path):
    proc = _run("xray-summary", str(DUMPS / "llama-module.h5"), "--step", "7", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--step 7: no such step; the dump has steps 0" in proc.stderr
    part = _run("xray-summary", str(DUMPS / "llama-module.h5"), "--step", "0-2", cwd=tmp_path)
    assert part.returncode == 0 and "warning: steps 1-2 are not in the dump (it has 0)" in part.stderr
    trace = _run("xray-summary", str(DUMPS / "llama-fp32"), "--step", "1", cwd=tmp_path)
    assert trace.returncode == 2 and "records no step numbers" in trace.stderr


@pytest.mark.slow
def test_compare_console_report_fits_120_columns_and_has_no_ansi(tmp_path):
    proc = _run("xray-compare", str(DUMPS / "llama-fp32"), str(DUMPS / "llama-bf16-fault"), "out.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = proc.stdout.split("Worst rows", 1)[1].split("\n\n")[0].splitlines()[1:]
    assert len(table) == 12 and "record (bench)" in table[0]  # header, rule, 10 rows
    assert max(map(len, proc.stdout.splitlines())) <= 120, proc.stdout
    assert "model.layers.0.mlp.up_proj/aten.mm.default#125" in table[2]  # the born row keeps its name
    assert "\033" not in proc.stdout + proc.stderr
    import pandas as pd

    assert {"bench_name", "target_name", "mode", "layout"} <= set(pd.read_csv(tmp_path / "out.csv").columns)


@pytest.mark.slow
def test_diff_tables_have_headers(tmp_path):
    from xray.gen.columns import RESULT_COLUMNS

    for side, err in (("a", "1e-7"), ("b", "2e-3")):
        rows = [dict.fromkeys(RESULT_COLUMNS, ""), dict.fromkeys(RESULT_COLUMNS, "")]
        for i, r in enumerate(rows):
            r.update(name=f"test_x.py::t{i}", op_name="aten.mm.default", is_pass="True", max_abs_err=err,
                     max_rel_err=err)
        (tmp_path / f"{side}.csv").write_text(",".join(RESULT_COLUMNS) + "\n" + "\n".join(
            ",".join(r[c] for c in RESULT_COLUMNS) for r in rows) + "\n")
    proc = _run("xray-diff", "a.csv", "b.csv", "d.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["by", "test", "tests"]
    assert "by op, failures and error spread first (1 of 1 ops):" in proc.stdout
    assert re.search(r"\|\s*op_name\s*\|\s*tests\s*\|", proc.stdout)


def test_demo_headings_are_bold_only_on_a_terminal(capsys):
    import importlib

    say = importlib.import_module("xray.demo_command")._say
    say("1/7 record")
    assert capsys.readouterr().out == "\n== 1/7 record\n"  # captured: not a terminal


FOREIGN = re.compile(r"torchao|Failed to load|_pytree|Enum subclass|^W\d{4} ", re.M)


@pytest.mark.slow
def test_record_of_a_users_transformers_model_prints_only_xray(tmp_path):
    """A user's own script that builds a transformers model: in an environment with ExecuTorch
    (and so torchao) installed, transformers' import of torchao logs foreign lines; xray's CLI
    drops exactly those."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom transformers import LlamaConfig, LlamaForCausalLM\n"
        "cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,\n"
        "                  num_key_value_heads=1, vocab_size=64)\n"
        "model = LlamaForCausalLM(cfg).eval()\n"
        "with torch.no_grad():\n    model(torch.arange(8).view(1, 8))\nprint('done')\n")
    proc = _run("xray", "record", "-o", str(tmp_path / "d"), "--", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "done"
    assert not FOREIGN.search(proc.stderr), proc.stderr
    assert proc.stderr.strip().startswith("xray: dump written to"), proc.stderr


@pytest.mark.slow
def test_compare_of_two_kinds_of_dump_reads_an_xray(tmp_path):
    proc = _run("xray-compare", str(DUMPS / "llama-fp32"), str(DUMPS / "llama-module.h5"), "o.csv", cwd=tmp_path)
    assert proc.returncode == 2
    assert "is an xray-trace dump but" in proc.stderr and "is an xray-module dump" in proc.stderr


@pytest.mark.slow
def test_generated_suite_loads_its_plugin_and_labels_the_reference_dtype(tmp_path):
    """The suite's conftest.py brings --device/--seed/--detail_compare_path; ops on integer inputs
    say their reference ran at the same dtype (nothing was widened), float ops say upcast."""
    from importlib.metadata import distributions

    assert _run("xray-gen", str(DUMPS / "llama-dedup"), "-o", "suite", "-q", cwd=tmp_path).returncode == 0
    assert "xray.gen.plugin" in (tmp_path / "suite" / "conftest.py").read_text()
    env = dict(ENV)
    if any(e.group == "pytest11" and e.value.startswith("xray") for d in distributions() for e in d.entry_points):
        env["PYTEST_ADDOPTS"] = "-p no:xray"  # an older xray install still registers the plugin globally
    proc = subprocess.run([sys.executable, "-m", "pytest", "suite", "--device", "cpu", "--seed", "42",
                           "--detail_compare_path=r.csv", "-q", "-p", "no:cacheprovider"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    import pandas as pd

    rows = pd.read_csv(tmp_path / "r.csv")
    assert len(rows) == 48
    integer = rows[rows["dtype"].astype(str).str.startswith("int")]
    assert len(integer) and set(integer["ref_dtype"]) == {"int64 (same)"}  # was "int64 (upcast)"
    assert set(rows.loc[rows["op_name"] == "aten.mm.default", "ref_dtype"]) == {"float64 (upcast)"}


@pytest.mark.slow
def test_gen_never_overwrites_a_users_conftest(tmp_path):
    mine = tmp_path / "suite" / "conftest.py"
    mine.parent.mkdir()
    mine.write_text("# my fixtures\n")
    proc = _run("xray-gen", str(DUMPS / "llama-dedup"), "-o", "suite", "-q", cwd=tmp_path)
    assert proc.returncode == 2 and "was not written by xray-gen" in proc.stderr
    assert mine.read_text() == "# my fixtures\n" and not list(mine.parent.glob("test_*.py"))
    again = _run("xray-gen", str(DUMPS / "llama-dedup"), "-o", "ours", "-q", cwd=tmp_path)
    assert again.returncode == 0 and _run("xray-gen", str(DUMPS / "llama-dedup"), "-o", "ours", "-q",
                                          cwd=tmp_path).returncode == 0  # its own conftest is regenerated


def test_only_the_known_foreign_lines_are_dropped():
    import logging

    from xray.quiet import quiet_third_party

    quiet_third_party()
    quiet_third_party()  # idempotent
    assert len(logging.getLogger("torchao").filters) == 1
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    loggers = [logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        loggers[0].warning("Failed to load /x/torchao/_C_mxfp8.so: cannot open")
        loggers[1].warning("%s is an Enum subclass and is now natively supported by torch.compile", "<enum 'K'>")
        loggers[0].warning("quantization config is invalid")
        loggers[1].warning("some other pytree warning")
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    assert seen == ["quantization config is invalid", "some other pytree warning"]
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party()  # its filters go before "always"
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
        warnings.warn("another FutureWarning", FutureWarning)
    assert [str(w.message) for w in caught] == ["another FutureWarning"]
