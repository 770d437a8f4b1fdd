"""Corrupt and hostile dump.json files (issue 18, issue 30).

Each case is a real dump with one field damaged the way the adversarial pass found. The rule: a
damaged record is refused alone (``TraceDump.refused``, one ``RefusedRecordsWarning``), with a
reason that never echoes more than a bounded slice of the payload, and the rest of the dump
opens; a dump.json that does not parse at all is one DumpFormatError naming the file, and
xray-gen exits 2 with one line (no traceback).
"""
from __future__ import annotations

import copy
import json

import pytest

import xray
from xray.dump import RefusedRecordsWarning, TruncatedDumpWarning
from xray.dump.json_index import rewrite_as_json
from xray.dump.model import ECHO
from xray.gen.cli import main as gen_main

from test_gen_security import base, write_dump  # noqa: F401  (base is a fixture)

HUGE = "A" * 5_000_000


DEEP = "__DEEP__"  # replaced in the file text by lists nested 5,000 deep (json.dumps cannot write them)


def _deep_text(folder) -> None:
    index = folder / "dump.json"
    index.write_text(index.read_text().replace(f'"{DEEP}"', "[" * 5000 + "]" * 5000))


def _first(data: dict) -> dict:
    return data["records"][0]


def _tensor(data: dict) -> dict:
    return next(v for v in _first(data)["inputs"].values() if isinstance(v, dict) and v.get("t") == "tensor")


CASES = {
    "huge op name": lambda d: _first(d).update(op="aten." + HUGE + ".default"),
    "huge module path": lambda d: _first(d).update(module=HUGE),
    "huge string argument": lambda d: _first(d)["inputs"].update(extra=HUGE * 2),
    "lists nested 5000 deep": lambda d: _first(d)["inputs"].update(extra=DEEP),
    "stats given as a list": lambda d: _tensor(d).update(stats=[1, 2, 3]),
    "stats count negative": lambda d: _tensor(d)["stats"].update(nan=-1),
    "statistic given as an object": lambda d: _tensor(d)["stats"].update(min={"x": 1}),
    "inputs given as a list": lambda d: _first(d).update(inputs=[1, 2]),
    "outputs given as an object": lambda d: _first(d).update(outputs={"a": 1}),
    "module given as an int": lambda d: _first(d).update(module=7),
    "data given as an int": lambda d: _tensor(d).update(data=7),
    "shape with a negative size": lambda d: _tensor(d).update(shape=[-4, 8]),
    "shape with a bool": lambda d: _tensor(d).update(shape=[True, 8]),
    "shape of 100 dims": lambda d: _tensor(d).update(shape=[1] * 100),
    "seq as a string": lambda d: _first(d).update(seq="0"),
    "count zero": lambda d: _first(d).update(count=0),
    "unknown kind": lambda d: _first(d).update(kind="evil"),
    "unknown direction": lambda d: _first(d).update(direction=HUGE),
    "module_stack entry not a pair": lambda d: _first(d).update(module_stack=[["a"]]),
    "stack frames not strings": lambda d: _first(d).update(stack=[{"f": 1}]),
    "record not an object": lambda d: d["records"].__setitem__(0, [1, 2]),
    "unknown value tag": lambda d: _first(d)["inputs"].update(extra={"t": HUGE}),
    "symint payload nested 5000 deep": lambda d: _first(d)["inputs"].update(extra={"t": "symint", "v": DEEP}),
    "lists nested 40 deep": lambda d: _first(d)["inputs"].update(extra=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]),
    "params given as a list": lambda d: _first(d).update(params=[1]),
}


WHOLE_FILE = ("lists nested 5000 deep", "symint payload nested 5000 deep")  # dump.json itself does not parse


@pytest.mark.parametrize("case", sorted(set(CASES) - set(WHOLE_FILE)))
def test_corrupt_record_is_refused_alone(base, tmp_path, capsys, case):  # noqa: F811
    """Issue 30: the damaged record is left out, named with a bounded one-line reason, and the
    rest of the dump opens; every tool then works on the rest and says what was refused."""
    data = copy.deepcopy(base)
    CASES[case](data)
    folder = write_dump(tmp_path, data)
    with pytest.warns(RefusedRecordsWarning, match="the rest opened") as said:
        dump = xray.load_dump(folder)
    assert len(dump.records) == len(base["records"]) - 1
    (refusal,) = dump.refused
    assert refusal.row == 0 and "malformed" in refusal.reason
    for msg in (str(refusal), str(said[0].message)):
        assert len(msg) < 2 * ECHO + 400, f"{len(msg)} characters echoed"
        assert "\n" not in msg
    assert gen_main([str(folder), "-o", str(tmp_path / "o"), "-q"]) == 0
    err = capsys.readouterr().err
    assert "refused 1 record(s)" in err and "Traceback" not in err, err[-500:]
    assert len(err) < 2 * ECHO + 800


@pytest.mark.parametrize("case", WHOLE_FILE)
def test_dump_json_that_does_not_parse_is_refused_at_load(base, tmp_path, capsys, case):  # noqa: F811
    data = copy.deepcopy(base)
    CASES[case](data)
    folder = write_dump(tmp_path, data)
    _deep_text(folder)
    with pytest.raises(xray.DumpFormatError) as err:
        xray.load_dump(folder)
    msg = str(err.value)
    assert "dump.json" in msg and "nested" in msg, msg
    assert len(msg) < 2 * ECHO + 300 and "\n" not in msg
    assert gen_main([str(folder), "-o", str(tmp_path / "o"), "-q"]) == 2
    out = capsys.readouterr()
    assert len(out.err.strip().splitlines()) == 1 and "Traceback" not in out.err, out.err[-500:]
    assert str(folder) in out.err, out.err[-500:]  # the refusal names the dump, not a usage error


def test_limits_leave_real_dumps_alone(base, tmp_path):  # noqa: F811
    folder = write_dump(tmp_path, copy.deepcopy(base))
    dump = xray.load_dump(folder)
    assert len(dump.records) == len(base["records"])
    assert json.loads((folder / "dump.json").read_text())["records"] == base["records"]


JOURNAL_CASES = {
    "a line that is a list": "[1, 2]\n",
    "a line that is a number": "7\n",
    "an update that is not a number": '{"update": "x", "count": 2, "last_seq": 3}\n',
    "a record with no seq": '{"kind": "op", "op": "aten.add.Tensor"}\n',
    "a line nested 5000 deep": "[" * 5000 + "]" * 5000 + "\n",
}


@pytest.mark.parametrize("case", sorted(JOURNAL_CASES))
def test_corrupt_journal_lines_are_skipped_and_counted(tmp_path, case):
    import torch
    with xray.dump(dump_dir=tmp_path, X_DEDUP=False) as d:
        torch.tanh(torch.ones(3)) + 1
    folder = d.folder
    rewrite_as_json(folder)  # a version-2 journal holds JSON record lines
    index = json.loads((folder / "dump.json").read_text())
    header = {k: v for k, v in index.items() if k not in ("records", "summary", "complete")}
    lines = [json.dumps({"header": header})] + [json.dumps(r) for r in index["records"]]
    (folder / "dump.json").unlink()
    (folder / "journal.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n" + JOURNAL_CASES[case] + "\n".join(lines[2:]) + "\n")
    with pytest.warns(TruncatedDumpWarning, match="skipped 1 unreadable line"):
        dump = xray.load_dump(folder)
    assert len(dump.records) == len(index["records"])


@pytest.mark.parametrize("first", ["[1]", "7", '{"header": [1]}', '{"header": {"format": 5}}'])
def test_journal_header_that_is_not_one_is_refused(tmp_path, first):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "journal.jsonl").write_text(first + "\n")
    with pytest.raises(xray.DumpFormatError, match="journal.jsonl"):
        xray.load_dump(folder)
