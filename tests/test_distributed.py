"""Beyond one process: torchrun ranks dump into rank folders, and compare pairs them by rank."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import xray
from xray.compare import compare_dumps

pytestmark = pytest.mark.slow  # a real model end to end, a deployment backend or the wheel (.ci/run)

SCRIPT = Path(__file__).parent / "scripts" / "dist_dump.py"


def torchrun(dump_dir: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(SCRIPT), str(dump_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    torchrun(root / "a")
    torchrun(root / "b")
    return root / "a", root / "b"


def test_each_rank_writes_its_own_dump(two_runs):
    a, _ = two_runs
    assert sorted(p.name for p in a.iterdir()) == ["rank_0", "rank_1"]
    for rank in (0, 1):
        dump = xray.load_dump(a / f"rank_{rank}")
        assert dump.complete and dump.header["rank"] == rank
        assert dump.records[-1].op == "c10d.allreduce_.default"  # the collective is recorded too
    # ranks saw different tokens, so their embeddings differ: nothing was clobbered
    r0, r1 = (xray.load_dump(a / f"rank_{r}") for r in (0, 1))
    emb0 = next(r for r in r0.records if r.op == "aten.embedding.default")
    emb1 = next(r for r in r1.records if r.op == "aten.embedding.default")
    assert emb0.outputs[0].stats != emb1.outputs[0].stats


def test_compare_pairs_rank_folders(two_runs, tmp_path):
    a, b = two_runs
    result = compare_dumps(a, b, progress=False)
    assert set(result.summary.ranks) == {"rank_0", "rank_1"}
    assert result.summary.failed == 0 and result.summary.first_divergence is None
    # a mismatched pair is named when one rank is missing on one side
    lonely = tmp_path / "lonely"
    shutil.copytree(b / "rank_0", lonely / "rank_0")
    partial = compare_dumps(a, lonely, progress=False)
    assert any("rank_1" in w for w in partial.summary.warnings)
