"""Replay's backend-vs-baseline rule (xray/replay/tolerance.py): one output at a time, by the
shared numerics rule; a secondary output defined differently is its own status, not a mismatch."""
from __future__ import annotations

import torch

from xray.backends.base import ReplayStatus
from xray.replay.tolerance import judge_backend, judge_layout

SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def _sdpa_outputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 32, generator=g) for _ in range(3))
    return list(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True))


def test_sdpa_secondary_output_defined_differently_is_not_a_mismatch():
    out, lse = _sdpa_outputs()
    weights = torch.rand(2, 4, 16, 16)  # what the export's decomposition returns instead of the logsumexp
    a = judge_backend([out, lse], [out * (1 + 1e-7), weights], op=SDPA)
    assert a.status == ReplayStatus.SECONDARY_DIFFERS and not a.ok and a.status.supported
    assert a.outputs[0].startswith("output 0: agrees")
    assert "output 1: shape (2, 4, 16, 16), baseline (2, 4, 16)" in a.message
    assert "logsumexp" in a.message and a.max_abs is not None


def test_wrong_primary_output_is_still_a_mismatch():
    out, lse = _sdpa_outputs()
    a = judge_backend([out, lse], [out * 1.001, torch.rand(2, 4, 16, 16)], op=SDPA)
    assert a.status == ReplayStatus.MISMATCH and "output 0: differs" in a.message
    same_shape = judge_backend([out, lse], [out, lse + 0.1], op=SDPA)  # same definition, wrong values
    assert same_shape.status == ReplayStatus.MISMATCH and "output 1: differs" in same_shape.message


def test_small_outputs_are_judged_relative_to_their_own_size():
    """Issue 17 class 2: a 1e-3 relative error on a variance of ~5e-4 hid under atol=1e-5."""
    var = torch.full((64,), 5e-4) + torch.rand(64, generator=torch.Generator().manual_seed(0)) * 1e-4
    assert judge_backend([var], [var * (1 + 1e-3)]).status == ReplayStatus.MISMATCH
    assert judge_backend([var], [var * (1 + 2e-6)]).ok  # ~16 ulp: a reordered reduction


def test_fp16_precision_and_exact_integers():
    x = torch.randn(256, generator=torch.Generator().manual_seed(1))
    assert judge_backend([x], [x.half().float()], precision=torch.float16).ok
    assert not judge_backend([x], [x.half().float()]).ok
    i = torch.arange(10)
    assert judge_backend([i], [i]).ok and judge_backend([i], [i + (i == 3)]).status == ReplayStatus.MISMATCH
    assert judge_layout([x], [x.half()]).ok and not judge_layout([x], [x[:3]]).ok
