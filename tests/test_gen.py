"""xray-gen end to end: a real transformers model's dump -> generated suite -> pytest -> CSV -> xray-diff."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import xray
from xray.gen.blacklist import Blacklist
from xray.gen.cli import main as gen_main
from xray.gen.columns import RESULT_COLUMNS
from xray.gen.diff import main as diff_main
from xray.demo.models import tiny_llama, token_batch

ENV = dict(os.environ, TRANSFORMERS_VERBOSITY="error")


def _record(tmp: Path, **cfg) -> Path:
    m = tiny_llama(layers=1, hidden=32)
    with torch.no_grad(), xray.dump(dump_dir=tmp, **cfg) as d:
        m(token_batch())
    return d.folder


# One worker builds the generated suite once for the module (pyproject's --dist loadgroup).
pytestmark = pytest.mark.xdist_group("gen")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """The same forward recorded without de-dup (every call), with the recorder's de-dup (a
    tensor per signature), and with de-dup and statistics only."""
    root = tmp_path_factory.mktemp("dumps")
    full = _record(root / "full", X_DEDUP=False, X_DUMP_NUM=8)
    dedup = _record(root / "dedup", X_DEDUP=True, X_DUMP_NUM=1)
    stats = _record(root / "stats", X_DEDUP=True, X_DUMP_NUM=0)
    return full, dedup, stats


def run_pytest(folder: Path, *extra: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # the plugin by name: installed entry point or not, and the same name a suite's conftest uses
    cmd = [sys.executable, "-m", "pytest", str(folder), "-q", "-p", "no:cacheprovider", "-p", "xray.gen.plugin",
           "--device", "cpu", *extra]
    return subprocess.run(cmd, cwd=cwd or folder.parent, env=ENV, capture_output=True, text=True, timeout=300)


def test_functions(folder: Path) -> list[str]:
    names = []
    for f in sorted(folder.glob("test_*.py")):
        tree = ast.parse(f.read_text())
        names += [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    return names


test_functions.__test__ = False  # a helper, not a test


@pytest.fixture(scope="module")
def suite(dumps, tmp_path_factory):
    """Generated from the full dump and run once on CPU: (folder, result csv, pytest result)."""
    out = tmp_path_factory.mktemp("suite")
    folder = out / "pytests"
    assert gen_main([str(dumps[0]), "-o", str(folder), "-q"]) == 0
    csv = out / "result.csv"
    res = run_pytest(folder, "--seed", "42", f"--detail_compare_path={csv}")
    return folder, csv, res


def test_generated_suite_passes_on_cpu_and_writes_csv(suite):
    folder, csv, res = suite
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    df = pd.read_csv(csv)
    assert list(df.columns) == RESULT_COLUMNS
    assert len(df) == len(test_functions(folder)) > 20
    assert df["is_pass"].all(), df.loc[~df["is_pass"], ["name", "error"]].to_string()
    assert set(df["ref_dtype"].str.split(" ").str[0]) >= {"float64"}  # fp32 ops checked against fp64
    # generated files import only torch and the runtime (numpy/pytest allowed, unused here)
    for f in folder.glob("test_*.py"):
        imports = {n.names[0].name if isinstance(n, ast.Import) else n.module
                   for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))}
        assert imports <= {"torch", "numpy", "pytest", "xray.gen.runtime"}, (f, imports)


def test_one_test_per_distinct_signature(suite, dumps):
    folder, _, _ = suite
    # The recorder's own de-dup of the same forward is an independent count of distinct signatures:
    # it keeps a record per module, and copies tensors for a signature's first record only.
    bl = Blacklist.load()
    expected = [r for r in xray.load_dump(dumps[1]).records if r.kind == "op" and not bl.blocks(r.op)
                and any(m.data is not None for _, m in (*r.input_tensors(), *r.output_tensors()))]
    full = [r for r in xray.load_dump(dumps[0]).records if r.kind == "op" and not bl.blocks(r.op)]
    assert len(full) > len(expected)  # there was something to collapse
    assert len(test_functions(folder)) == len(expected)
    manifest = json.loads((folder / "xray_gen.json").read_text())
    assert manifest["tests"] == len(expected)


@pytest.mark.slow
def test_suite_is_portable(suite, tmp_path):
    """Copy the folder elsewhere (the dump is not there) and run it again."""
    folder, _, _ = suite
    moved = tmp_path / "elsewhere"
    shutil.copytree(folder, moved)
    res = run_pytest(moved, "-x")
    assert res.returncode == 0, res.stdout[-3000:]


@pytest.mark.slow  # the generated suite again, under pytest -n 2 in a subprocess
def test_xdist_run_gives_one_consistent_csv(suite, tmp_path):
    folder, csv_serial, _ = suite
    csv = tmp_path / "xdist.csv"
    res = run_pytest(folder, "-n", "2", "--seed", "42", f"--detail-compare-path={csv}")
    assert res.returncode == 0, res.stdout[-3000:]
    a, b = pd.read_csv(csv_serial), pd.read_csv(csv)
    assert list(a["name"]) == list(b["name"])  # every test exactly once, sorted
    pd.testing.assert_frame_equal(a.drop(columns=["error"]), b.drop(columns=["error"]))
    assert not list(tmp_path.glob("*.tmp"))


PERTURB_CONFTEST = '''
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class WrongMul(TorchDispatchMode):
    """A broken "device": aten.mul.Tensor in float32 comes out 1e-2 off. The CPU runs (fp64
    reference, same-dtype noise) happen outside dispatch modes, so only the device side is hit."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mul.Tensor and out.dtype == torch.float32:
            out = out + 1e-2
        return out


@pytest.fixture(autouse=True)
def wrong_mul():
    with WrongMul():
        yield
'''


@pytest.fixture(scope="module")
def perturbed(suite, tmp_path_factory):
    folder, _, _ = suite
    out = tmp_path_factory.mktemp("perturbed")
    broken = out / "pytests"
    shutil.copytree(folder, broken)
    conftest = broken / "conftest.py"  # appended: a suite's own conftest stays in force
    conftest.write_text((conftest.read_text() if conftest.exists() else "") + PERTURB_CONFTEST)
    csv = out / "broken.csv"
    res = run_pytest(broken, "--seed", "42", f"--detail_compare_path={csv}")
    return csv, res


@pytest.mark.slow
def test_wrong_device_result_fails_exactly_that_op(perturbed):
    csv, res = perturbed
    assert res.returncode == 1  # tests failed
    df = pd.read_csv(csv)
    expected = (df["op_name"] == "aten.mul.Tensor") & (df["dtype"] == "float32")
    assert expected.sum() >= 2
    assert list(df.loc[~df["is_pass"], "name"]) == list(df.loc[expected, "name"])
    assert (df.loc[expected, "max_abs_err"] > 5e-3).all()


@pytest.mark.slow
def test_xray_diff_side_by_side(suite, perturbed, tmp_path, capsys):
    _, good, _ = suite
    broken, _ = perturbed
    b = pd.read_csv(broken)
    dropped = b["name"].iloc[0]
    b = b.iloc[1:]
    b.to_csv(tmp_path / "b.csv", index=False)
    out = tmp_path / "diff.csv"
    assert diff_main([str(good), str(tmp_path / "b.csv"), str(out)]) == 0
    text = capsys.readouterr().out
    assert "aten.mul.Tensor" in text and "b worse" in text
    d = pd.read_csv(out)
    assert d.loc[d["name"] == dropped, "present"].item() == "a only"
    mul = d[(d["op_name"] == "aten.mul.Tensor") & (d["dtype"] == "float32")]
    assert (mul["worse"] == "b").all() and len(mul) >= 2
    assert (mul["b_is_pass"] == False).all()  # noqa: E712


def test_xray_diff_rejects_foreign_csv(tmp_path, capsys):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    assert diff_main([str(tmp_path / "x.csv"), str(tmp_path / "x.csv"), str(tmp_path / "o.csv")]) == 2
    assert "missing columns" in capsys.readouterr().err


@pytest.mark.slow
def test_factory_load_needs_saved_tensors_random_does_not(dumps, tmp_path, capsys):
    dedup = dumps[2]  # recorded with X_DUMP_NUM=0: no tensor saved
    assert gen_main([str(dedup), "-o", str(tmp_path / "a"), "--factory", "load", "-q"]) == 2
    err = capsys.readouterr().err
    assert "--factory random" in err and "xray-gen: error" in err
    folder = tmp_path / "r"
    assert gen_main([str(dedup), "-o", str(folder), "--factory", "random", "--cpu-init", "-q"]) == 0
    assert "data=" not in "".join(f.read_text() for f in folder.glob("test_*.py"))
    csv = tmp_path / "r.csv"
    res = run_pytest(folder, f"--detail_compare_path={csv}")
    assert res.returncode == 0, res.stdout[-3000:]
    assert pd.read_csv(csv)["is_pass"].all()


def test_no_blacklist_generates_view_ops_too(dumps, tmp_path):
    folder = tmp_path / "all"
    assert gen_main([str(dumps[1]), "-o", str(folder), "--factory", "random", "--no-blacklist", "-q"]) == 0
    assert (folder / "test_aten_view_default.py").exists()
    assert not (tmp_path / "bl").exists()
    custom = tmp_path / "bl.txt"
    custom.write_text("# only skip mm\naten.mm.*\n")
    folder2 = tmp_path / "custom"
    assert gen_main([str(dumps[1]), "-o", str(folder2), "--factory", "random", "--blacklist", str(custom), "-q"]) == 0
    assert not (folder2 / "test_aten_mm_default.py").exists() and (folder2 / "test_aten_view_default.py").exists()


@pytest.mark.slow
def test_every_kind_of_call_renders_and_passes(tmp_path):
    """plain, in-place, out=, tensor-list and multi-output templates, on fp32 and bf16 inputs."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    with xray.dump(dump_dir=tmp_path / "d", X_DUMP_NUM=8) as d:
        torch.exp(x)
        x.clone().add_(y)
        torch.add(x, y, out=torch.empty(8, 16))
        torch.cat([x, y.bfloat16().float()], dim=1)
        torch.max(x, dim=1)
        torch.softmax(x.bfloat16(), dim=-1)
    folder = tmp_path / "pytests"
    assert gen_main([str(d.folder), "-o", str(folder), "-q"]) == 0
    text = {f.name: f.read_text() for f in folder.glob("test_*.py")}
    assert "compare_mutated=True" in text["test_aten_add__Tensor.py"]
    assert "out=out" in text["test_aten_add_out.py"] and "# out=" in text["test_aten_add_out.py"]
    assert "tensors = [" in text["test_aten_cat_default.py"]
    assert "Returns (values, indices)" in text["test_aten_max_dim.py"]
    csv = tmp_path / "r.csv"
    res = run_pytest(folder, f"--detail_compare_path={csv}")
    assert res.returncode == 0, res.stdout[-3000:]
    df = pd.read_csv(csv)
    assert df["is_pass"].all() and {"bfloat16", "float32", "float32,int64"} <= set(df["dtype"])
