"""Cross-rank consistency within one run: all-reduce, broadcast and all-gather results and
replicated DTensors must agree across ranks; the first op and rank where they do not is named,
with no bench needed, and compare's verdict says so.

Two gloo ranks on CPU (tests/scripts/sharded_run.py): tensor parallelism of an attention + MLP
block forward and backward, and functional collectives; in the faulty runs rank 1's all-reduce
results come back 1 % off.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import xray

from xray.compare import compare_dumps
from xray.compare.cross_rank import Copy, _judge, check_ranks, main as cross_rank_main

from test_record_sharded import run_ranks


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cross_rank")
    run_ranks(out, "--cases", "tp,tp_fault,funcol_fault")
    return out


@pytest.mark.slow
def test_ranks_of_a_sound_tensor_parallel_step_agree(runs):
    report = check_ranks(runs / "tp")
    assert report.ranks == ["rank_0", "rank_1"]
    assert report.checked >= 10 and report.findings == []


@pytest.mark.slow
def test_an_altered_all_reduce_is_named_with_its_rank(runs):
    first = check_ranks(runs / "funcol_fault").first
    assert first is not None
    assert first.op == "_c10d_functional.all_reduce.default" and first.occurrence == 0
    assert first.wrong == ["rank_1"] and "sum of the ranks' inputs" in first.why
    assert first.difference == pytest.approx(0.01, rel=0.05)


@pytest.mark.slow
def test_inside_tensor_parallelism_the_first_altered_reduction_is_named(runs):
    """Row-parallel layers all-reduce their partial outputs: the first (attention's o, reduced by
    RowwiseParallel's output hook, after o returns) is named, on rank 1."""
    report = check_ranks(runs / "tp_fault")
    first = report.first
    assert first.op == "_c10d_functional.all_reduce.default" and first.occurrence == 0
    assert first.wrong == ["rank_1"]
    seq = next(c.seq for c in first.copies if c.rank == "rank_1")
    records = xray.load_dump(runs / "tp_fault" / "rank_1").records
    assert [r.module for r in records if r.seq < seq][-3:] == ["o"] * 3  # o's own kernels just before


@pytest.mark.slow
def test_compare_says_the_ranks_disagree_without_a_failing_row(runs):
    """The faulty run against itself fails no row; its ranks still disagree."""
    s = compare_dumps(runs / "funcol_fault", runs / "funcol_fault", progress=False).summary
    assert s.failed == 0
    assert s.verdict_kind == "bug"
    assert s.verdict.startswith("ranks disagree where they must agree: all-reduce result of "
                                "_c10d_functional.all_reduce.default #0")
    assert "rank_1 wrong" in s.verdict
    clean = compare_dumps(runs / "tp", runs / "tp", progress=False).summary
    assert clean.cross_rank == [] and clean.verdict_kind == "precision"


@pytest.mark.slow
def test_the_command_line(runs, tmp_path, capsys):
    assert cross_rank_main([str(runs / "tp")]) == 0
    assert "all agree" in capsys.readouterr().out
    assert cross_rank_main([str(runs / "funcol_fault")]) == 1
    assert "FIRST DISAGREEMENT: all-reduce result" in capsys.readouterr().out
    assert cross_rank_main([str(runs / "tp" / "rank_0")]) == 2  # one dump: nothing to check across
    err = capsys.readouterr().err.strip()
    assert err.startswith("xray cross-rank: error:") and "rank_<r>" in err and "\n" not in err


def _copy(rank: str, mean: float) -> Copy:
    return Copy(rank, 7, "layer", "out0", (4,), (0.0, 1.0, mean, 0.5), (0.25, mean))


def test_with_more_ranks_the_odd_one_out_is_named():
    key = ("broadcast result", "c10d.broadcast_.default", "", "out0")
    finding = _judge(key, 0, [_copy("rank_0", 0.5), _copy("rank_1", 0.5), _copy("rank_2", 0.6), _copy("rank_3", 0.5)])
    assert finding.wrong == ["rank_2"] and "3 ranks agree" in finding.why
    two = _judge(key, 0, [_copy("rank_0", 0.5), _copy("rank_1", 0.6)])
    assert two.wrong == [] and "cannot tell" in two.line()
    assert _judge(key, 0, [_copy("rank_0", 0.5), _copy("rank_1", 0.5)]) is None
