"""A user's own bug: a right kernel called with a wrong argument (tools/accuracy/user_bugs.py),
graded as the architecture sweep grades it (``--scenarios user-bug``): the first divergence must
name a call made inside the changed one, whatever the run's precision. The transformers models'
runs (each records both sides, and again to locate the call under de-dup) are marked slow."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy.user_bugs import CallsInside, UserBug, WrongArgument  # noqa: E402


def _user_bug_run(model_type: str, bug: UserBug, tmp_path: Path, noise: str | None = "bf16", defaults: bool = True):
    from accuracy import zoo
    from accuracy.runner import run_scenario
    from accuracy.scenario import Scenario
    from accuracy.scenarios import RECORDER_DEFAULTS

    entry = next((x for x in zoo.listed() if x.model_type == model_type), None)
    if entry is None:
        pytest.skip(f"this transformers has no {model_type}")
    flags = RECORDER_DEFAULTS if defaults else {"dedup": False, "dump_num": None}
    o = run_scenario(Scenario(f"t/{model_type}", "user-bug", zoo.register(entry), noise=noise, user_bug=bug, **flags),
                     tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    return o


def test_the_wrong_argument_goes_into_one_call_and_its_aten_calls_are_noted():
    q = torch.randn(1, 2, 8, 16)
    mask = torch.zeros(8, 8).masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), -torch.inf)
    wrong = WrongArgument("dropped-mask", UserBug("dropped-mask", 1))
    inside = CallsInside(wrong)
    with wrong, inside:
        first = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        second = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert wrong.hit and wrong.calls == 2 and inside.calls
    assert torch.equal(first, torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask))
    assert torch.equal(second, torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert all(direction == "forward" for _, direction, _ in inside.calls)


@pytest.mark.slow
@pytest.mark.parametrize("defaults", [True, False], ids=["defaults", "every-call"])
def test_a_mask_dropped_from_a_decomposed_bf16_attention_is_a_bench_only_op(defaults, tmp_path):
    """Falcon under bf16 autocast runs attention as ops (scores, the mask's add, softmax): with
    the mask dropped the target skips the add. The softmax's input differs far beyond bf16 while
    its target producer passes; it was "precision: no row fails" with the logits 35 % off."""
    o = _user_bug_run("falcon", UserBug("dropped-mask", 0), tmp_path, defaults=defaults)
    fd = o.summary["first_divergence"]
    assert fd is not None and fd["cause"] == "bench-only op" and o.exact, o.summary["verdict"]


@pytest.mark.slow
def test_a_doubled_attention_scale_under_bf16_is_an_argument_whatever_the_rows_status(tmp_path):
    """GPT-2's second attention with twice its scale, under bf16 autocast: its output moves within
    bf16's band (the row passed, or was a warning whose re-run with the bench's scale read under
    the device floor), yet the logits move more than bf16 itself moves them."""
    o = _user_bug_run("gpt2", UserBug("attention-scale", 1), tmp_path)
    fd = o.summary["first_divergence"]
    assert fd is not None and fd["cause"] == "argument" and "scale" in fd["culprit"] and o.exact, o.summary["verdict"]


@pytest.mark.slow
def test_a_sum_the_bench_alone_runs_in_backward_is_no_skipped_step(tmp_path):
    """An fp16 autocast training step of Llama (eager attention), statistics only, the defaults:
    autograd accumulates each RMS norm's input gradient in another order on each run, so the
    bench runs an add the target does not. That is the same sum associated otherwise: taken for
    a bench-only op it read 4 false FAIL rows."""
    from accuracy.runner import run_scenario
    from accuracy.scenarios import quick, scenarios, with_defaults

    s = next(with_defaults(x) for x in quick(scenarios())
             if with_defaults(x).name == "noise/fp16/backward/stats/llama-eager/177/defaults")
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0, o.summary["verdict"]


@pytest.mark.slow
def test_a_transpose_the_bench_alone_runs_is_no_skipped_step(tmp_path):
    """Decision Transformer's bf16 training step: the bench transposes a float32 weight, the
    target transposes autocast's bf16 copy of it, so the bench's transpose has no partner. A move
    computes nothing: taken for a skipped step it read 1 false FAIL row."""
    from conftest import sweep_noise_run

    o = sweep_noise_run("decision_transformer", tmp_path, noise="bf16", backward=True)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow
def test_a_square_weight_used_transposed_is_born_at_the_inserted_transpose(tmp_path):
    """GPT-J's v_proj weight (32 x 32) used transposed, float32 on both sides: the transpose the
    target alone runs keeps every statistic of the weight, so it was looked through as a move
    that changed nothing, and the matmul, right on its inputs, read as precision loss with the
    logits 43 % off. Its sample is not its input's: it put the elements elsewhere."""
    o = _user_bug_run("gptj", UserBug("transposed-weight", 6), tmp_path, noise=None)
    fd = o.summary["first_divergence"]
    assert fd is not None and fd["cause"] == "target-only op" and o.exact, o.summary["verdict"]
    assert "aten.t.default" in fd["culprit"], fd["culprit"]
