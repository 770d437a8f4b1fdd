"""FSDP2 against a single-device run: ``xray-compare single/ fsdp/ out.csv`` drops FSDP2's data
movement (its all-gather buffers, ``fsdp.*`` ops and collectives), rebuilds each rank's own
backward as the whole batch's, and compares the reduce-scattered gradient shards, joined, with
the single run's gradients. The recorder describes FSDP2's all-gather and reduce-scatter buffers
as unwritten memory until written (their values were whatever the allocator returned).

Two gloo ranks on CPU run tests/scripts/sharded_run.py: the attention + MLP block with
``fully_shard`` on each Linear and on the block, a batch of 4 split in two, against the block on
one device with the whole batch; in the faulty run rank 1's forward ``up`` matmul is 1 % off.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import xray
from xray.compare import compare_dumps
from xray.dump.model import unwritten

pytestmark = pytest.mark.slow  # two gloo ranks record an FSDP2 step and a single run: about 90 s

from test_record_sharded import run_ranks


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    run_ranks(out, "--cases", "single4,fsdp,fsdp_bug")
    return out


def test_fsdp_buffers_are_recorded_unwritten_until_written(runs):
    """FSDP2's all-gather buffer (``aten.empty``, filled by ``all_gather_copy_in`` and the
    all-gather, neither of which declares its write), the reduce-scatter's output, and the
    unsharded parameters FSDP2 re-allocates with ``untyped_storage().resize_`` before the
    backward: their values before the write are not data."""
    for rank in (0, 1):
        records = list(xray.load_dump(runs / "fsdp" / f"rank_{rank}").records)
        written_into = [m for r in records for n, m in r.input_tensors()
                        if (r.op, n.split(".")[0]) in {("fsdp.all_gather_copy_in.default", "all_gather_output"),
                                                      ("c10d._allgather_base_.default", "output_tensor"),
                                                      ("c10d._reduce_scatter_base_.default", "output_tensor"),
                                                      ("fsdp.split_with_sizes_copy.default", "out")}]
        assert len(written_into) > 40 and all(unwritten(m) for m in written_into)
        assert sum(1 for r in records if r.op == "fsdp.split_with_sizes_copy.default" and r.direction == "backward") == 6
        # what the all-gather read (this rank's shard, inside the buffer) is data
        inputs = [m for r in records if r.op == "c10d._allgather_base_.default" for n, m in r.input_tensors()
                  if n == "input_tensor"]
        assert inputs and all(m.stats is not None for m in inputs)


def test_a_sound_fsdp_step_matches_the_single_run(runs):
    result = compare_dumps(runs / "single4" / "rank_0", runs / "fsdp", progress=False)
    s = result.summary
    assert s.matched == s.bench_records == 120 and s.unmatched == 0
    assert s.failed == s.nan_inf == 0 and s.verdict_kind == "precision"
    grads = [r for r in result.rows if r.bench_op == "aten.detach.default" and r.bench_name.startswith(
        tuple(f"{m}/" for m in ("q", "k", "v", "o", "up", "down"))) and r.status == "pass"]
    assert len(grads) == 12  # the reduce-scattered shards of weight and bias of 6 Linears, joined
    # each rank's own backward is rebuilt as the whole batch's and judged, and so is the loss:
    # each rank's mean of its half is one term of the single run's mean
    assert [r.status for r in result.rows if r.status == "skip"] == []
    assert [r.status for r in result.rows if r.bench_op == "aten.mean.default"] == ["pass"]
    assert any("12 reduce-scattered gradient shards" in w for w in s.warnings)


def test_a_fault_in_one_fsdp_rank_is_named_with_the_rank(runs):
    result = compare_dumps(runs / "single4" / "rank_0", runs / "fsdp_bug", progress=False)
    fd = result.summary.first_divergence
    assert (fd["op"], fd["module"], fd["origin"], fd["rank"]) == ("aten.addmm.default", "up", "born", "rank_1")
    assert any(r.status == "fail" and r.bench_op == "aten.detach.default" for r in result.rows), \
        "the gradient shards carry the fault"
