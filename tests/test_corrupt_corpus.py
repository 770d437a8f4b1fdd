"""Every CLI on every corruption of a real trace dump: a right answer, or one line and a non-zero exit.

Issue 18's rule, for `xray info`, `xray-summary`, `xray-compare` (the corrupt dump on each side),
`xray-gen` and `xray-replay`: exit 0 only when the answer is right; otherwise one line on stderr
naming the file and what is wrong, and a non-zero exit; never a traceback. The module-dump
corpus is tests/test_module_hardening.py; the record-field corpus tests/test_corrupt_dumps.py.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import traceback
import warnings
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest
import torch

import xray
from xray.dump.columns import OUTPUT, RECORD_DTYPE, TENSOR_DTYPE, StringTable
from xray.dump.index_file import IndexFile, write_file
from xray.dump.csv_cells import risky
from xray.dump.json_index import rewrite_as_json

DEEP = "[" * 5000 + "]" * 5000
# a module name that sets the terminal's title, clears the screen and turns the text right to left
ESCAPES = "evil\x1b]0;PWNED\x07\x1b[2J\u202eabc\u2066"
RAW_ESCAPES = re.compile("[\x1b\x07\u202a-\u202e\u2066-\u2069]")


def _record_mlp(root: Path) -> Path:
    """A real recording: a small MLP's forward with every tensor saved."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with torch.no_grad(), xray.dump(dump_dir=root, X_DEDUP=False, X_DUMP_NUM=100) as d:
        model(torch.randn(3, 8)).softmax(-1)
    return d.folder


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """The recording with its index as version-2 JSON records: what the JSON corruptions edit."""
    folder = _record_mlp(tmp_path_factory.mktemp("good"))
    rewrite_as_json(folder)
    return folder


@pytest.fixture(scope="module")
def good_v3(tmp_path_factory) -> Path:
    """The recording as written today: a columnar index (format version 3)."""
    return _record_mlp(tmp_path_factory.mktemp("good3"))


def _index(folder: Path) -> dict:
    return json.loads((folder / "dump.json").read_text())


def _write_index(folder: Path, data) -> None:
    (folder / "dump.json").write_text(data if isinstance(data, str) else json.dumps(data))


def _segments(folder: Path) -> list[Path]:
    return sorted(folder.glob("tensors-*.h5"))


def _each_segment(fn: Callable[[Path], None]) -> Callable[[Path], None]:
    """Damage every segment, so no tool's answer can avoid the damaged data."""
    return lambda folder: [fn(seg) for seg in _segments(folder)]


def _saved(folder: Path) -> list[tuple[str, str]]:
    """(segment file name, dataset path) of every saved tensor the index references."""
    refs = []
    for rec in _index(folder)["records"]:
        for v in [*rec["inputs"].values(), *rec["outputs"]]:
            if isinstance(v, dict) and v.get("data") and v["data"] not in refs:
                refs.append(v["data"])
    assert refs, "no saved tensor"
    return [tuple(r.split(":", 1)) for r in refs]


def _edit_dataset(folder: Path, edit: Callable[[h5py.File, str, np.ndarray, dict], None]) -> None:
    """Apply ``edit`` to every saved tensor (each is deleted first and handed over)."""
    for fname, path in _saved(folder):
        with h5py.File(folder / fname, "r+") as f:
            data, attrs = f[path][()], dict(f[path].attrs)
            del f[path]
            edit(f, path, data, attrs)


def _index_edit(fn: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        data = _index(folder)
        out = fn(data)
        _write_index(folder, data if out is None else out)
    return apply


def _rec(i: int = 0) -> Callable[[dict], dict]:
    return lambda d: d["records"][i]


def _set_attr(name, value):
    def edit(f, path, data, attrs):
        ds = f.create_dataset(path, data=data)
        ds.attrs.update(attrs)
        ds.attrs[name] = value
    return edit


def _replace(make):
    def edit(f, path, data, attrs):
        ds = make(f, path, data)
        if isinstance(ds, h5py.Dataset):
            ds.attrs.update(attrs)
    return edit


def _other_file(folder: Path, data: np.ndarray) -> str:
    other = folder / "other.h5"
    with h5py.File(other, "w") as g:
        g.create_dataset("x", data=data)
    return str(other)


def _virtual(f, path, data):
    other = _other_file(Path(f.filename).parent, data)
    layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
    layout[...] = h5py.VirtualSource(other, "x", shape=data.shape)
    return f.create_virtual_dataset(path, layout)


def _symlink_out(seg: Path) -> None:
    """The segment moved out of the dump, with other values, and a symlink left in its place."""
    outside = seg.parent.parent / f"outside-{seg.name}"
    with h5py.File(seg, "r+") as f:
        f.visititems(lambda n, o: o.__setitem__(..., np.full(o.shape, 7, o.dtype))
                     if isinstance(o, h5py.Dataset) and o.size else None)
    shutil.move(seg, outside)
    seg.symlink_to(outside)


def _gzip_chunk(f, path, data):
    """The values as one gzip chunk that declares 2^22 elements (a bomb in small: 16 MiB inflated
    to read a few dozen values)."""
    return f.create_dataset(path, data=data.reshape(-1), maxshape=(None,), chunks=(1 << 22,), compression="gzip")


def _truncate(fraction: float) -> Callable[[Path], None]:
    def apply(seg: Path) -> None:
        raw = seg.read_bytes()
        seg.write_bytes(raw[: int(len(raw) * fraction)])
    return _each_segment(apply)


def _segment_dir(seg: Path) -> None:
    seg.unlink()
    seg.mkdir()


def _journal_only(lines: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        data = _index(folder)
        header = {k: v for k, v in data.items() if k not in ("records", "summary", "complete")}
        body = [json.dumps({"header": header})] + [json.dumps(r) for r in data["records"]]
        (folder / "dump.json").unlink()
        (folder / "journal.jsonl").write_text("\n".join(lines(body)) + "\n")
    return apply


def _dir_index(folder: Path) -> None:
    (folder / "dump.json").unlink()
    (folder / "dump.json").mkdir()


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    # the index file itself
    "index empty": lambda f: _write_index(f, ""),
    "index not json": lambda f: _write_index(f, "{not json"),
    "index cut in half": lambda f: _write_index(f, (f / "dump.json").read_text()[: len((f / "dump.json").read_text()) // 2]),
    "index a list": lambda f: _write_index(f, "[1, 2]"),
    "index a number": lambda f: _write_index(f, "7"),
    "index a string": lambda f: _write_index(f, '"dump"'),
    "index nested 5000 deep": lambda f: _write_index(f, DEEP),
    "index binary garbage": lambda f: (f / "dump.json").write_bytes(bytes(range(256)) * 8),
    "index is a directory": _dir_index,
    "no records key": _index_edit(lambda d: d.pop("records")),
    "records an object": _index_edit(lambda d: d.update(records={"a": 1})),
    "records null": _index_edit(lambda d: d.update(records=None)),
    "wrong format name": _index_edit(lambda d: d.update(format="something-else")),
    "future format version": _index_edit(lambda d: d.update(format_version=99)),
    "format version a string": _index_edit(lambda d: d.update(format_version="2")),
    "header config a list": _index_edit(lambda d: d.update(config=[1, 2])),
    # records
    "record a list": _index_edit(lambda d: d["records"].__setitem__(0, [1])),
    "record null": _index_edit(lambda d: d["records"].__setitem__(0, None)),
    "record without seq": _index_edit(lambda d: _rec()(d).pop("seq")),
    "record seq negative": _index_edit(lambda d: _rec()(d).update(seq=-5)),
    "record seq a float": _index_edit(lambda d: _rec()(d).update(seq=1.5)),
    "record kind unknown": _index_edit(lambda d: _rec()(d).update(kind="evil")),
    "record op an int": _index_edit(lambda d: _rec()(d).update(op=5)),
    "record op 50 MB": _index_edit(lambda d: _rec()(d).update(op="aten." + "x" * 50_000_000 + ".default")),
    "record op not an operator": _index_edit(lambda d: _rec()(d).update(op="os.system.default")),
    "record op file-touching": _index_edit(lambda d: _rec()(d).update(op="aten.from_file.default")),
    "record module an int": _index_edit(lambda d: _rec()(d).update(module=3)),
    "record module_stack garbage": _index_edit(lambda d: _rec()(d).update(module_stack="abc")),
    "record inputs a list": _index_edit(lambda d: _rec()(d).update(inputs=[1])),
    "record outputs an object": _index_edit(lambda d: _rec()(d).update(outputs={"x": 1})),
    "record count zero": _index_edit(lambda d: _rec()(d).update(count=0)),
    "record stack not strings": _index_edit(lambda d: _rec()(d).update(stack=[1, 2])),
    "record mutates an int": _index_edit(lambda d: _rec()(d).update(mutates=4)),
    "record unknown value tag": _index_edit(lambda d: _rec()(d)["inputs"].update(extra={"t": "pickle", "v": "x"})),
    "tensor shape a string": _index_edit(lambda d: _rec()(d)["outputs"][0].update(shape="3,4")),
    "tensor shape negative": _index_edit(lambda d: _rec()(d)["outputs"][0].update(shape=[-1, 4])),
    "tensor shape huge": _index_edit(lambda d: _rec()(d)["outputs"][0].update(shape=[2**40, 2**40])),
    "tensor shape 100 dims": _index_edit(lambda d: _rec()(d)["outputs"][0].update(shape=[1] * 100)),
    "tensor dtype unknown": _index_edit(lambda d: _rec()(d)["outputs"][0].update(dtype="float99")),
    "tensor dtype an attribute": _index_edit(lambda d: _rec()(d)["outputs"][0].update(dtype="nn")),
    "tensor stats a list": _index_edit(lambda d: _rec()(d)["outputs"][0].update(stats=[1])),
    "tensor stats min a dict": _index_edit(lambda d: _rec()(d)["outputs"][0]["stats"].update(min={"a": 1})),
    "tensor stats min text": _index_edit(lambda d: _rec()(d)["outputs"][0]["stats"].update(min="big")),
    "tensor data an int": _index_edit(lambda d: _rec()(d)["outputs"][0].update(data=5)),
    "tensor data missing file": _index_edit(lambda d: _rec()(d)["outputs"][0].update(data="tensors-nope.h5:r0/x")),
    "tensor data missing dataset": _index_edit(lambda d: _rec()(d)["outputs"][0].update(
        data=_rec()(d)["outputs"][0]["data"].split(":")[0] + ":nope/x")),
    "tensor data path traversal": _index_edit(lambda d: _rec()(d)["outputs"][0].update(data="../../../etc/passwd:x")),
    "tensor data absolute path": _index_edit(lambda d: _rec()(d)["outputs"][0].update(data="/etc/passwd:x")),
    "tensor data the HDF5 root": _index_edit(lambda d: [o.update(data=o["data"].split(":")[0] + ":/")
                                                        for r in d["records"] for o in r["outputs"]
                                                        if isinstance(o, dict) and o.get("data")]),
    "tensor source garbage": _index_edit(lambda d: _rec()(d)["outputs"][0].update(src={"a": 1})),
    "records nested 5000 deep": _index_edit(lambda d: json.dumps(_rec()(d)["inputs"].update(deep="@DEEP@") or d).replace('"@DEEP@"', DEEP)),
    # the tensor segments
    "segment deleted": _each_segment(lambda seg: seg.unlink()),
    "segment empty": _each_segment(lambda seg: seg.write_bytes(b"")),
    "segment cut in half": _truncate(0.5),
    "segment cut to 90%": _truncate(0.9),
    "segment random bytes": _each_segment(lambda seg: seg.write_bytes(np.random.default_rng(0).bytes(4096))),
    "segment is a directory": _each_segment(_segment_dir),
    "segment a symlink out of the dump": _each_segment(lambda seg: _symlink_out(seg)),
    "segment a FIFO": _each_segment(lambda seg: (seg.unlink(), os.mkfifo(seg))),
    "dataset replaced by a group": lambda f: _edit_dataset(f, lambda h, p, d, a: h.create_group(p)),
    "dataset dtype attribute wider than data": lambda f: _edit_dataset(f, _set_attr("torch_dtype", "float64")),
    "dataset dtype attribute unknown": lambda f: _edit_dataset(f, _set_attr("torch_dtype", "os.system")),
    "dataset shorter than its record": lambda f: _edit_dataset(f, _replace(lambda h, p, d: h.create_dataset(p, data=d.reshape(-1)[:1]))),
    "dataset empty": lambda f: _edit_dataset(f, _replace(lambda h, p, d: h.create_dataset(p, data=d.reshape(-1)[:0]))),
    "dataset of strings": lambda f: _edit_dataset(f, _replace(lambda h, p, d: h.create_dataset(p, data=np.array([b"x"] * d.size)))),
    "dataset compound": lambda f: _edit_dataset(f, _replace(lambda h, p, d: h.create_dataset(p, data=np.zeros(d.size, dtype=[("a", "f4"), ("b", "i4")])))),
    "dataset external storage": lambda f: _edit_dataset(f, _replace(lambda h, p, d: h.create_dataset(
        p, shape=d.shape, dtype=d.dtype, external=[("/etc/hostname", 0, d.nbytes)]))),
    "dataset external link": lambda f: _edit_dataset(f, lambda h, p, d, a: h.__setitem__(p, h5py.ExternalLink(_other_file(Path(h.filename).parent, d), "x"))),
    "dataset soft link": lambda f: _edit_dataset(f, lambda h, p, d, a: h.__setitem__(p, h5py.SoftLink("/nowhere"))),
    "dataset virtual": lambda f: _edit_dataset(f, _replace(_virtual)),
    "dataset gzip chunk larger than the dataset": lambda f: _edit_dataset(f, _replace(_gzip_chunk)),
    # the journal (no dump.json)
    "journal header not an object": _journal_only(lambda ls: ["[1]"] + ls[1:]),
    "journal header future version": _journal_only(lambda ls: [ls[0].replace('"format_version": 2', '"format_version": 99')] + ls[1:]),
    "journal only a header": _journal_only(lambda ls: ls[:1]),
    "journal lines not objects": _journal_only(lambda ls: ls[:2] + ["7", "[1]"] + ls[2:]),
    "journal empty": _journal_only(lambda ls: []),
    # issue 44: hostile numbers and names
    "format version 5001 digits": lambda f: _write_index(f, re.sub(r'"format_version": ?2', '"format_version":' + "9" * 5001,
                                                                 (f / "dump.json").read_text())),
    "tensor shape 10**400": lambda f: _big_number(f, lambda d: _rec()(d)["outputs"][0].update(shape="@BIG@")),
    "tensor stats max 10**400": lambda f: _big_number(f, lambda d: _rec()(d)["outputs"][0]["stats"].update(max="@BIG@")),
    "record module with terminal escapes": _index_edit(lambda d: [(r.update(module=ESCAPES), r["module_stack"][-1].__setitem__(0, ESCAPES))
                                                              for r in d["records"] if r.get("module_stack")] and None),
}


# -- format version 3: the columnar index and its journal chunks --------------------------------


def _index_file(folder: Path) -> Path:
    return folder / _index(folder)["index"]


def _tables_edit(edit: Callable[[np.ndarray, np.ndarray, list[str]], None]) -> Callable[[Path], None]:
    """Rewrite the index file with ``edit(records, tensors, strings)`` applied (in place)."""
    def apply(folder: Path) -> None:
        path = _index_file(folder)
        f = IndexFile(path)
        records, tensors = f.table("records", RECORD_DTYPE), f.table("tensors", TENSOR_DTYPE)
        strings = f.strings().texts()
        f.close()
        edit(records, tensors, strings)
        blob, ends = StringTable(strings).to_arrays()
        write_file(path, records, tensors, blob, ends, {"records": len(records)})
    return apply


def _set(table: str, column: str, value, row: int = 0):
    def edit(records, tensors, strings):
        (records if table == "records" else tensors)[column][row] = value
    return _tables_edit(edit)


def _string_of(table: str, column: str, text: str, row: int = 0):
    """Point a text column at a new string."""
    def edit(records, tensors, strings):
        strings.append(text)
        (records if table == "records" else tensors)[column][row] = len(strings) - 1
    return _tables_edit(edit)


def _big_number(folder: Path, mark: Callable[[dict], object]) -> None:
    """``mark`` puts "@BIG@" where a 401-digit integer goes (json.dumps cannot write one)."""
    data = _index(folder)
    mark(data)
    _write_index(folder, json.dumps(data).replace('"@BIG@"', "1" + "0" * 400))


def _escape_names(records, tensors, strings) -> None:
    for i in range(len(records)):
        strings.append(f"{ESCAPES}.{i}")
        records["module"][i] = len(strings) - 1


def _first_output(records, tensors) -> int:
    return int(np.flatnonzero(tensors["role"] == 1)[0])


def _output_string(column: str, text: str):
    def edit(records, tensors, strings):
        strings.append(text)
        tensors[column][_first_output(records, tensors)] = len(strings) - 1
    return _tables_edit(edit)


def _h5_replace(name: str, make: Callable[[h5py.File], None]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        with h5py.File(_index_file(folder), "r+") as f:
            del f[name]
            make(f)
    return apply


def _h5_edit(name: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    """Rewrite one dataset of the index file with ``change`` applied to its values."""
    def apply(folder: Path) -> None:
        with h5py.File(_index_file(folder), "r+") as f:
            values = change(f[name][...])
            del f[name]
            f.create_dataset(name, data=values)
    return apply


def _header_edit(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        data = _index(folder)
        fn(data)
        _write_index(folder, data)
    return apply


def _killed(keep: Callable[[list[Path]], None] | None = None) -> Callable[[Path], None]:
    """The dump as a killed process leaves it: header line and journal chunks, no index;
    ``keep`` damages the chunks."""
    def apply(folder: Path) -> None:
        shutil.rmtree(folder)
        shutil.copytree(_killed_source(), folder)
        if keep is not None:
            keep(sorted(folder.glob("journal-*.h5")))
    return apply


_KILLED: list[Path] = []


KILLED_SCRIPT = """
import os, signal, sys, torch, xray
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
xray.begin_dump(dump_dir=sys.argv[1], X_DEDUP=False, X_DUMP_NUM=100, flush_records=1)
with torch.no_grad():
    model(torch.randn(3, 8)).softmax(-1)
    torch.ones(2) + 1  # flushes the softmax's record too
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_source() -> Path:
    """The MLP's recording as a SIGKILLed process leaves it: a journal chunk per record, no index."""
    if not _KILLED:
        import subprocess
        import sys
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="xray-killed-"))
        proc = subprocess.run([sys.executable, "-c", KILLED_SCRIPT, str(root)], capture_output=True)
        assert proc.returncode == -9, proc.stderr.decode()[-2000:]
        (folder,) = list(root.iterdir())
        assert len(list(folder.glob("journal-*.h5"))) >= 3
        _KILLED.append(folder)
    return _KILLED[0]


def _data_to_root(records, tensors, strings) -> None:
    """Every saved tensor's reference names its segment's root group (``segment.h5:/``)."""
    for i in np.flatnonzero(tensors["data"] >= 0):
        strings.append(strings[tensors["data"][i]].split(":")[0] + ":/")
        tensors["data"][i] = len(strings) - 1


def _huge_statistics(records, tensors, strings) -> None:
    """Valid float64 statistics near 1e200 (min/max/mean/std): squaring them overflows."""
    for col, v in (("min", -1.5e200), ("max", 1.7e200), ("mean", 1.2e200), ("std", 1e200)):
        tensors[col][:] = v


def _formula_names(records, tensors, strings) -> None:
    """Modules named like live spreadsheet formulas: they must reach every CSV as text."""
    names = ["=HYPERLINK(\"http://example/x\",\"open\")", "=cmd|' /C calc'!A0", "+1+2", "-2+3", "@SUM(A1)"]
    for i in range(len(records)):
        strings.append(names[i % len(names)])
        records["module"][i] = len(strings) - 1


def _edit_v3_datasets(folder: Path, make) -> None:
    dump = xray.load_dump(folder)
    refs = {m.data for r in dump.records for _, m in (*r.input_tensors(), *r.output_tensors()) if m.data}
    dump.close()
    for ref in refs:
        fname, path = ref.split(":", 1)
        with h5py.File(folder / fname, "r+") as f:
            data, attrs = f[path][()], dict(f[path].attrs)
            del f[path]
            make(f, path, data).attrs.update(attrs)


def _recompress(folder: Path, name: str) -> None:
    with h5py.File(_index_file(folder), "r+") as f:
        blob, rows = f[name][()], f[name].attrs["rows"]
        del f[name]
        f.create_dataset(name, data=blob, compression="gzip")
        f[name].attrs["rows"] = rows


CORRUPTIONS_V3: dict[str, Callable[[Path], None]] = {
    "v3 index file deleted": lambda f: _index_file(f).unlink(),
    "v3 index file empty": lambda f: _index_file(f).write_bytes(b""),
    "v3 index file cut in half": lambda f: _index_file(f).write_bytes(_index_file(f).read_bytes()[: _index_file(f).stat().st_size // 2]),
    "v3 index file random bytes": lambda f: _index_file(f).write_bytes(np.random.default_rng(0).bytes(4096)),
    "v3 index file a directory": lambda f: (_index_file(f).unlink(), _index_file(f).mkdir()),
    "v3 index name path traversal": _header_edit(lambda d: d.update(index="../../etc/passwd")),
    "v3 index name absolute": _header_edit(lambda d: d.update(index="/etc/passwd")),
    "v3 index name a number": _header_edit(lambda d: d.update(index=7)),
    "v3 records table missing": _h5_replace("records", lambda f: None),
    "v3 records table wrong columns": _h5_replace("records", lambda f: f.create_dataset("records", data=np.zeros(3, dtype=[("seq", "<i8")]))),
    "v3 tensors table of strings": _h5_replace("tensors", lambda f: f.create_dataset("tensors", data=np.array([b"x"] * 4))),
    "v3 string offsets not ascending": _h5_edit("string_ends", lambda a: a[[0, 2, 1, *range(3, len(a))]]),
    "v3 string offsets past the blob": _h5_replace("string_ends", lambda f: f.create_dataset("string_ends", data=np.array([10**9], dtype="<i8"))),
    "v3 record op id out of range": _set("records", "op", 10**6),
    "v3 record kind unknown": _set("records", "kind", 7),
    "v3 record count zero": _set("records", "count", 0),
    "v3 record seq negative": _set("records", "seq", -5),
    "v3 record tensor rows overlap": _set("records", "t_end", 0),
    "v3 record op not an operator": _string_of("records", "op", "os.system.default"),
    "v3 record op file-touching": _string_of("records", "op", "aten.from_file.default"),
    "v3 record op 1 MB": _string_of("records", "op", "aten." + "x" * 1_000_000 + ".default"),
    "v3 record skeleton not json": _string_of("records", "skeleton", "{not json"),
    "v3 record skeleton nested 5000 deep": _string_of("records", "skeleton", '{"inputs":{"x":' + DEEP + '},"outputs":[]}'),
    "v3 record skeleton unknown tag": _string_of("records", "skeleton", '{"inputs":{"x":{"t":"pickle","v":"x"}},"outputs":[]}'),
    "v3 record module_stack garbage": _string_of("records", "module_stack", "abc"),
    "v3 tensor dtype unknown": _output_string("dtype", "float99"),
    "v3 tensor shape negative": _output_string("shape", "[-1,4]"),
    "v3 tensor shape huge": _output_string("shape", f"[{2**40},{2**40}]"),
    "v3 tensor shape a string": _output_string("shape", '"3,4"'),
    "v3 tensor data path traversal": _output_string("data", "../../../etc/passwd:x"),
    "v3 tensor data missing file": _output_string("data", "tensors-nope.h5:r0/x"),
    "v3 tensor role unknown": _set("tensors", "role", 9),
    "v3 tensor role not the skeleton's": _tables_edit(
        lambda records, tensors, strings: tensors["role"].__setitem__(int(np.argmin(tensors["role"])), OUTPUT)),
    "v3 tensor names another record": _set("tensors", "record", 5),
    "v3 journal without chunks": _killed(lambda chunks: [c.unlink() for c in chunks]),
    "v3 journal chunk cut in half": _killed(lambda chunks: chunks[1].write_bytes(chunks[1].read_bytes()[:500])),
    "v3 journal chunk missing": _killed(lambda chunks: chunks[1].unlink()),
    "v3 journal chunk random bytes": _killed(lambda chunks: chunks[0].write_bytes(np.random.default_rng(1).bytes(2048))),
    "v3 journal chunk updates a group": _killed(lambda chunks: _replace_with_group(chunks[1], "updates")),
    "v3 journal segments missing (tensors lag)": _killed(lambda chunks: [s.unlink() for s in
                                                                         chunks[0].parent.glob("tensors-*.h5")]),
    # issue 31: reads outside the dump, blow-ups, values a tool must survive
    "v3 segment a symlink out of the dump": lambda f: [_symlink_out(seg) for seg in _segments(f)],
    "v3 tensor data the HDF5 root": _tables_edit(_data_to_root),
    "v3 dataset gzip chunk larger than the dataset": lambda f: _edit_v3_datasets(f, _gzip_chunk),
    "v3 strings blob declares 4 GiB": _h5_replace("strings", lambda f: f.create_dataset("strings", shape=(4 << 30,),
                                                                                          dtype="u1")),
    "v3 string_ends declares 300M entries": _h5_replace("string_ends", lambda f: f.create_dataset(
        "string_ends", shape=(300_000_000,), dtype="<i8")),
    "v3 records table gzip-compressed": lambda f: _recompress(f, "records"),
    "v3 statistics near 1e200": _tables_edit(_huge_statistics),
    "v3 module names that are formulas": _tables_edit(_formula_names),
    # issue 44
    "v3 format version 5001 digits": lambda f: _write_index(
        f, re.sub(r'"format_version": ?3', '"format_version":' + "9" * 5001, (f / "dump.json").read_text())),
    "v3 module names with terminal escapes": _tables_edit(_escape_names),
}


def _replace_with_group(path: Path, name: str) -> None:
    import h5py

    with h5py.File(path, "a") as f:
        del f[name]
        f.create_group(name)


def _csv_cells(path: Path) -> list[str]:
    import csv

    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        return [c for row in csv.reader(f) for c in row]


def _call(main: Callable[[list[str]], int], argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    # warnings as a console shows them (pytest would swallow them): they are part of the answer
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - a traceback is exactly what this test forbids
            rc = "traceback\n" + traceback.format_exc()
    shown = "".join(f"{w.category.__name__}: {w.message}\n" for w in said)
    return rc, out.getvalue(), shown + err.getvalue()


def _tools(corrupt: Path, good: Path, out: Path) -> dict[str, tuple[Callable, list[str]]]:
    from xray.cli import main as xray_main
    from xray.compare.cli import main as compare_main
    from xray.gen.cli import main as gen_main
    from xray.replay.cli import main as replay_main
    from xray.summary.cli import main as summary_main

    return {
        "xray info": (xray_main, ["info", str(corrupt)]),
        "xray-summary": (summary_main, [str(corrupt)]),
        "xray-compare bench": (compare_main, [str(corrupt), str(good), str(out / "a.csv"), "--no-progress"]),
        "xray-compare target": (compare_main, [str(good), str(corrupt), str(out / "b.csv"), "--no-progress"]),
        "xray-gen": (gen_main, [str(corrupt), "-o", str(out / "gen"), "-q", "--factory", "load"]),
        "xray-replay": (replay_main, [str(corrupt), "-b", "torch-cpu", "-o", str(out / "replay"), "-q", "--factory", "load",
                                      "--repeats", "0", "--limit", "2"]),
    }


def _first_of_each_family(corpus: dict) -> list:
    """Each family's first case (its first word: record, tensor, journal...) runs in the fast set,
    the others are marked slow: a dump the loader accepts makes xray-replay start a worker process
    (seconds a case). .ci/run runs them all with -m slow."""
    seen: set[str] = set()
    params = []
    for case in sorted(corpus):
        family = case.removeprefix("v3 ").split()[0]
        params.append(pytest.param(case, marks=pytest.mark.slow) if family in seen else case)
        seen.add(family)
    return params


@pytest.mark.slow
@pytest.mark.parametrize("case", _first_of_each_family(CORRUPTIONS))
def test_every_tool_answers_right_or_fails_in_one_line(good, tmp_path, case):
    _check_every_tool(good, tmp_path, case, CORRUPTIONS[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", _first_of_each_family(CORRUPTIONS_V3))
def test_every_tool_answers_right_or_fails_in_one_line_v3(good_v3, tmp_path, case):
    _check_every_tool(good_v3, tmp_path, case, CORRUPTIONS_V3[case])


def _check_every_tool(good: Path, tmp_path: Path, case: str, corrupt_it: Callable[[Path], None]) -> None:
    corrupt = tmp_path / "dump"
    shutil.copytree(good, corrupt)
    corrupt_it(corrupt)
    problems = []
    for tool, (main, argv) in _tools(corrupt, good, tmp_path).items():
        rc, out, err = _call(main, argv)
        problems += [f"{tool}: {csv_path}: a cell a spreadsheet would evaluate: {c[:80]!r}"
                     for csv_path in tmp_path.rglob("*.csv") for c in _csv_cells(csv_path) if risky(c)][:1]
        problems += [f"{tool}: {csv_path}: a raw terminal escape or bidi control: {c[:80]!r}"
                     for csv_path in tmp_path.rglob("*.csv") for c in _csv_cells(csv_path) if RAW_ESCAPES.search(c)][:1]
        if RAW_ESCAPES.search(out + err):
            problems.append(f"{tool}: a raw terminal escape or bidi control in its output: "
                            f"{RAW_ESCAPES.search(out + err).group()!r}")
        # progress bars and warnings (a recovered journal) may precede the one error line
        lines = [ln for ln in err.strip().splitlines() if ln.strip() and "warning" not in ln.lower()
                 and "\r" not in ln and "test/s]" not in ln]
        if isinstance(rc, str):
            problems.append(f"{tool}: {rc[-1500:]}")
        elif "Traceback" in err:
            problems.append(f"{tool}: traceback on stderr: {err[-1500:]}")
        elif rc != 0 and len(lines) != 1:
            problems.append(f"{tool}: exit {rc} with {len(lines)} stderr lines: {err[-600:]}")
        elif rc != 0 and len(lines[0]) > 600:
            problems.append(f"{tool}: a {len(lines[0])}-character error line")
        elif rc != 0 and str(corrupt) not in lines[0]:
            problems.append(f"{tool}: the error does not name the damaged dump ({corrupt}): {lines[0]}")
        elif rc == 0 and not _right_answer(tool, case, out + err):
            problems.append(f"{tool}: exit 0 on a corrupt dump without saying so: {(out + err)[-600:]}")
    assert not problems, "\n".join(problems)


# Corruptions a tool may answer with exit 0, because its answer does not depend on the damaged
# part or says what it skipped: statistics survive a lost segment, a journal is a legal partial
# dump, and generating or replaying from statistics is what --factory auto would do anyway.
DATA_ONLY = ("segment", "dataset", "tensor data")


VIEWERS = ("xray info", "xray-summary", "xray-compare bench", "xray-compare target")


def _right_answer(tool: str, case: str, text: str) -> bool:
    case = case.removeprefix("v3 ")
    if "refused" in text and "the rest opened" in text:
        return True  # one record's damage refuses that record alone (issue 30): named, and the rest read
    if case.startswith(("statistics near 1e200", "module names that are formulas", "module names with terminal",
                        "record module with terminal")):
        return True  # legal values: the answer is the tool's usual one (its CSVs are checked for formulas)
    if case.startswith("journal segments missing"):
        return True  # a killed run whose tensors had not reached the disk: its records read, the data is absent
    if case.startswith(("journal chunk", "journal without chunks")):
        return True  # a legal partial dump: the loader recovers what the chunks before the damage hold, and warns
    if case.startswith("journal lines not objects"):
        return True  # a readable partial dump: the loader warns and counts the skipped lines
    if case.startswith("record op") and tool in VIEWERS:
        return True  # listing or comparing a record runs nothing: only gen and replay must refuse it
    if case.startswith("record op") and tool == "xray-replay":
        # the record is skipped, its op named with the reason, and the rest replayed
        return "1 record(s) skipped" in text and ("refused op" in text or "unknown op" in text)
    if case == "journal only a header" and tool in VIEWERS:
        return True  # a process killed before its first flush: an empty partial dump, said with a warning
    if case.startswith("tensor data") and tool in ("xray-gen", "xray-replay"):
        return True  # the damaged reference is a recorded output: tests and replays rebuild only inputs
    if case.startswith(DATA_ONLY) and tool in ("xray info", "xray-summary"):
        return True  # they show statistics, which live in the index
    if case.startswith(DATA_ONLY):
        return any(w in text.lower() for w in ("refused", "missing", "unreadable", "not saved", "could not",
                                                   "statistics", "skipped", "cannot", "failed"))
    return False


# -- msprobe dumps: the same rules (issue 44, items 9-12 and 14) ----------------------------------


def make_msprobe_dump(root: Path, scale: float = 1.0) -> Path:
    """A tensor-mode msprobe L1 dump as mindstudio-probe writes one (dump.json, construct.json,
    dump_tensor_data/*.pt from torch.save), of a linear and a gelu; made here, in a millisecond,
    as tests/test_msprobe.py checks the layout against the real package."""
    torch.manual_seed(0)
    folder = root / "step0" / "proc1"
    (folder / "dump_tensor_data").mkdir(parents=True)
    x, w = torch.randn(2, 8), torch.randn(8, 8)
    y = torch.nn.functional.linear(x, w) * scale
    calls = {"Functional.linear.0.forward": ([x, w], [y]),
             "Functional.gelu.0.forward": ([y], [torch.nn.functional.gelu(y)])}
    data = {}
    for key, (ins, outs) in calls.items():
        entry: dict = {"input_args": [], "input_kwargs": {}, "output": []}
        for role, field, tensors in (("input", "input_args", ins), ("output", "output", outs)):
            for i, t in enumerate(tensors):
                name = f"{key}.{role}.{i}.pt"
                torch.save(t.clone(), folder / "dump_tensor_data" / name)
                entry[field].append({"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape),
                                     "Max": float(t.max()), "Min": float(t.min()), "Mean": float(t.mean()),
                                     "Norm": float(t.norm()), "requires_grad": False, "data_name": name})
        data[key] = entry
    (folder / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch",
                                                  "dump_data_dir": None, "data": data}, indent=1))
    (folder / "construct.json").write_text(json.dumps({k: "Module.layers.0.Block.forward.0" for k in calls}))
    return folder


@pytest.fixture(scope="module")
def good_msprobe(tmp_path_factory) -> Path:
    return make_msprobe_dump(tmp_path_factory.mktemp("msprobe"))


def _pt_files(folder: Path) -> list[Path]:
    return sorted((folder / "dump_tensor_data").glob("*.pt"))


def _msprobe_json(edit: Callable[[dict], object], big: bool = False) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        data = json.loads((folder / "dump.json").read_text())
        edit(data)
        text = json.dumps(data)
        (folder / "dump.json").write_text(text.replace('"@BIG@"', "1" + "0" * 400) if big else text)
    return apply


def _first_msprobe_output(d: dict) -> dict:
    return d["data"]["Functional.linear.0.forward"]["output"][0]


def _pt_outside(folder: Path) -> None:
    """Every tensor file moved out of the dump (holding 1337.0), a symlink left in its place."""
    outside = folder.parent / "outside"
    outside.mkdir()
    for pt in _pt_files(folder):
        t = torch.load(pt, weights_only=True)
        torch.save(torch.full_like(t, 1337.0), outside / pt.name)
        pt.unlink()
        pt.symlink_to(outside / pt.name)


def _data_dir_outside(folder: Path) -> None:
    """dump_tensor_data itself a symlink to a folder outside the dump, of the same names."""
    outside = folder.parent / "outside_data"
    shutil.move(folder / "dump_tensor_data", outside)
    for pt in outside.glob("*.pt"):
        torch.save(torch.full_like(torch.load(pt, weights_only=True), 1337.0), pt)
    (folder / "dump_tensor_data").symlink_to(outside)


def zip_bomb(path: Path, numel: int) -> None:
    """``path`` rewritten as a .pt archive whose storage of ``numel`` zero floats is DEFLATE'd
    (torch.save stores it uncompressed): a few KB on disk, ``4 * numel`` bytes once read."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    storage = next(n for n in members if n.rsplit("/", 2)[-2:-1] == ["data"])
    members[storage] = bytes(4 * numel)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, raw in members.items():
            z.writestr(name, raw)


def _wrong_tensor(folder: Path) -> None:
    for pt in _pt_files(folder):
        torch.save(torch.randn(5, 3, dtype=torch.float64), pt)


CORRUPTIONS_MSPROBE: dict[str, Callable[[Path], None]] = {
    "msprobe index not json": lambda f: (f / "dump.json").write_text('{"task": "tensor", "level": "L1", "data": {'),
    "msprobe stats Max 10**400": _msprobe_json(lambda d: _first_msprobe_output(d).update(Max="@BIG@"), big=True),
    "msprobe tensor shape 10**400": _msprobe_json(lambda d: _first_msprobe_output(d).update(shape="@BIG@"), big=True),
    "msprobe tensor shape 2**62 x 2**62": _msprobe_json(lambda d: _first_msprobe_output(d).update(shape=[2**62, 2**62])),
    "msprobe tensor data a symlink out of the dump": _pt_outside,
    "msprobe tensor data folder a symlink out of the dump": _data_dir_outside,
    "msprobe tensor data a zip bomb": lambda f: [zip_bomb(pt, 1 << 22) for pt in _pt_files(f)],
    "msprobe tensor data of another shape and dtype": _wrong_tensor,
    "msprobe module names with terminal escapes": lambda f: (f / "construct.json").write_text(json.dumps(
        {k: f"Module.{ESCAPES}.Block.forward.0" for k in json.loads((f / "dump.json").read_text())["data"]})),
}


@pytest.mark.parametrize("case", _first_of_each_family({k.removeprefix("msprobe "): v
                                                         for k, v in CORRUPTIONS_MSPROBE.items()}))
def test_every_tool_answers_right_or_fails_in_one_line_msprobe(good_msprobe, tmp_path, case):
    """The msprobe reader under the native reader's rules: paths, sizes against the declared shape
    and dtype, bounded numbers, escaped names."""
    _check_every_tool(good_msprobe, tmp_path, case, CORRUPTIONS_MSPROBE[f"msprobe {case}"])


@pytest.mark.parametrize("content", ["directory", "empty", "binary", "no columns we know"])
def test_xray_diff_refuses_what_is_not_a_result_csv(tmp_path, content):
    from xray.gen.diff import main as diff_main

    bad = tmp_path / "bad.csv"
    if content == "directory":
        bad.mkdir()
    else:
        bad.write_bytes({"empty": b"", "binary": bytes(range(256)), "no columns we know": b"a,b\n1,2\n"}[content])
    rc, out, err = _call(diff_main, [str(bad), str(bad), str(tmp_path / "d.csv")])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "bad.csv" in err, (rc, err)
