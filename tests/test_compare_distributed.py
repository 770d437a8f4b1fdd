"""Compare where the dumps live: under torchrun every rank compares its own rank pair from its
node's disk, and rank 0 names the rank that diverged first, ordered by the collectives before it.

Four gloo ranks record a tiny sharded MLP twice (tests/scripts/dist_fault_dump.py): in the target,
rank 2 goes wrong after collective 1 and rank 1 after collective 2; the closing all_reduce
(collective 3) hands the error to ranks 0 and 3. Listing ranks in rank order would name rank 0.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import xray
from xray.compare import COMPARE_COLUMNS, compare_dumps
from xray.compare import cli, distributed
from xray.compare.distributed import global_rank, merge_csv
from xray.compare.sync_points import SyncPoint, collective_seqs, divergence_order, is_collective, sync_point
from xray.compare.report import write_csv
from xray.dump.model import Record

from test_compare_attribution_bound import N, _chain

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).parent / "scripts" / "dist_fault_dump.py"
ORDER = ["rank_2", "rank_1", "rank_0", "rank_3"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return env


def torchrun(*args: str, nproc: int = 4, launch: tuple[str, ...] = ("--standalone",)) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, "--nproc-per-node", str(nproc), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=240)
    return proc.returncode, out


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("dist_fault")
    rc, out = finish(torchrun(str(SCRIPT), str(root / "bench"), str(root / "target")))
    assert rc == 0, out[-3000:]
    return root / "bench", root / "target"


@pytest.fixture(scope="module")
def single(dumps, tmp_path_factory):
    """The single-process compare every torchrun result must agree with."""
    result = compare_dumps(*dumps, progress=False)
    path = tmp_path_factory.mktemp("single") / "single.csv"
    write_csv(result, path)
    return result, path


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and list(rows[0]) == list(COMPARE_COLUMNS)
    return rows


# -- the ordering rule, pure ------------------------------------------------------------------


def test_collectives_are_the_ops_that_exchange_data():
    assert is_collective("c10d.allreduce_.default") and is_collective("c10d.broadcast_.default")
    assert is_collective("_c10d_functional.all_reduce.default")
    assert is_collective("_c10d_functional.reduce_scatter_tensor.default")
    assert not is_collective("_c10d_functional.wait_tensor.default")  # waits for one, exchanges nothing
    assert not is_collective("_c10d_functional._wrap_tensor_autograd.default")
    assert not is_collective("aten.mm.default") and not is_collective("c10d_like.op")


def test_sync_point_counts_the_collectives_before_and_the_offset_after_the_last():
    collectives = [3, 8, 12]
    assert sync_point(collectives, 0) == SyncPoint(0, 1)  # first record, no collective yet
    assert sync_point(collectives, 2) == SyncPoint(0, 3)
    assert sync_point(collectives, 5) == SyncPoint(1, 2)
    assert sync_point(collectives, 10) == SyncPoint(2, 2)
    # a collective's output was made by every rank together: it counts its own collective
    assert sync_point(collectives, 12) == SyncPoint(3, 0)
    assert sync_point([], 7, first_seq=5) == SyncPoint(0, 3)


def test_collectives_folded_by_dedup_are_counted_as_missing():
    records = [Record(seq=0, kind="op", op="aten.mm.default"),
               Record(seq=1, kind="op", op="c10d.allreduce_.default", count=3),
               Record(seq=2, kind="op", op="_c10d_functional.wait_tensor.default", count=3),
               Record(seq=5, kind="op", op="c10d.broadcast_.default")]
    assert collective_seqs(records) == ([1, 5], 2)


def test_fewest_collectives_first_then_offset_then_rank():
    points = {"rank_0": SyncPoint(3, 0), "rank_1": SyncPoint(2, 2), "rank_2": SyncPoint(1, 5),
              "rank_10": SyncPoint(1, 2), "rank_3": SyncPoint(1, 2), "rank_4": SyncPoint(0, 40)}
    assert divergence_order(points) == ["rank_4", "rank_3", "rank_10", "rank_2", "rank_1", "rank_0"]
    assert divergence_order({}) == []


def test_rank_of_a_unit_name():
    assert global_rank("rank_3") == 3 and global_rank("rank_12.4711") == 12
    assert global_rank("globalrank-5_localrank-1") == 5
    assert global_rank("proc_123") is None and global_rank("") is None


def test_merged_csv_only_from_files_rank_0_sees_as_written(tmp_path):
    header = ",".join(COMPARE_COLUMNS) + "\n"
    files = []
    for rank in (0, 1):
        path = tmp_path / f"rank_{rank}.csv"
        path.write_text(header + f"rank_{rank},{rank}\n")
        files.append(path)
    payloads = [{"rank": r, "label": f"rank_{r}", "host": "node0", "csv": str(p),
                 "csv_sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for r, p in enumerate(files)]
    assert merge_csv(payloads, tmp_path / "compare.csv") is None
    assert (tmp_path / "compare.csv").read_text() == header + "rank_0,0\n" + "rank_1,1\n"
    # rank 1's file on this node is a stale one of an earlier run; rank 2's is on another node
    files[1].write_text(header + "rank_1,old\n")
    payloads.append({"rank": 2, "label": "rank_2", "host": "node1", "csv": str(tmp_path / "elsewhere.csv"),
                     "csv_sha256": "0"})
    where = merge_csv(payloads, tmp_path / "again.csv")
    assert "rank_1: node0:" in where and f"rank_2: node1:{tmp_path / 'elsewhere.csv'}" in where
    assert "rank_0" not in where and not (tmp_path / "again.csv").exists()


# -- a real 4-rank gloo job -------------------------------------------------------------------


@pytest.mark.slow
def test_the_tracer_records_each_collective(dumps):
    _, target = dumps
    for rank in range(4):
        ops = [r.op for r in xray.load_dump(target / f"rank_{rank}").records]
        assert [op for op in ops if is_collective(op)] == ["c10d.broadcast_.default", "c10d.broadcast_.default",
                                                           "c10d.allreduce_.default"]


@pytest.mark.slow
def test_single_process_compare_names_the_rank_that_diverged_first(single):
    s = single[0].summary
    assert s.divergence_order == ORDER
    assert s.first_divergence["rank"] == "rank_2" and s.first_divergence["op"] == "aten.mm.default"
    assert s.first_divergence["origin"] == "born"
    assert s.ranks["rank_2"]["sync"] == {"collectives": 1, "offset": 2}
    assert s.ranks["rank_1"]["sync"] == {"collectives": 2, "offset": 2}
    assert s.ranks["rank_0"]["first_divergence"]["op"] == "c10d.allreduce_.default"  # received, not made
    assert s.ranks["rank_0"]["sync"] == {"collectives": 3, "offset": 0}


@pytest.mark.slow
def test_each_rank_compares_its_pair_and_rank_0_reports(dumps, single, tmp_path):
    result, single_csv = single
    out = tmp_path / "out"
    rc, log = finish(torchrun("-m", "xray.compare", *map(str, dumps), str(out)))
    assert rc == 0, log[-3000:]
    expected = read_rows(single_csv)
    for rank in range(4):  # every rank's rows, whole rows, are the single-process rows of that rank
        rows = read_rows(out / f"rank_{rank}.csv")
        assert rows == [r for r in expected if r["rank"] == f"rank_{rank}"]
    assert read_rows(out / "compare.csv") == expected  # one filesystem here: merged
    summary = json.loads((out / "summary.json").read_text())
    assert summary["divergence_order"] == ORDER
    assert summary["first_divergence"] == result.summary.first_divergence
    for key in ("rows", "passed", "failed", "matched", "bench_records", "target_records", "match_pct"):
        assert summary[key] == getattr(result.summary, key), key
    assert summary["errors"] == {} and summary["ranks"]["rank_2"]["csv"] == str((out / "rank_2.csv").resolve())
    assert "FIRST DIVERGENCE (error born here): row 5 rank rank_2" in log
    assert log.count("FIRST DIVERGENCE") == 1  # rank 0 alone reports


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_per_node_folders_hold_only_the_local_ranks(dumps, tmp_path):
    """Two 'nodes' of two ranks: node 1's folders hold only rank_2 and rank_3, its OUT is its own."""
    bench, target = dumps
    node1 = tmp_path / "node1"
    for side, src in (("bench", bench), ("target", target)):
        for rank in (2, 3):
            shutil.copytree(src / f"rank_{rank}", node1 / side / f"rank_{rank}")
    port = _free_port()
    procs = [torchrun("-m", "xray.compare", str(b), str(t), str(o), nproc=2,
                      launch=("--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1",
                              "--master-port", str(port)))
             for n, (b, t, o) in enumerate([(bench, target, tmp_path / "out0"),
                                            (node1 / "bench", node1 / "target", tmp_path / "out1")])]
    (rc0, log0), (rc1, log1) = map(finish, procs)
    assert rc0 == 0 and rc1 == 0, log0[-2000:] + log1[-2000:]
    assert sorted(p.name for p in (tmp_path / "out1").iterdir()) == ["rank_2.csv", "rank_3.csv"]
    summary = json.loads((tmp_path / "out0" / "summary.json").read_text())
    assert summary["divergence_order"] == ORDER and summary["first_divergence"]["rank"] == "rank_2"
    assert summary["ranks"]["rank_3"]["csv"] == str((tmp_path / "out1" / "rank_3.csv").resolve())
    assert "FIRST DIVERGENCE" not in log1  # node 1 has no rank 0


@pytest.mark.slow
def test_an_unusable_rank_fails_the_job_and_the_others_still_report(dumps, tmp_path):
    bench, target = dumps
    partial = tmp_path / "target"
    for rank in (0, 2, 3):
        shutil.copytree(target / f"rank_{rank}", partial / f"rank_{rank}")
    out = tmp_path / "out"
    rc, log = finish(torchrun("-m", "xray.compare", str(bench), str(partial), str(out), nproc=2))
    assert rc != 0 and "exitcode  : 2" in log  # every rank exits 2; torchrun reports 1
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["ranks"]) == ["rank_0"]
    assert f"{partial}: no dump of rank 1 here" in summary["errors"]["rank_1"]
    assert "not compared by any rank (world size 2): rank_2, rank_3" in summary["warnings"]
    assert "!! rank_1 NOT COMPARED" in log


@pytest.mark.slow
def test_without_torchrun_one_process_compares_every_pair(dumps, single, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "xray.compare", *map(str, dumps), str(out)], capture_output=True,
                          text=True, env=_env(), cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_rows(out / "compare.csv") == read_rows(single[1])
    assert json.loads((out / "summary.json").read_text())["divergence_order"] == ORDER
    assert "torchrun --nnodes N --nproc-per-node M -m xray.compare" in proc.stdout
    missing = subprocess.run([sys.executable, "-m", "xray.compare", str(tmp_path / "nothing"), str(dumps[1]), str(out)],
                             capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    assert missing.returncode == 2 and "nothing: no such file or folder" in missing.stderr


def _world_of_one(monkeypatch, torchrun_env: bool) -> None:
    """torchrun's variables for a gloo world of one (run() in this process), or none of them
    (one process compares every pair)."""
    if torchrun_env:
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                     ("MASTER_PORT", str(_free_port()))):
            monkeypatch.setenv(k, v)
    else:
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
            monkeypatch.delenv(k, raising=False)


@pytest.mark.parametrize("torchrun_env", [False, True], ids=["one_process", "rank_job"])
def test_the_rank_compare_attributes_every_row_when_asked(tmp_path, monkeypatch, capsys, torchrun_env):
    """python -m xray.compare takes xray-compare's --attribute-all: by default a rank pair whose
    rows all fail is attributed up to the bound and says how many rows were left; with it, every
    row. rank_job: run() in this process, a gloo world of one, as under torchrun."""
    bench, target = _chain(tmp_path / "bench" / "rank_0"), _chain(tmp_path / "target" / "rank_0", 1.5)
    monkeypatch.setattr(cli, "ATTRIBUTED", 10)  # the default bound, small enough for this pair
    _world_of_one(monkeypatch, torchrun_env)
    for flags, unattributed in (([], N - 10), (["--attribute-all"], 0)):
        out = tmp_path / f"out{len(flags)}"
        assert distributed.main([str(bench.parent), str(target.parent), str(out), *flags]) == 0
        log = capsys.readouterr().out
        rows = read_rows(out / ("rank_0.csv" if torchrun_env else "compare.csv"))
        assert [r["status"] for r in rows] == ["fail"] * N
        assert sum(r["note"].startswith("not attributed") for r in rows) == unattributed
        assert sum(not r["cause"] for r in rows) == unattributed
        summary = json.loads((out / "summary.json").read_text())
        (label, totals), = summary["ranks"].items()  # one rank pair
        assert label == "rank_0", label  # a world of one names its pair as any job does
        assert totals.get("unattributed", 0) == unattributed
        told = [w for w in summary["warnings"] if "--attribute-all" in w]
        if unattributed:
            assert len(told) == 1 and f"first 10 failing rows" in told[0]
            assert f"{unattributed} later failing rows" in told[0]
            assert f"warning: {told[0]}" in log  # the terminal report says so, as xray-compare's does
        else:
            assert told == [] and "not attributed" not in log


@pytest.mark.parametrize("torchrun_env", [False, True], ids=["one_process", "rank_job"])
def test_the_rank_compare_takes_xray_compares_statistics_only(tmp_path, monkeypatch, torchrun_env):
    """--statistics-only reaches each rank pair's compare (it was parsed and dropped): the rows
    are xray-compare's own with the flag, saved tensors left unread."""
    import torch
    from conftest import record_forward

    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)), torch.randn(4, 64)
    bench = tmp_path / "bench" / "rank_0"
    shutil.move(record_forward(model, tmp_path / "recorded" / "bench", x), bench.parent.mkdir() or bench)
    with torch.no_grad():
        model[2].weight.mul_(1.01)
    target = tmp_path / "target" / "rank_0"
    shutil.move(record_forward(model, tmp_path / "recorded" / "target", x), target.parent.mkdir() or target)
    _world_of_one(monkeypatch, torchrun_env)
    modes = {}
    for flags in ([], ["--statistics-only"]):
        assert cli.main([str(bench), str(target), str(tmp_path / "one.csv"), "--no-progress", *flags]) == 0
        out = tmp_path / f"out{len(flags)}"
        assert distributed.main([str(bench.parent), str(target.parent), str(out), *flags]) == 0
        got = [r["mode"] for r in read_rows(out / ("rank_0.csv" if torchrun_env else "compare.csv"))]
        assert got == [r["mode"] for r in read_rows(tmp_path / "one.csv")]
        modes[bool(flags)] = got
    assert modes[True] != modes[False], modes  # the flag changes how rows are judged here


def test_each_ranks_warnings_name_it_in_the_jobs_report(tmp_path, monkeypatch):
    """Two rank pairs whose rows all fail past the attribution bound each warn so; the job's
    report says which rank each warning is from."""
    monkeypatch.setattr(cli, "ATTRIBUTED", 10)
    payloads = []
    for rank in (0, 1):
        bench = _chain(tmp_path / "bench" / f"rank_{rank}")
        target = _chain(tmp_path / "target" / f"rank_{rank}", 1.5)
        payloads.append(distributed.compare_rank(bench.parent, target.parent, tmp_path, rank, 2, attribute_first=10))
    assert all(p["error"] is None and p["summary"]["warnings"] for p in payloads)
    merged = distributed.merge_summaries("bench", "target", payloads)
    told = [w for w in merged.warnings if "--attribute-all" in w]
    assert [w.split(":")[0] for w in told] == ["rank_0", "rank_1"], merged.warnings
