"""Hostile and broken dump.json files: xray-gen rejects them clearly or renders them inertly."""
from __future__ import annotations

import ast
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xray
from xray.dump.json_index import rewrite_as_json
from xray.gen.cli import main as gen_main
from xray.gen.render import RenderError, audit, py_float, py_str

ENV = dict(os.environ, TRANSFORMERS_VERBOSITY="error")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    """A real dump (a few ops with saved tensors) as a JSON dict to tamper with."""
    root = tmp_path_factory.mktemp("base")
    x = torch.randn(4, 8)
    with xray.dump(dump_dir=root, X_DUMP_NUM=4) as d:
        y = torch.nn.functional.gelu(x @ x.T)
        torch.div(y, 3.0, rounding_mode="floor")
    rewrite_as_json(d.folder)  # the JSON records of format version 2: what a hostile file edits
    data = json.loads((d.folder / "dump.json").read_text())
    data["_folder"] = str(d.folder)
    return data


def write_dump(tmp: Path, data: dict) -> Path:
    folder = tmp / "dump"
    folder.mkdir(parents=True, exist_ok=True)
    src = Path(data["_folder"])
    for h5 in src.glob("*.h5"):
        (folder / h5.name).write_bytes(h5.read_bytes())
    body = {k: v for k, v in data.items() if k != "_folder"}
    (folder / "dump.json").write_text(json.dumps(body))
    return folder


def record(data: dict, op: str) -> dict:
    return next(r for r in data["records"] if r["op"] == op)


def generated_sources(folder: Path) -> list[str]:
    return [f.read_text() for f in folder.glob("test_*.py")] if folder.exists() else []


MARK = "XRAY_PWNED_MARKER"


def _payload(tmp: Path) -> str:
    return f'"); import os; os.system("touch {tmp / MARK}"); ("'


def check_rejected(tmp: Path, data: dict, capsys, expect: str) -> None:
    """A hostile record is refused: either the whole run in one line, or (issue 30: a record the
    validator refuses never takes the rest of the dump with it) that record alone, named in a
    RefusedRecordsWarning, with nothing of it in the generated code."""
    import warnings

    folder = write_dump(tmp, data)
    out = tmp / "pytests"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        rc = gen_main([str(folder), "-o", str(out), "-q"])
    err = capsys.readouterr().err.strip()
    if rc == 2:
        assert err.startswith("xray-gen: error:") and expect in err and len(err.splitlines()) == 1, err
        assert not generated_sources(out)
    else:
        assert rc == 0, err
        refused = [str(w.message) for w in said if type(w.message).__name__ == "RefusedRecordsWarning"]
        refused += [line for line in err.splitlines() if "refused" in line]  # the console's warning line
        assert refused and any(expect in m for m in refused), (refused, err)
        code = "\n".join(generated_sources(out))
        for payload in ("__import__", "import os", "torch.load", "8); "):
            assert payload not in code
    assert not (tmp / MARK).exists()


def test_op_name_injection_is_rejected(base, tmp_path, capsys):
    data = copy.deepcopy(base)
    record(data, "aten.mm.default")["op"] = "aten.mm.default" + _payload(tmp_path)
    check_rejected(tmp_path, data, capsys, "invalid op name")


def test_dunder_op_name_is_rejected(base, tmp_path, capsys):
    data = copy.deepcopy(base)
    record(data, "aten.mm.default")["op"] = "aten.mm.__class__"
    check_rejected(tmp_path, data, capsys, "invalid op name")


def test_unknown_op_is_rejected(base, tmp_path, capsys):
    data = copy.deepcopy(base)
    record(data, "aten.mm.default")["op"] = "aten.no_such_op.default"
    check_rejected(tmp_path, data, capsys, "unknown op 'aten.no_such_op.default'")


def test_dtype_injection_is_rejected(base, tmp_path, capsys):
    data = copy.deepcopy(base)
    record(data, "aten.mm.default")["inputs"]["self"]["dtype"] = "__import__('os').system('touch x')"
    check_rejected(tmp_path, data, capsys, "dtype")


def test_dtype_attribute_that_is_not_a_dtype_is_rejected(base, tmp_path, capsys):
    data = copy.deepcopy(base)
    record(data, "aten.mm.default")["inputs"]["self"]["dtype"] = "load"  # torch.load exists
    check_rejected(tmp_path, data, capsys, "dtype")


def test_shape_with_strings_is_rejected(base, tmp_path, capsys):
    data = copy.deepcopy(base)
    record(data, "aten.mm.default")["inputs"]["self"]["shape"] = [4, "8); import os; (1"]
    check_rejected(tmp_path, data, capsys, "malformed")


def test_nested_dicts_are_rejected(base, tmp_path, capsys):
    for where in ("untagged", "dtype_value", "stats"):
        data = copy.deepcopy(base)
        rec = record(data, "aten.div.Tensor_mode")
        if where == "untagged":
            rec["inputs"]["other"] = {"__class__": {"evil": 1}}
        elif where == "dtype_value":
            rec["inputs"]["other"] = {"t": "dtype", "v": {"__reduce__": "os.system"}}
        else:
            rec["inputs"]["self"]["stats"]["min"] = {"x": 1}
        sub = tmp_path / where
        check_rejected(sub, data, capsys, "")


def test_huge_shape_is_rejected(base, tmp_path, capsys):
    data = copy.deepcopy(base)
    rec = record(data, "aten.mm.default")
    rec["inputs"]["self"]["shape"] = [2**20, 2**20]
    rec["inputs"]["self"].pop("data", None)
    check_rejected(tmp_path, data, capsys, "huge shape")


@pytest.mark.slow
def test_hostile_strings_render_inertly(base, tmp_path, capsys):
    """Quotes, newlines and triple quotes in a str argument and in the module path (docstring)."""
    data = copy.deepcopy(base)
    touch = f"import os; os.system('touch {tmp_path / MARK}')"
    rec = record(data, "aten.div.Tensor_mode")
    rec["inputs"]["rounding_mode"] = f'floor"""\n{touch}\n"""\' + "\\\n{touch}#'
    rec["module"] = f'"""\n{touch}\n"""'
    for r in data["records"]:
        r["module"] = f"x'''\n{touch}\n'''\r\n\x00"
    folder = write_dump(tmp_path, data)
    out = tmp_path / "pytests"
    assert gen_main([str(folder), "-o", str(out), "-q"]) == 0
    sources = generated_sources(out)
    assert sources
    for src in sources:
        tree = ast.parse(src)
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert all(c in ("T", "float", "complex") or c.startswith("xray_op.") for c in calls), calls
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import) and n.names[0].name == "os"]
    # the strings arrive at the op verbatim (so it rejects the bogus rounding mode), nothing executes
    res = subprocess.run([sys.executable, "-m", "pytest", str(out), "-q", "-p", "no:cacheprovider"], cwd=tmp_path,
                         env=ENV, capture_output=True, text=True, timeout=300)
    assert not (tmp_path / MARK).exists()
    assert "1 failed" in res.stdout and "rounding_mode" in res.stdout, res.stdout[-2000:]


def test_corrupt_and_future_dumps_fail_cleanly(base, tmp_path, capsys):
    folder = write_dump(tmp_path / "corrupt", base)
    (folder / "dump.json").write_text('{"format": "xray-trace", "records": [')
    assert gen_main([str(folder), "-o", str(tmp_path / "o1"), "-q"]) == 2
    assert "corrupt" in capsys.readouterr().err
    data = copy.deepcopy(base)
    data["format_version"] = 99
    folder = write_dump(tmp_path / "future", data)
    assert gen_main([str(folder), "-o", str(tmp_path / "o2"), "-q"]) == 2
    assert "upgrade xray" in capsys.readouterr().err


def test_missing_tensor_file_with_factory_load(base, tmp_path, capsys):
    folder = write_dump(tmp_path, base)
    for h5 in folder.glob("*.h5"):
        h5.unlink()
    assert gen_main([str(folder), "-o", str(tmp_path / "o"), "--factory", "load", "-q"]) == 2
    assert "use --factory random" in capsys.readouterr().err
    assert gen_main([str(folder), "-o", str(tmp_path / "o"), "--factory", "random", "-q"]) == 0


def test_render_literals_roundtrip():
    for s in ['a"b', "a'b", '"""', "'''", "x\ny\r\0", "\\", "é\u2028"]:
        assert ast.literal_eval(py_str(s)) == s
    assert py_float(float("inf")) == "float('inf')" and py_float(1e-7) == "1e-07"
    with pytest.raises(RenderError):
        py_str(3)
    with pytest.raises(RenderError):
        py_float(True)


def test_audit_rejects_foreign_code():
    audit("import torch\nx = T((1,), torch.float32)\n", "ok.py")
    for bad in ("import os\n", "from subprocess import run\n", "__import__('os')\n", "torch.load('x')\n",
                "open('x')\n", "(lambda: 1)\n"):
        with pytest.raises(RenderError):
            audit(bad, "bad.py")


# -- ops and HDF5 objects that could reach the file system (issue 18, items 1-2) ----------------------

def _from_file_dump(base: dict, target: Path) -> dict:
    """The base dump with its mm turned into aten.from_file(target, shared=True, size=64)."""
    data = copy.deepcopy(base)
    rec = record(data, "aten.mm.default")
    rec["op"] = "aten.from_file.default"
    rec["inputs"] = {"filename": str(target), "shared": True, "size": 64}
    rec["outputs"] = [{"t": "tensor", "shape": [64], "dtype": "float32", "device": "cpu"}]
    return data


def test_file_touching_op_is_refused_by_gen(base, tmp_path, capsys):
    target = tmp_path / "created_by_dump"
    check_rejected(tmp_path, _from_file_dump(base, target), capsys, "refused op 'aten.from_file.default'")
    assert not target.exists()


@pytest.mark.slow
def test_file_touching_op_is_refused_by_replay(base, tmp_path):
    target = tmp_path / "created_by_dump"
    folder = write_dump(tmp_path, _from_file_dump(base, target))
    res = subprocess.run([sys.executable, "-m", "xray.replay.cli", str(folder), "-o", str(tmp_path / "replay"),
                          "-b", "torch-cpu", "-q"], env=ENV, capture_output=True, text=True, timeout=300)
    assert not target.exists(), res.stdout + res.stderr
    assert "refused op 'aten.from_file.default'" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr


def test_schema_rule_refuses_without_a_list():
    from xray.ops.rebuild import UnsafeOpError, resolve_op
    from xray.ops.safety import refusal
    for name in ("aten.from_file.default", "aten.set_.source_Storage", "profiler._record_function_enter.default"):
        with pytest.raises(UnsafeOpError):
            resolve_op(name)
    # the schema rule, on an op no list names: a custom op with a path argument
    lib = torch.library.Library("xray_test_fs", "DEF")
    lib.define("write_to(Tensor x, str out_path) -> Tensor")
    assert "out_path" in refusal(torch.ops.xray_test_fs.write_to.default)
    assert refusal(torch.ops.aten.div.Tensor_mode) is None  # a string argument that is not a path


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np_bytes := bytes(range(256)) * 4)
    assert len(np_bytes) == 1024
    return secret


def _redirect(folder: Path, how: str, secret: Path) -> None:
    """Replace the first saved tensor of the dump by an HDF5 object whose bytes live elsewhere."""
    import h5py
    import numpy as np
    seg = sorted(folder.glob("tensors-*.h5"))[0]
    with h5py.File(seg, "a") as f:
        name = "r0/in.self"
        shape, attrs = f[name].shape, dict(f[name].attrs)
        del f[name]
        if how == "external_storage":
            ds = f.create_dataset(name, shape=shape, dtype="float32", external=[(str(secret), 0, 4 * int(np.prod(shape)))])
        elif how == "external_link":
            other = folder / "other.h5"
            with h5py.File(other, "w") as g:
                g.create_dataset("x", data=np.zeros(shape, np.float32))
            f[name] = h5py.ExternalLink(str(other), "x")
            return
        elif how == "soft_link":
            f[name] = h5py.SoftLink("/r0/out0")
            return
        else:  # virtual dataset mapped from another file
            other = folder / "other.h5"
            with h5py.File(other, "w") as g:
                g.create_dataset("x", data=np.zeros(shape, np.float32))
            layout = h5py.VirtualLayout(shape=shape, dtype="float32")
            layout[...] = h5py.VirtualSource(str(other), "x", shape=shape)
            ds = f.create_virtual_dataset(name, layout)
        for k, v in attrs.items():
            ds.attrs[k] = v


@pytest.mark.parametrize("how", ["external_storage", "external_link", "soft_link", "virtual"])
def test_hdf5_escape_hatches_are_refused(base, tmp_path, capsys, how):
    from xray.dump.tensorio import UnsafeDatasetError
    secret = _secret(tmp_path)
    folder = write_dump(tmp_path, base)
    _redirect(folder, how, secret)
    dump = xray.load_dump(folder)
    meta = next(m for r in dump.records for n, m in r.input_tensors() if m.data and m.data.endswith("r0/in.self"))
    with pytest.raises(UnsafeDatasetError, match="refused"):
        dump.load_tensor(meta)
    out = tmp_path / "pytests"
    gen_main([str(folder), "-o", str(out), "--factory", "load", "-q"])
    capsys.readouterr()
    for h5 in out.rglob("*.h5"):  # whatever was generated holds none of the secret's bytes
        assert bytes(range(64, 128)) not in h5.read_bytes()
