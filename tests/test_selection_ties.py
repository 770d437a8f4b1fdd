"""A selection's indices (sort, topk, argmax, max.dim, max pooling) are right up to the order of
ties: two runs agree when their indices pick equal values of the input. One rule
(xray/numerics/selections.py), used by compare's local error and by replay's backend judge."""
from __future__ import annotations

import sys
import types

import torch

import xray
from xray.backends import registry
from xray.backends.base import ReplayStatus
from xray.backends.torch_eager import TorchEager
from xray.compare import compare_dumps
from xray.demo.synthetic import Op, write_dump
from xray.numerics.selections import differing_picks
from xray.replay import matrix, runner
from xray.replay.job import JobContext, execute
from xray.replay.runner import ReplayConfig, replay_dump
from xray.replay.tolerance import judge_backend

# ties within every row: 3, 1 and 0 twice, 5 and 1 three times
X = torch.tensor([[3., 1., 3., 2., 1., 0., 0., 5.], [0., 0., 5., 5., 0., 1., 1., 1.]])


def _reversed_ties(indices: torch.Tensor) -> torch.Tensor:
    """``torch.sort(X, stable=True)``'s indices with every run of tied values in the other order."""
    values = X.gather(-1, indices)
    out = indices.clone()
    for row in range(X.shape[0]):
        for v in values[row].unique():
            at = (values[row] == v).nonzero().flatten()
            out[row, at] = indices[row, at.flip(0)]
    return out


def test_indices_picking_equal_values_agree_and_wrong_ones_do_not():
    values, idx = torch.sort(X, stable=True)
    tied = _reversed_ties(idx)
    assert not torch.equal(tied, idx)
    assert not differing_picks("aten.sort.stable", 1, {"self": X}, idx, tied).any()
    wrong = idx.clone()
    wrong[0, 0] = 2  # a 3 where the 1 belongs
    assert differing_picks("aten.sort.stable", 1, {"self": X}, idx, wrong).any()
    repeated = idx.clone()
    repeated[0, 1] = idx[0, 0]  # the same 1 twice: still "equal values", but no sort
    assert differing_picks("aten.sort.stable", 1, {"self": X}, idx, repeated).any()
    assert differing_picks("aten.sort.stable", 0, {"self": X}, values, values) is None  # the values: not indices
    # one index per slice, kept dim or not, and over the whole input
    assert not differing_picks("aten.max.dim", 1, {"self": X, "dim": 1}, torch.tensor([7, 2]),
                               torch.tensor([7, 3])).any()
    assert differing_picks("aten.max.dim", 1, {"self": X, "dim": 1}, torch.tensor([7, 2]), torch.tensor([7, 4])).any()
    assert not differing_picks("aten.argmax.default", 0, {"self": X}, torch.tensor(7), torch.tensor(7)).any()
    assert not differing_picks("aten.topk.default", 1, {"self": X, "k": 3}, X.topk(3).indices,
                               torch.tensor([[7, 2, 0], [3, 2, 7]])).any()
    assert differing_picks("aten.topk.default", 1, {"self": X, "k": 3}, X.topk(3).indices,
                           torch.tensor([[7, 2, 99], [3, 2, 7]])).any()  # out of range
    pooled = torch.zeros(1, 1, 4, 4)  # relu's zeros: every window a tie
    _, where = torch.ops.aten.max_pool2d_with_indices(pooled, [2, 2])
    assert not differing_picks("aten.max_pool2d_with_indices.default", 1, {"self": pooled}, where, where + 1).any()


def test_compare_judges_a_tie_broken_another_way_right_on_its_inputs(tmp_path):
    """The target's sort (a GPU's, an unstable one) orders ties its own way: same input, same
    values. Its indices were a FAIL born at the sort."""
    values, idx = torch.sort(X, stable=True)
    run = lambda indices: [Op("aten.sort.default", values, inputs={"self": X}, sources={"self": "input"},  # noqa: E731
                              save_inputs=True, more_outputs=[indices])]
    tied = compare_dumps(write_dump(tmp_path / "a", run(idx)), write_dump(tmp_path / "b", run(_reversed_ties(idx))))
    assert tied.summary.first_divergence is None
    assert tied.rows[1].status != "fail" and tied.rows[1].local_err == 0.0, tied.rows[1]
    wrong = idx.clone()
    wrong[0, [0, 3]] = idx[0, [3, 0]]  # a 1 and a 3 swapped: the values no longer sorted by these
    bug = compare_dumps(write_dump(tmp_path / "c", run(idx)), write_dump(tmp_path / "d", run(wrong)))
    assert bug.rows[1].status == "fail" and bug.summary.first_divergence["cause"] == "local error"


class _TiesReversed(TorchEager):
    """PyTorch eager on its inputs reversed along the last dim, indices mapped back: each tie of a
    sort, topk or max along that dim comes out the other way, as another kernel may return it."""

    def load(self, artifact, module, args):
        def run(inputs):
            with torch.no_grad():
                out = module(*[t.flip(-1) for t in inputs])
            n, outs = inputs[0].shape[-1], out if isinstance(out, (list, tuple)) else [out]
            return [t if t.is_floating_point() else n - 1 - t for t in outs]

        return run


class _InProcess:
    """runner.Worker's interface without the process (what is tested is the judge, not isolation)."""

    def __init__(self, spec, *args, **kwargs):
        self.ctx = JobContext()

    def run(self, job, timeout):
        return execute(job, self.ctx)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_replay_judges_ties_as_compare_does(tmp_path, monkeypatch):
    """``xray-replay`` reported aten.sort MISMATCH where only the tie order of its indices differed
    from the baseline's; a sort along another dim, which the backend gets wrong, stays a MISMATCH."""
    module = types.ModuleType("xray.backends._ties_reversed")
    module.BACKEND = _TiesReversed
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry.PRESETS, "ties-reversed", registry.Preset("_ties_reversed", {"device": "cpu"}))
    monkeypatch.setattr(runner, "Worker", _InProcess)
    monkeypatch.setattr(matrix, "write_heatmap", lambda result, out: None)  # matplotlib: seconds, not the point
    with torch.no_grad(), xray.dump(dump_dir=tmp_path / "dump", X_DEDUP=False, X_DUMP_NUM=100) as d:
        torch.sort(X, dim=-1, stable=True), torch.topk(X, 3), X.max(dim=-1), torch.sort(X, dim=0, stable=True)
    result = replay_dump(d.folder, ReplayConfig(backends=["ties-reversed"], out=tmp_path / "out", repeats=0,
                                                progress=False))
    rows = [r for r in result.rows if r.backend == "ties-reversed"]
    assert [ReplayStatus(r.status) for r in rows] == [ReplayStatus.OK] * 3 + [ReplayStatus.MISMATCH], \
        [(r.op, r.error) for r in rows]
    assert rows[0].max_abs_err == 0.0  # a distance between tied indices is no error


def test_judge_backend_reads_the_arguments_only_for_differing_indices():
    values, idx = torch.sort(X, stable=True)
    asked = []
    arguments = lambda: asked.append(1) or {"self": X}  # noqa: E731
    assert judge_backend([values, idx], [values, idx], op="aten.sort.stable", arguments=arguments).ok and not asked
    a = judge_backend([values, idx], [values, _reversed_ties(idx)], op="aten.sort.stable", arguments=arguments)
    assert a.ok and asked and "output 1: agrees up to the order of ties" in a.outputs[1]
    assert judge_backend([values, idx], [values, _reversed_ties(idx)], op="aten.sort.stable").status \
        == ReplayStatus.MISMATCH  # no input to look at: indices judged exactly
