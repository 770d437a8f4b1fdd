"""Third hardening pass (issue 44): no output replaces what its command did not write, two runs
never share a staging folder, callbacks never raise into training, complex statistics count
elements, forked children record their own dump, and CLI usage errors are one line, exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xray

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")


@pytest.fixture(scope="module")
def two_dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("dumps")
    folders = []
    for name, op in (("a", torch.tanh), ("b", torch.sigmoid)):
        with xray.dump(dump_dir=root / name, X_DEDUP=False) as session:
            op(torch.ones(3))
        folders.append(session.folder)
    return folders


# -- export-json never overwrites what it did not write ----------------------------------------------

def _export(*argv: str, capsys) -> tuple[int, str]:
    from xray.cli import main

    code = main(["export-json", *argv])
    return code, capsys.readouterr().err


def test_export_json_refuses_an_existing_dump_folder(two_dumps, capsys):
    a, b = two_dumps
    before = (b / "dump.json").read_bytes()
    code, err = _export(str(a), "-o", str(b), capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nothing was overwritten" in err, err
    assert (b / "dump.json").read_bytes() == before
    assert [r.op for r in xray.load_dump(b).records if r.kind == "op"][-1] == "aten.sigmoid.default"
    code, err = _export(str(a), "-o", str(b / "dump.json"), capsys=capsys)  # the index file itself
    assert code == 2 and (b / "dump.json").read_bytes() == before, err


def test_export_json_refuses_a_users_file_and_replaces_its_own_export(two_dumps, tmp_path, capsys):
    a, b = two_dumps
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}')
    code, err = _export(str(a), "-o", str(mine), capsys=capsys)
    assert code == 2 and mine.read_text() == '{"mine": 1}', err
    out = tmp_path / "records.json"
    for dump in (a, b):  # a rerun replaces the export it wrote
        assert _export(str(dump), "-o", str(out), capsys=capsys)[0] == 0
    assert json.loads(out.read_text())["records"][-1]["op"] == "aten.sigmoid.default"
    folder = tmp_path / "empty"
    folder.mkdir()
    for _ in range(2):  # an empty folder gets dump.json, and that export is its own to replace
        assert _export(str(a), "-o", str(folder), capsys=capsys)[0] == 0
    assert xray.load_dump(folder).records[-1].op == "aten.tanh.default"  # still an ordinary dump


# -- two xray-gen runs into one folder -------------------------------------------------------------

def test_a_second_xray_gen_into_one_out_leaves_the_first_whole(tmp_path):
    """Another run into the same -o, start to end, while this one renders: it removed this run's
    fixed staging folder, and this run published 0 of its data files with exit 0. Each run now
    stages in a folder of its own, and another run's is never deleted."""
    from xray.gen.generator import generate

    with torch.no_grad(), xray.dump(dump_dir=tmp_path / "d", X_DEDUP=False, X_DUMP_NUM=4) as d:
        x = torch.randn(3, 4)
        torch.tanh(x), torch.sigmoid(x), x @ x.T, torch.relu(x)
    generate(xray.load_dump(d.folder), tmp_path / "ref")
    out = tmp_path / "out"
    (out / ".xray-gen-staging-other").mkdir(parents=True)
    (out / ".xray-gen-staging-other" / "keep.h5").write_text("another run's")
    inner = []

    def another_run(_):
        if not inner:
            inner.append(generate(xray.load_dump(d.folder), out))

    generate(xray.load_dump(d.folder), out, progress=another_run)
    assert inner
    names = lambda folder, pattern: sorted(p.name for p in folder.glob(pattern))  # noqa: E731
    assert names(out / "data", "*.h5") == names(tmp_path / "ref" / "data", "*.h5") != []
    assert names(out, "test_*.py") == names(tmp_path / "ref", "test_*.py")
    assert (out / ".xray-gen-staging-other" / "keep.h5").read_text() == "another run's"
    assert not list(out.glob(".xray-gen-staging-*/*.py"))  # this run's staging is gone


# -- CLI usage errors: one line, exit 2, before any work ---------------------------------------------

FACTORY = """
import pathlib, torch
def build():
    pathlib.Path(__file__).with_name("built").touch()  # the analysis began
    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
def function_and_args():
    return torch.tanh, (torch.randn(2, 4),)
"""


@pytest.fixture
def factory(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(FACTORY)
    return path


def _one_line_refusal(capsys, code: int, *words: str) -> None:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("bound", ["nan", "inf", "-1", "0"])
def test_fix_refuses_a_bound_that_is_not_positive_and_finite(factory, capsys, bound):
    """nan ran 71 trials and reported "found"; -1 and 0 ran the whole search."""
    from xray.cli import main

    code = main(["fix", f"{factory}:build", "--target", "cpu:bf16", f"--max-error={bound}"])
    _one_line_refusal(capsys, code, "--max-error")
    assert not factory.with_name("built").exists()


@pytest.mark.parametrize("cmd", [["explain"], ["fix", "--max-error", "1e-2"]])
def test_explain_and_fix_refuse_an_out_file_before_the_analysis(factory, tmp_path, capsys, cmd):
    from xray.cli import main

    out = tmp_path / "report.txt"
    out.write_text("mine")
    code = main([*cmd, f"{factory}:build", "--target", "cpu:bf16", "--out", str(out)])
    _one_line_refusal(capsys, code, "not a folder")
    assert not factory.with_name("built").exists() and out.read_text() == "mine"


def test_explain_refuses_a_factory_returning_a_function(factory, capsys):
    from xray.cli import main

    code = main(["explain", f"{factory}:function_and_args", "--target", "cpu:bf16", "--out", str(factory.parent / "x")])
    _one_line_refusal(capsys, code, "torch.nn.Module")


def test_replay_refuses_an_out_file(two_dumps, tmp_path, capsys):
    from xray.replay.cli import main

    out = tmp_path / "matrix"
    out.write_text("mine")
    code = main([str(two_dumps[0]), "-b", "torch-cpu", "-o", str(out), "-q"])
    _one_line_refusal(capsys, code, "not a folder")
    assert out.read_text() == "mine"


@pytest.mark.slow
def test_xray_info_into_a_closed_pipe_is_quiet(two_dumps):
    """``xray info DUMP | head``: the reader closed the pipe; Python printed a BrokenPipeError."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from xray.cli import main; sys.exit(main())", "info",
                             str(two_dumps[0])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    proc.stdout.close()  # before a line is read
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "BrokenPipe" not in err and "Traceback" not in err, err


# -- a forked child records its own dump ------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_records_its_own_dump_while_the_parent_records(tmp_path):
    """The child inherited the parent's active session: its begin_dump raised DumpUsageError."""
    read, write = os.pipe()
    with xray.dump(dump_dir=tmp_path / "parent", X_DEDUP=False) as parent:
        torch.ones(3).mul(2.0)
        pid = os.fork()
        if pid == 0:  # the child: report its dump folder (or its error), never return into pytest
            try:
                with xray.dump(dump_dir=tmp_path / "child", X_DEDUP=False) as child:
                    torch.ones(3).tanh()
                os.write(write, str(child.folder).encode())
                xray.end_dump()  # the parent's session, run again in the child: left alone
            except BaseException as e:  # noqa: BLE001
                os.write(write, f"ERROR {type(e).__name__}: {e}".encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            said = f.read()
        os.waitpid(pid, 0)
        torch.ones(3).sigmoid()
    assert not said.startswith("ERROR"), said
    child = xray.load_dump(said)
    assert child.complete and Path(said).name == f"proc_{pid}"
    assert [r.op for r in child.records] == ["aten.ones.default", "aten.tanh.default"]
    ops = [r.op for r in xray.load_dump(parent.folder).records]
    assert "aten.sigmoid.default" in ops and "aten.tanh.default" not in ops
