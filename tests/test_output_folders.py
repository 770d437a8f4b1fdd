"""Tools delete or replace only files they can prove they wrote; two runs into one folder
never break each other; a full disk is one line, with no temporary left (issue 31, items 1,
5 and 13)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import xray
from xray.gen.cli import main as gen_main

ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    with xray.dump(dump_dir=tmp_path_factory.mktemp("rec"), X_DEDUP=False, X_DUMP_NUM=100) as d:
        x = torch.randn(64, 64)
        torch.tanh(x @ x).sum()
    return d.folder


def test_gen_keeps_a_users_data_files(recorded, tmp_path):
    """xray-gen deleted every data/test_*.h5 of the output folder, whoever wrote it."""
    out = tmp_path / "tests"
    (out / "data").mkdir(parents=True)
    golden = out / "data" / "test_golden_outputs.h5"
    golden.write_bytes(b"the user's own data")
    for _ in range(2):  # the second run cleans what the first wrote, and only that
        assert gen_main([str(recorded), "-o", str(out), "-q", "--factory", "load"]) == 0
    assert golden.read_bytes() == b"the user's own data"
    ours = sorted(p.name for p in (out / "data").glob("test_aten_*.h5"))
    assert ours, "the generated suite copies its tensors"
    tests = {p.stem for p in out.glob("test_aten_*.py")}
    assert {Path(n).stem for n in ours} <= tests


def test_gen_refuses_to_replace_a_users_file_of_the_same_name(recorded, tmp_path, capsys):
    out = tmp_path / "tests"
    assert gen_main([str(recorded), "-o", str(out), "-q", "--factory", "load"]) == 0
    mine = sorted(out.glob("test_aten_*.py"))[0]
    mine.write_text("# my own test, not xray-gen's\n")
    data = out / "data" / f"{mine.stem}.h5"
    before = data.read_bytes()
    assert gen_main([str(recorded), "-o", str(out), "-q", "--factory", "load"]) != 0
    err = capsys.readouterr().err
    assert str(mine) in err and "not written by xray-gen" in err and len(err.strip().splitlines()) == 1
    assert mine.read_text() == "# my own test, not xray-gen's\n" and data.read_bytes() == before


def test_two_matrix_writers_on_one_path_both_finish(tmp_path):
    """Two xray-replay runs into one --out shared matrix.csv.partial: the second truncated the
    first's rows, and the first to finish renamed it away from the other (a traceback)."""
    from xray.replay.matrix import MatrixRow, MatrixWriter

    path = tmp_path / "matrix.csv"
    a, b = MatrixWriter(path), MatrixWriter(path)
    for w, op in ((a, "aten.add.Tensor"), (b, "aten.mul.Tensor")):
        w.add(MatrixRow(seq=0, op=op, module="", count=1, signature="s", backend="torch-cpu", status=0,
                        max_abs_err=None, max_rel_err=None, latency_ms=None, cached=False, error=None))
    a.close()
    b.close()
    assert "aten.mul.Tensor" in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.csv"]


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
    tool, argv = sys.argv[2], sys.argv[3:]
    if tool == "replay":
        from xray.replay.cli import main
    else:
        from xray.cli import main
    sys.exit(main(argv))
""")


@pytest.mark.slow
def test_export_json_on_a_full_disk_leaves_no_temporary(recorded, tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, "500", "xray", "export-json", str(recorded), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "out.json" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_replay_on_a_full_disk_fails_in_one_line(recorded, tmp_path):
    """The per-backend dump could not be written: an uncaught DumpWriteError (a traceback)."""
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, "6000", "replay", str(recorded), "-b", "torch-cpu",
                           "-o", str(tmp_path / "r"), "-q", "--repeats", "0", "--no-cache"],
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if "warning" not in ln.lower()]
    assert len(lines) == 1 and "xray-replay: error" in lines[0], proc.stderr[-2000:]


@pytest.mark.slow  # two replay subprocesses at once
def test_two_replays_into_one_out_both_finish_whole(recorded, tmp_path):
    """Two xray-replay runs at once into one --out: each finishes, matrix.csv is one run's whole
    table, and each run's per-backend dump is its own (one beside the other's folder)."""
    import pandas as pd

    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "xray.replay.cli", str(recorded), "-b", "torch-cpu", "-o", str(out), "-q",
           "--repeats", "0", "--no-cache"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0 and "Traceback" not in err, err[-2000:]
    matrix = pd.read_csv(out / "matrix.csv")
    assert len(matrix) and set(matrix["backend"]) == {"torch-cpu"} and matrix["seq"].is_unique
    assert not list(out.glob("*.partial")) and not list(out.glob(".*.tmp"))
    dumps = sorted((out / "dumps").iterdir())  # torch-cpu/, and torch-cpu.<pid>/ when both wrote at once
    assert 1 <= len(dumps) <= 2
    for folder in dumps:
        assert xray.load_dump(folder).complete


@pytest.mark.slow
def test_replaying_again_into_one_out_replaces_the_last_run(recorded, tmp_path):
    """A re-run in the same process (a notebook) replaces its own finished output, as a re-run
    of the command does, instead of piling up dumps/torch-cpu.<pid>/ folders."""
    from xray.replay.runner import ReplayConfig, replay_dump

    cfg = ReplayConfig(backends=[], out=tmp_path / "r", factory="load", repeats=0, progress=False)
    first = replay_dump(recorded, cfg).dumps["torch-cpu"]
    second = replay_dump(recorded, cfg).dumps["torch-cpu"]
    assert first == second and [p.name for p in (tmp_path / "r" / "dumps").iterdir()] == ["torch-cpu"]
    assert xray.load_dump(second).complete


def _drift_cli(out: Path, *backends: str) -> subprocess.CompletedProcess:
    specs = [a for b in backends for a in ("-b", b)]
    return subprocess.run([sys.executable, "-m", "xray.cli", "drift", "xray.drift.examples:tiny_llama_1layer",
                           *specs, "--out", str(out)], capture_output=True, text=True, env=ENV, timeout=600)


@pytest.mark.parametrize("sub", ["eager", "_recording", "dumps/torch-compile"])
def test_drift_refuses_a_users_folder_in_out_and_deletes_nothing(tmp_path, sub):
    from xray.dump.folder_owner import OutputFolderError

    (tmp_path / sub).mkdir(parents=True)
    (tmp_path / sub / "important.txt").write_text("mine")
    with pytest.raises(OutputFolderError, match="did not write.*nothing was deleted"):
        xray.drift(torch.nn.Linear(2, 2), (torch.randn(1, 2),), ["torch-compile"], tmp_path)
    assert (tmp_path / sub / "important.txt").read_text() == "mine"
    assert not (tmp_path / "drift.json").exists()  # refused before any work


@pytest.mark.slow  # a fresh interpreter importing torch and the drift stack
def test_drift_cli_refuses_a_users_folder_with_exit_2_and_one_line(tmp_path):
    (tmp_path / "eager").mkdir()
    (tmp_path / "eager" / "important.txt").write_text("mine")
    proc = _drift_cli(tmp_path, "onnxrt-cpu")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "nothing was deleted" in proc.stderr, proc.stderr
    assert (tmp_path / "eager" / "important.txt").read_text() == "mine"


@pytest.mark.slow  # two whole-model runs on ONNX Runtime
def test_drift_replaces_its_own_output_on_a_rerun(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    for _ in range(2):
        result = xray.drift(model, (torch.randn(2, 4),), ["onnxrt-cpu"], tmp_path)
        assert result.backends[0].status == "OK", result.backends[0].error
    assert (tmp_path / "eager" / ".xray-output").is_file() and (tmp_path / "dumps" / "onnxrt-cpu" / ".xray-output").is_file()
    assert not (tmp_path / "_recording").exists() or not any(p.name.startswith("proc_") for p in (tmp_path / "_recording").iterdir())
    assert xray.load_dump(tmp_path / "eager").records
