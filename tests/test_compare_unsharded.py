"""A sharded run against a single-device run: ``xray-compare single/ sharded/ out.csv`` rebuilds
the ranks' tensors as the one run they stand for (xray/compare/unshard.py) and compares it with
the single run, naming the op and the rank of a fault.

Two gloo ranks on CPU run tests/scripts/sharded_run.py (an attention + MLP block, forward and
backward): tensor parallelism (DTensor, q/k/v/up by columns, o/down by rows) and DDP with a batch
split in two, each against the same block on one device; in the faulty runs rank 1's forward
``up`` matmul (its shard, under tensor parallelism) comes back 1 % off.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from xray.compare import compare_dumps
from xray.compare.cli import main as compare_main
from xray.compare.unshard import combined_stats
from xray.dump.model import Stats

from test_record_sharded import run_ranks

CASES = "single,single4,tp_step,tp_bug,ddp,ddp_bug,ddp_seed_bug,pos_single4,ddp_pos_bug"


# One worker builds the sharded and single runs once for the module (pyproject's --dist loadgroup).
pytestmark = pytest.mark.xdist_group("unsharded")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("unsharded")
    run_ranks(out, "--cases", CASES)
    return out


def _compare(runs: Path, single: str, sharded: str):
    return compare_dumps(runs / single / "rank_0", runs / sharded, progress=False)


@pytest.mark.slow
def test_a_sound_tensor_parallel_step_matches_the_single_run(runs):
    """Every record of the single run pairs with a rebuilt one, none fails, none is skipped."""
    s = _compare(runs, "single", "tp_step").summary
    assert s.matched == s.bench_records == s.target_records == 120
    assert s.failed == s.nan_inf == s.skipped == s.unmatched == 0
    assert s.verdict_kind == "precision" and s.cross_rank == []


def test_a_fault_in_one_ranks_shard_is_named_at_the_op_with_the_rank(runs):
    result = _compare(runs, "single", "tp_bug")
    fd = result.summary.first_divergence
    assert fd["op"] == "aten.addmm.default" and fd["module"] == "up" and fd["origin"] == "born"
    assert fd["rank"] == "rank_1"
    assert result.summary.verdict.startswith("born at aten.addmm.default in up (bench record #29) on rank rank_1")
    row = next(r for r in result.rows if r.index == fd["index"] and r.tensor == "out0")
    errors = dict(x.split() for x in row.note.split("error by rank's shard: ")[1].split(", "))
    assert float(errors["rank_0"]) < 1e-5 and float(errors["rank_1"]) == pytest.approx(0.0093, rel=0.1)


def test_ddp_averaged_gradients_are_compared_with_the_single_runs(runs):
    """Each rank's backward is the gradient of its half of the batch: rebuilt as the whole
    batch's (slices joined, a weight's gradient terms added, each halved past the loss's
    normalisation) and compared. The gradients DDP averages and writes back are compared too,
    against the full batch's; the forward is rebuilt by batch."""
    result = _compare(runs, "single4", "ddp")
    s = result.summary
    assert s.failed == s.nan_inf == 0 and s.verdict_kind == "precision"
    grads = [r for r in result.rows if r.bench_op == "aten.detach.default" and r.bench_name.startswith(
        tuple(f"{m}/" for m in ("q", "k", "v", "o", "up", "down"))) and r.status == "pass"]
    assert len(grads) == 12  # weight and bias of 6 Linears
    assert any("12 averaged gradients" in w for w in s.warnings)
    # each rank's own backward pairs with the single run's and is judged, none skipped
    assert s.unmatched == 0
    local = [r for r in result.rows if r.bench_seq is not None and r.bench_seq >= 39]
    assert len(local) > 60 and all(r.status in ("pass", "warning") for r in local)
    assert any("gradients of each rank's own batch, rebuilt as the whole batch's" in w for w in s.warnings)
    forward = [r for r in result.rows if r.bench_seq is not None and r.bench_seq < 39 and r.status != "unmatched"]
    assert len(forward) >= 38 and all(r.status == "pass" for r in forward)
    # the loss: each rank's mean of its own batch is one term of the single run's mean
    assert [r.status for r in forward if r.bench_op == "aten.mean.default"] == ["pass"] and s.skipped == 0


@pytest.mark.slow
def test_a_ddp_fault_on_one_rank_is_named_with_the_rank(runs):
    result = _compare(runs, "single4", "ddp_bug")
    fd = result.summary.first_divergence
    assert fd["op"] == "aten.addmm.default" and fd["module"] == "up" and fd["rank"] == "rank_1"
    failing_grads = [r for r in result.rows if r.bench_op == "aten.detach.default" and r.status == "fail"]
    assert failing_grads, "the averaged gradients carry the fault"


@pytest.mark.slow
def test_a_fault_in_one_ranks_backward_seed_is_named_with_the_rank(runs):
    """Each rank seeds its backward with ``ones_like`` of its own loss: the ranks read different
    inputs, but a fill reads none of their values, so every rank's seed must be the single run's.
    Rank 1's, 1 % off, is born there (it was skipped: "ranks hold different values"), and the
    loss before it, each rank's mean of its own batch added up, passes."""
    result = _compare(runs, "single4", "ddp_seed_bug")
    fd = result.summary.first_divergence
    assert (fd["op"], fd["origin"], fd["rank"]) == ("aten.ones_like.default", "born", "rank_1")
    assert [r.status for r in result.rows if r.bench_op == "aten.mean.default"] == ["pass"]


@pytest.mark.slow
def test_a_fault_in_work_every_data_parallel_rank_repeats_is_named_with_the_rank(runs):
    """A position table read with no batch dimension: under data parallelism the ranks read
    different inputs, but every rank computes these rows from values alike on every rank, so
    they must agree. Rank 1's, 1 % off, is born at the embedding with its rank (it was skipped as
    'ranks hold different values', and the first failing row was a gradient of unknown origin)."""
    result = compare_dumps(runs / "pos_single4" / "rank_0", runs / "ddp_pos_bug", progress=False)
    fd = result.summary.first_divergence
    assert (fd["op"], fd["module"], fd["origin"], fd["rank"]) == ("aten.embedding.default", "table", "born", "rank_1")
    assert result.summary.skipped == 0


@pytest.mark.slow
def test_the_command_line(runs, tmp_path, capsys):
    assert compare_main([str(runs / "single" / "rank_0"), str(runs / "tp_bug"), str(tmp_path / "out.csv")]) == 0
    out = capsys.readouterr().out
    assert "on rank rank_1" in out and "rebuilt into one run" in out
    # ranks that ran different calls cannot be put back together: one line, exit 2
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "rank_0").symlink_to(runs / "tp_step" / "rank_0")
    (mixed / "rank_1").symlink_to(runs / "ddp" / "rank_1")
    assert compare_main([str(runs / "single" / "rank_0"), str(mixed), str(tmp_path / "m.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert "ran different calls" in err and "\n" not in err


def test_statistics_of_disjoint_shards_combine_exactly():
    import torch

    from xray.dump.stats import tensor_stats

    t = torch.randn(6, 10, dtype=torch.float64)
    whole = tensor_stats(t)
    got = combined_stats([tensor_stats(t[:, :3]), tensor_stats(t[:, 3:])])
    assert got.min == whole.min and got.max == whole.max and got.numel == 60
    assert got.mean == pytest.approx(whole.mean, rel=1e-12) and got.std == pytest.approx(whole.std, rel=1e-12)
    assert combined_stats([whole, None]) is None
    assert combined_stats([Stats(None, None, None, None, nan=4, numel=4), whole]).nan == 4


@pytest.mark.slow
def test_real_size_tensor_parallel_fault(tmp_path):
    """Hidden 1024 (an MLP of 4096): the sound step fails no row and skips none; rank 1's 1 %
    fault is named at its op, with the rank."""
    run_ranks(tmp_path, "--cases", "single,tp_step,tp_bug", "--hidden", "1024", timeout=900)
    s = _compare(tmp_path, "single", "tp_step").summary
    assert s.failed == s.nan_inf == s.skipped == s.unmatched == 0
    fd = _compare(tmp_path, "single", "tp_bug").summary.first_divergence
    assert (fd["op"], fd["module"], fd["rank"]) == ("aten.addmm.default", "up", "rank_1")


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("llama_unsharded")
    run_ranks(out, "--cases", "llama_single,llama_tp,llama_ddp_grad_bug,llama_tp_norm_bug", timeout=900)
    return out


@pytest.mark.slow
def test_a_sound_tensor_parallel_llama_step_fails_no_row(llama_runs):
    """A transformers Llama under tensor parallelism, forward and backward. It used to fail about
    240 rows: DTensor's backward re-wraps each incoming gradient without a call (recorded as a
    model input that differs), a column-parallel input's gradient is all-reduced on plain tensors
    (its terms were not rebuilt, and the add that waits for the all-reduce runs after the
    weight's gradient, where the single run adds first), and ``slice_backward`` takes the
    shard's sizes (an argument that differs)."""
    s = _compare(llama_runs, "llama_single", "llama_tp").summary
    assert s.failed == s.nan_inf == 0
    assert s.verdict_kind == "precision"


@pytest.mark.slow
def test_a_ddp_fault_in_one_ranks_weight_gradient_is_named_with_the_rank(llama_runs):
    """Under data parallelism each rank's backward is rebuilt as the whole batch's; a weight's
    gradient is the ranks' terms added, which no slice of the single run holds: the rank is the
    one whose call is off its own inputs."""
    result = _compare(llama_runs, "llama_single", "llama_ddp_grad_bug")
    fd = result.summary.first_divergence
    assert (fd["op"], fd["origin"], fd["rank"]) == ("aten.mm.default", "born", "rank_1")
    # a weight's gradient runs after its module's backward hook: the recorder files it under the parent
    assert fd["module"] in ("layers.1.mlp.down_proj", "layers.1.mlp"), fd


@pytest.mark.slow
def test_a_fault_in_work_every_tensor_parallel_rank_repeats_is_named_with_the_rank(llama_runs):
    """A norm every rank computes alike, 1 % off on rank 1: the ranks' copies disagree. The
    copy farthest from the single run stands for the value (a replicated DTensor's too), so the
    row fails; each rank's call is recomputed on the inputs that rank held, so it is born there,
    and the rank whose copy is off is named. The column-parallel matmuls after it computed right
    on their own rank's copy: inherited, never a local error (which, on every q/k/v call alike,
    once read as a consistent bf16 step and made the norm's fault precision loss)."""
    result = _compare(llama_runs, "llama_single", "llama_tp_norm_bug")
    fd = result.summary.first_divergence
    assert (fd["op"], fd["module"], fd["origin"], fd["rank"]) == ("aten.rsqrt.default", "layers.1.input_layernorm",
                                                                   "born", "rank_1")
    q = next(r for r in result.rows if r.bench_name.startswith("layers.1.self_attn.q_proj/aten.mm.default"))
    assert (q.status, q.origin) == ("fail", "inherited") and q.local_err < 1e-5
