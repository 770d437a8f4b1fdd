"""A multi-tensor op's items on their samples: ``_foreach_addcdiv_`` (AdamW's update) is, item by
item, ``addcdiv`` on the items at its own index, so what an item's inputs carry through the op is
measured on their samples as a pointwise op's is (sample_local._item_call). Adam's first step
sends each update to lr x sign(gradient): a gradient element near 0 whose sign TF32 flips moves
its parameter by 2 lr, far beyond what its inputs' statistics carry. Found on a held-out set's
TF32 training steps (MobileViT, LeViT: an inherited FAIL "and more" on a legitimate run)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import xray
from xray.compare.sample_local import _item_call, carried_on_sample, sample_local_error
from xray.dump.reader import read_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))


def _update(folder: Path, flip: bool):
    """One ``_foreach_addcdiv_`` over three parameters, recorded with statistics only; ``flip``:
    two of the second item's update directions have the other sign."""
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(n, generator=g) for n in (8, 16, 4)]
    avg = [torch.randn(n, generator=g) for n in (8, 16, 4)]
    denom = [a.abs() + 1e-8 for a in avg]
    if flip:
        avg[1][[3, 7]] *= -1
    xray.begin_dump(X_DUMP_NUM=0, dump_dir=folder)
    try:
        torch._foreach_addcdiv_(params, avg, denom, [-1e-3, -1e-3, -1e-3])
        torch._foreach_norm(params)
    finally:
        path = xray.end_dump()
    records = read_trace(Path(path)).records
    return (next(r for r in records if r.op == "aten._foreach_addcdiv_.ScalarList"),
            next(r for r in records if r.op.startswith("aten._foreach_norm")))


def test_an_items_difference_carried_through_the_op_is_measured_on_its_sample(tmp_path):
    bench, _ = _update(tmp_path / "b", False)
    target, _ = _update(tmp_path / "t", True)
    out = target.outputs[0][1]  # item 1 (16 elements: sampled whole)
    carried = carried_on_sample(bench, target, out, 1)
    # the flipped update moves those parameters by 2e-3 against a peak near 1e-3 plus the parameter
    peak = max(abs(v) for v in bench.outputs[0][1].stats.sample)
    assert carried is not None and carried == pytest.approx(2e-3 / peak, rel=1e-3)
    assert carried_on_sample(bench, target, target.outputs[0][0], 0) == 0.0  # item 0: the same inputs
    # on the target's own inputs the op computed right
    local = sample_local_error(target, out, 1)
    assert local is not None and local.local <= local.floor


def test_a_reduction_over_each_item_is_not_taken_for_a_pointwise_one(tmp_path):
    _, norm = _update(tmp_path / "b", False)
    assert _item_call(norm, 1) is None  # _foreach_norm: one value an item


@pytest.mark.slow
def test_a_held_out_tf32_training_step_of_mobilevit_has_no_fail(tmp_path):
    from accuracy.runner import run_scenario
    from accuracy.scenarios import holdout, with_defaults

    s = next(with_defaults(s) for s in holdout(9) if s.name == "holdout9/noise/tf32/optimizer-step/mobilevit/44")
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]
