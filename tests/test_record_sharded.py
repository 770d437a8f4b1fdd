"""Sharded runs under the recorder: DTensor tensor parallelism recorded whole with statistics
(each rank describes its local shard, with placements and mesh, and the local kernels that ran),
functional collectives recorded once complete, and a recording that stops says so in the dump
and in compare's verdict.

Two gloo ranks on CPU run tests/scripts/sharded_run.py (an attention + MLP block, forward and
backward) in one subprocess shared by this file's tests.
"""
from __future__ import annotations

import os
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xray
from xray.compare import compare_dumps

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).parent / "scripts" / "sharded_run.py"


def run_ranks(out: Path, *args: str, timeout: int = 240) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


def outcome(out: Path, case: str, rank: int) -> dict:
    return json.loads((out / f"{case}.rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sharded")
    run_ranks(out, "--cases", "tp,funcol")
    return out


@pytest.mark.slow
def test_tensor_parallel_step_is_recorded_whole_with_statistics(runs):
    """The default statistics used to reduce each DTensor across ranks, which stopped recording
    after 2 records (``aten.item`` of a partial scalar). Each rank now describes its shard."""
    for rank in (0, 1):
        result = outcome(runs, "tp", rank)
        assert result["stopped"] is None and result["error"] is None
        assert result["records"] > 200
        assert result["bitwise"], "recording changed the outputs or gradients"
        dump = xray.load_dump(runs / "tp" / f"rank_{rank}")
        assert dump.summary["op_calls"] == result["records"]
        assert any(r.direction == "backward" for r in dump.records)


@pytest.mark.slow
def test_dtensor_records_hold_the_local_shard_placements_and_mesh(runs):
    for rank in (0, 1):
        records = xray.load_dump(runs / "tp" / f"rank_{rank}").records
        mm = [r for r in records if r.op == "aten.addmm.default" and r.module == "q" and r.direction == "forward"]
        local, sharded = (next(r for r in mm if any(m.sharding for _, m in r.input_tensors()) is dt) for dt in (False, True))
        weight = sharded.inputs["mat2"]  # q.weight.t(): columns sharded, this rank's half
        assert weight.shape == (32, 16) and weight.stats.numel == 32 * 16
        sh = weight.sharding
        assert sh.placements == ("S(1)",) and sh.mesh == (2,) and sh.mesh_dims == ("tp",)
        assert sh.global_shape == (32, 32) and sh.global_offset == (0, 16 * rank) and sh.coordinate == (rank,)
        assert sharded.inputs["mat1"].sharding.placements == ("R",)
        # the kernel that ran is its own record, just before: the same local values
        assert local.seq < sharded.seq and local.inputs["mat2"].sharding is None
        assert local.outputs[0].stats == sharded.outputs[0].stats
        assert sharded.outputs[0].sample == local.outputs[0].sample and sharded.outputs[0].sample


@pytest.mark.slow
def test_sharding_survives_the_json_round_trip(runs):
    rec = next(r for r in xray.load_dump(runs / "tp" / "rank_1").records
               if any(m.sharding for _, m in r.input_tensors()))
    from xray.dump.model import Record

    again = Record.from_json(json.loads(json.dumps(rec.to_json())))
    assert [m.sharding for _, m in again.input_tensors()] == [m.sharding for _, m in rec.input_tensors()]


@pytest.mark.slow
def test_functional_all_reduce_is_recorded_once_complete(runs):
    """Rank 1 reaches the all-reduce 0.3 s late: rank 0's output tensor holds only its own term
    until then. The record holds the sum every rank receives."""
    total = torch.load(runs / "funcol.sum.rank0.pt")
    for rank in (0, 1):
        assert outcome(runs, "funcol", rank)["bitwise"]
        records = xray.load_dump(runs / "funcol" / f"rank_{rank}").records
        reduce = next(r for r in records if r.op == "_c10d_functional.all_reduce.default")
        out = reduce.outputs[0].stats
        assert out.mean == pytest.approx(total.double().mean().item(), rel=1e-6)
        assert out.max == pytest.approx(total.max().item(), rel=1e-6)


# -- a recorder that stops says so ------------------------------------------------------------


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8), torch.nn.Tanh())


def test_a_recording_that_stops_says_where_and_why(tmp_path, monkeypatch):
    model, x = _mlp(), torch.randn(4, 16)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path / "bench", X_DEDUP=False):
        expected = model(x)
    monkeypatch.setenv("XRAY_NATIVE_ROWS", "0")  # every call through the Python path, where the fault waits
    from xray.record.tracer import Recorder

    before = Recorder._before

    def breaks_on_gelu(self, func, args, kwargs, tracked=False):
        if str(func) == "aten.gelu.default":
            raise RuntimeError("a recorder bug on gelu")
        return before(self, func, args, kwargs, tracked)

    monkeypatch.setattr(Recorder, "_before", breaks_on_gelu)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="recording stopped"), \
            xray.dump(dump_dir=tmp_path / "target", X_DEDUP=False):
        got = model(x)
    assert torch.equal(got, expected)
    dump = xray.load_dump(tmp_path / "target")
    stopped = dump.summary["stopped"]
    assert stopped["op"] == "aten.gelu.default" and stopped["module"] == "1"
    assert stopped["seq"] == len(dump.records) and "a recorder bug on gelu" in stopped["reason"]
    assert stopped["raised_at"].endswith("in breaks_on_gelu")

    result = compare_dumps(tmp_path / "bench", tmp_path / "target", progress=False)
    s = result.summary
    assert s.failed == 0 and s.first_divergence is None
    assert s.verdict_kind == "cannot tell"
    assert s.verdict.startswith("target: recording stopped at seq 2 (aten.gelu.default in 1): RuntimeError: a recorder bug")
    from xray.compare.report import terminal_report

    assert "No divergence: no row failed" not in terminal_report(result)


KILLED = """
import os, sys, torch, xray
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8), torch.nn.Tanh())
xray.begin_dump(dump_dir=sys.argv[1], X_DEDUP=False, flush_records=1)
with torch.no_grad():
    model(torch.randn(4, 16, generator=torch.Generator().manual_seed(1)))
os._exit(1)  # killed: no end_dump, no atexit
"""


@pytest.mark.slow
def test_a_recording_that_never_finished_is_not_read_as_agreement(tmp_path):
    """A run killed before end_dump leaves its journal only: what it holds is compared, and the
    verdict says the recording did not finish."""
    subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "target")], env=dict(os.environ, OMP_NUM_THREADS="1"),
                   cwd=ROOT, timeout=120)
    torch.manual_seed(0)
    model = _mlp()
    with torch.no_grad(), xray.dump(dump_dir=tmp_path / "bench", X_DEDUP=False):
        model(torch.randn(4, 16, generator=torch.Generator().manual_seed(1)))
    s = compare_dumps(tmp_path / "bench", tmp_path / "target", progress=False).summary
    assert s.target_records > 0
    assert s.verdict_kind == "cannot tell" and "recording did not finish" in s.verdict


@pytest.mark.slow
def test_real_size_tensor_parallel_step(tmp_path):
    """Hidden 1024 (an MLP of 4096): the whole step recorded on both ranks, bitwise the same
    outputs and gradients, every DTensor described by its shard, and the ranks agree."""
    from xray.compare.cross_rank import check_ranks

    run_ranks(tmp_path, "--cases", "tp", "--hidden", "1024", timeout=600)
    for rank in (0, 1):
        result = outcome(tmp_path, "tp", rank)
        assert result["bitwise"] and result["stopped"] is None and result["records"] > 200
        records = xray.load_dump(tmp_path / "tp" / f"rank_{rank}").records
        up = next(r for r in records if r.module == "up" and r.op == "aten.addmm.default"
                  and r.inputs["mat2"].sharding is not None)
        assert up.inputs["mat2"].shape == (1024, 2048) and up.inputs["mat2"].sharding.global_shape == (1024, 4096)
    report = check_ranks(tmp_path / "tp")
    assert report.checked >= 10 and report.findings == []
