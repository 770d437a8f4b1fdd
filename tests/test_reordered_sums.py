"""Target-only ops that only add and cast values both runs made (reordered_sums.py): a sum the
runs associate differently carries its terms' differences and is not an origin; an extra term is.

NeoMME upcasts its residual stream for an RMSNorm, so a bf16 training step accumulates the norm's
two float32 gradient paths first, casts their sum to bfloat16 and adds the residual's gradient in
an add of its own, which the float32 run folds into one chain. Its gradients are the rounding of
sums that cancel, so the reordered sum moved them by 3,600x their size: a false FAIL, "target-only
op", with every call recorded (sweep shard 29).
"""
import pytest
import torch
from conftest import sweep_noise_run

import xray
from xray.compare import compare_dumps

FAILING = ("fail", "nan/inf")


@pytest.mark.slow
def test_a_bf16_training_step_that_reorders_a_gradient_sum_has_no_fail_row(tmp_path):
    o = sweep_noise_run("neomme", tmp_path, defaults=False)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


class Sum(torch.nn.Module):
    def __init__(self, extra: bool) -> None:
        super().__init__()
        self.a, self.b, self.extra = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32), extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.a(x), self.b(x)
        y = a + b
        if self.extra:  # the bug: b added twice, by an op only the target runs
            y = y + b
        return torch.relu(y)


def test_a_term_added_twice_by_a_target_only_add_is_its_origin(tmp_path):
    """Both runs float32, the target's extra add reads two matched records that agree exactly:
    its difference (a whole term) is beyond what they carry, so it is named."""
    folders = []
    for name, extra in (("bench", False), ("target", True)):
        torch.manual_seed(0)
        model, x = Sum(extra), torch.randn(4, 32)
        with torch.no_grad(), xray.dump(dump_dir=tmp_path / name, dedup=False, dump_num=None) as d:
            model(x)
        folders.append(d.folder)
    fails = [r for r in compare_dumps(*folders).rows if r.status in FAILING]
    assert fails and fails[0].cause == "target-only op" and "aten.add.Tensor" in fails[0].culprit, \
        [(r.target_op, r.cause, r.culprit) for r in fails]
