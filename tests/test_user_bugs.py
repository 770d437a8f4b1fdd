"""A user's own bug: a right kernel called with a wrong argument (tools/accuracy/user_bugs.py),
graded as the architecture sweep grades it (``--scenarios user-bug``): the first divergence must
name a call made inside the changed one, whatever the run's precision. The transformers models'
runs (each records both sides, and again to locate the call under de-dup) are marked slow."""
from __future__ import annotations

import contextlib
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
@pytest.mark.parametrize("noise", [None, "bf16"], ids=["fp32", "bf16"])
def test_gelu_run_as_silu_is_another_function_not_another_kernel(noise, tmp_path):
    """ERNIE's first GELU run as SiLU (a config's hidden_act read wrong): the bench's gelu and
    the target's silu are each right on their inputs, so the silu read as a substituted kernel
    and the verdict was "precision". They read the same values (one matched producer), and silu
    run on the gelu's sampled inputs is far off its sampled output: another function."""
    o = _user_bug_run("ernie", UserBug("wrong-activation", 0), tmp_path, noise=noise)
    fd = o.summary["first_divergence"]
    assert fd is not None and fd["cause"] == "target-only op" and o.exact, o.summary["verdict"]
    assert "another function" in fd["culprit"], fd["culprit"]


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


@pytest.mark.slow
def test_a_square_weight_used_transposed_under_bf16_is_born_at_the_transpose(tmp_path):
    """nanochat's second o_proj weight used transposed under bf16 autocast, the defaults: the
    matmul's statistics moved 16 %, inside bf16's warning band, and its weight's sample
    (elementwise another tensor) was never weighed, so "no row fails". Between the value both
    runs share (the bench's transpose) and what the matmul read lie only target-only moves and
    casts; their samples say which one moved the elements."""
    o = _user_bug_run("nanochat", UserBug("transposed-weight", 1), tmp_path)
    fd = o.summary["first_divergence"]
    assert fd is not None and fd["cause"] == "target-only op" and o.exact, o.summary["verdict"]
    assert "aten.t.default" in fd["culprit"], fd["culprit"]


def test_a_square_weight_used_transposed_at_a_real_size_under_bf16_is_born_at_the_transpose(tmp_path):
    """A 1024 x 1024 projection over 512 tokens, its weight used transposed under bf16 autocast,
    recorded with statistics and samples only (``X_DUMP_NUM=0``, as the defaults keep most records
    of a large model): the transpose the target alone runs is named, not left as a bf16 warning
    on the matmul."""
    import xray
    from xray.compare import compare_dumps

    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(1024, 1024, generator=g) * 0.03, torch.randn(1, 512, 1024, generator=g)

    def run(folder, weight, autocast):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast), \
                xray.dump(dump_dir=folder, X_DUMP_NUM=0) as d:
            torch.nn.functional.linear(x, weight(w)).sum()
        return d.folder

    bench = run(tmp_path / "b", lambda v: v, False)
    fd = compare_dumps(bench, run(tmp_path / "t", lambda v: v.t(), True)).summary.first_divergence
    assert fd is not None and fd["cause"] == "target-only op" and "aten.t.default" in fd["culprit"], fd
    assert compare_dumps(bench, run(tmp_path / "t2", lambda v: v, True)).summary.failed == 0
    # a transpose and its transpose back move every element twice and change nothing
    assert compare_dumps(bench, run(tmp_path / "t3", lambda v: v.t().t(), True)).summary.failed == 0


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_a_transpose_the_target_skips_at_a_real_size_is_a_bench_only_op(autocast, tmp_path):
    """The bench feeds a 1024 x 1024 projection its weight transposed, the target forgets to
    (512 tokens, statistics and samples only). The matmul computes right on its inputs and its
    statistics move 11 %: "precision" even in float32, a bench-only move being taken for one the
    target makes elsewhere. The weight the matmul reads differs on its sample far beyond what its
    matched producer carries, so the bench's transpose is a step the target skipped."""
    import xray
    from xray.compare import compare_dumps

    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(1024, 1024, generator=g) * 0.03, torch.randn(1, 512, 1024, generator=g)

    def run(folder, weight, autocast):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast), \
                xray.dump(dump_dir=folder, X_DUMP_NUM=0) as d:
            torch.nn.functional.linear(x, weight(w)).relu().sum()
        return d.folder

    bench = run(tmp_path / "b", lambda v: v.t(), False)
    fd = compare_dumps(bench, run(tmp_path / "t", lambda v: v, autocast)).summary.first_divergence
    assert fd is not None and fd["cause"] == "bench-only op" and "aten.t.default" in fd["culprit"], fd
    assert compare_dumps(bench, run(tmp_path / "t2", lambda v: v.t(), autocast)).summary.failed == 0


def _mlp_dump(folder, activation, scale, autocast=False):
    """A transformer MLP at a real size (1x512 tokens, hidden 1024, 2816 wide), recorded with the
    defaults; ``activation`` between its projections, ``scale`` applied to the hidden state as the
    caller spells it (``x / 8`` or ``x * 0.125``: one function, two ops)."""
    import xray

    g = torch.Generator().manual_seed(0)
    up, down = torch.randn(2816, 1024, generator=g) * 0.03, torch.randn(1024, 2816, generator=g) * 0.02
    x = torch.randn(1, 512, 1024, generator=g)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast), xray.dump(dump_dir=folder) as d:
        h = scale(torch.nn.functional.linear(x, up))
        torch.nn.functional.linear(activation(h), down).sum()
    return d.folder


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_an_activation_swapped_at_a_real_size_is_another_function(autocast, tmp_path):
    """GELU on the bench, SiLU on the target: two ops, each right on its own inputs, reading the
    same values (one matched producer). SiLU run on the gelu's sampled inputs is far off its
    sampled output, so the target's silu is born, not "another kernel of the same computation"."""
    from xray.compare import compare_dumps

    gelu, silu = torch.nn.functional.gelu, torch.nn.functional.silu
    r = compare_dumps(_mlp_dump(tmp_path / "b", gelu, lambda h: h / 8),
                      _mlp_dump(tmp_path / "t", silu, lambda h: h / 8, autocast))
    fd = r.summary.first_divergence
    assert fd is not None and fd["cause"] == "target-only op" and fd["target_op"] == "aten.silu.default", r.summary.verdict
    assert "another function" in fd["culprit"]


def test_one_function_spelled_with_another_op_computes_the_same_on_the_sample(tmp_path):
    """The bench scales by ``h / 3``, the target by ``h * (1 / 3)``: a div and a mul that pair
    with nothing. The mul run on the div's sampled inputs gives the div's sampled output to
    float32's rounding, so the pair is one function (and GELU against SiLU is not)."""
    from xray.compare.sample_local import swapped_local_error
    from xray.dump.reader import read_trace

    gelu, silu = torch.nn.functional.gelu, torch.nn.functional.silu

    def record(op, folder, activation, scale):
        return next(r for r in read_trace(_mlp_dump(folder, activation, scale)).records if r.op == op)

    div = record("aten.div.Tensor", tmp_path / "b", gelu, lambda h: h / 3)
    mul = record("aten.mul.Tensor", tmp_path / "t", gelu, lambda h: h * (1 / 3))
    same = swapped_local_error(div, mul, 0)
    assert same is not None and same.local <= 2 * torch.finfo(torch.float32).eps, same
    g = record("aten.gelu.default", tmp_path / "b2", gelu, lambda h: h / 3)
    s = record("aten.silu.default", tmp_path / "t2", silu, lambda h: h / 3)
    other = swapped_local_error(g, s, 0)
    assert other is not None and other.local > 1e-2, other


@pytest.mark.parametrize("call", [
    lambda x: torch.nn.functional.softmax(x, dim=-1), lambda x: torch.softmax(x, -1), lambda x: x.softmax(-1),
    lambda x: x.softmax(dim=3)], ids=["functional", "torch", "method", "keyword"])
def test_a_softmax_over_the_wrong_dimension_normalises_the_other_of_the_last_two(call):
    x = torch.randn(2, 3, 4, 5)
    wrong = WrongArgument("softmax-dim", UserBug("softmax-dim", 0))
    inside = CallsInside(wrong)
    with wrong, inside:
        y = call(x)
    assert wrong.hit and inside.calls == [("aten._softmax.default", "forward", 0)]
    assert torch.allclose(y.sum(-2), torch.ones(2, 3, 5)) and not torch.allclose(y.sum(-1), torch.ones(2, 3, 4))
    counter = WrongArgument("softmax-dim")
    with counter:
        torch.softmax(torch.randn(1, 4), -1), torch.softmax(torch.randn(3, 4, 5), 0)  # no other dim; not the last two
    assert counter.calls == 0


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_attention_probabilities_normalised_over_the_queries_at_a_real_size_are_an_argument(autocast, tmp_path):
    """Math-form attention at a real size (8 heads of 128, hidden 1024, 512 tokens), recorded with
    the defaults; the target's softmax runs over the queries. Its scores agree, its kernel is
    right on its inputs: only the call's ``dim`` tells, and compare names it, under bf16 too."""
    import xray
    from xray.compare import compare_dumps

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 512, 128, generator=g) for _ in range(3))

    def run(folder, bug):
        wrong = WrongArgument("softmax-dim", UserBug("softmax-dim", 0 if bug else -1))
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast), \
                xray.dump(dump_dir=folder) as d, wrong:
            torch.softmax(q @ k.transpose(-1, -2) / 128 ** 0.5, -1) @ v
        assert wrong.hit == bug
        return d.folder

    bench = run(tmp_path / "b", False)
    fd = compare_dumps(bench, run(tmp_path / "t", True)).summary.first_divergence
    assert fd is not None and fd["cause"] == "argument" and fd["target_op"] == "aten._softmax.default", fd
    assert compare_dumps(bench, run(tmp_path / "t2", False)).summary.failed == 0


@contextlib.contextmanager
def _dropped_term_recording(folder, dropped: bool, autocast: bool):
    """A no-grad recording with the defaults (under bf16 autocast with ``autocast``) in which,
    with ``dropped``, the first sum of two same-shape tensors keeps its second term alone, as
    ``_dropped_term`` leaves it."""
    import xray

    wrong = WrongArgument("dropped-term", UserBug("dropped-term", 0 if dropped else -1))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast), \
            xray.dump(dump_dir=folder) as d, wrong:
        yield d
    assert wrong.hit == dropped


def _residual_block_dump(folder, dropped: bool, autocast: bool):
    """A pre-norm residual block at a real size (1x512 tokens, hidden 1024), recorded with the
    defaults: ``h = x + W2 relu(W1 norm(x))``, then a final RMS norm; ``dropped``: ``h`` is the
    sublayer's output alone (the residual term left out, as ``_dropped_term`` leaves it)."""
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(2816, 1024, generator=g) * 0.03, torch.randn(1024, 2816, generator=g) * 0.02
    x = torch.randn(1, 512, 1024, generator=g)
    with _dropped_term_recording(folder, dropped, autocast) as d:
        n = torch.nn.functional.rms_norm(x, (1024,), eps=1e-6)
        h = x + torch.nn.functional.linear(torch.nn.functional.linear(n, w1).relu(), w2)
        h = h.float()
        (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).sum()
    return d.folder


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_a_residual_term_dropped_at_a_real_size_is_the_bench_only_add(autocast, tmp_path):
    """The target returns the sublayer's output where the bench adds the residual. No call the
    target runs is wrong on its inputs, and under bf16 autocast the final norm reads the sum
    through a cast only the target runs, which is right: "precision loss, computed correctly"
    before. The bench's add reads the residual, which the target's ops behind the norm never
    read: a term dropped, named at the bench's add."""
    from xray.compare import compare_dumps

    bench = _residual_block_dump(tmp_path / "b", False, False)
    r = compare_dumps(bench, _residual_block_dump(tmp_path / "t", True, autocast))
    fd = r.summary.first_divergence
    assert fd is not None and fd["cause"] == "bench-only op", r.summary.verdict
    add = next(x for x in r.rows if x.bench_seq == fd["culprit_bench_seq"])
    assert add.bench_op == "aten.add.Tensor" and add.target_seq is None, add
    assert compare_dumps(bench, _residual_block_dump(tmp_path / "t2", False, autocast)).summary.failed == 0


def _post_norm_dump(folder, dropped: bool, autocast: bool):
    """A post-norm block at a real size (1x512 tokens, hidden 1024), recorded with the defaults:
    ``LayerNorm(attn + x)`` with a small sublayer output, then a Linear; ``dropped``: the norm
    reads ``x`` alone (the sum's first term left out, as ``_dropped_term`` leaves it)."""
    g = torch.Generator().manual_seed(0)
    wo, w1 = torch.randn(1024, 1024, generator=g) * 0.002, torch.randn(2816, 1024, generator=g) * 0.03
    x = torch.randn(1, 512, 1024, generator=g)
    with _dropped_term_recording(folder, dropped, autocast) as d:
        attn = torch.nn.functional.linear(x, wo)
        h = torch.nn.functional.layer_norm(attn + x, (1024,))
        torch.nn.functional.linear(h, w1).relu().sum()
    return d.folder


def test_a_small_term_dropped_under_bf16_is_named_though_every_row_passes(tmp_path):
    """The target's norm reads the residual alone, its sublayer's output (about 6 % of it)
    computed and never read. Under bf16 autocast the norm and the Linear after it move within
    bf16's passing band: "no row fails" before. The bench's add reads a value nothing on the
    target reads: a term dropped, whatever the values."""
    from xray.compare import compare_dumps

    bench = _post_norm_dump(tmp_path / "b", False, False)
    r = compare_dumps(bench, _post_norm_dump(tmp_path / "t", True, True))
    fd = r.summary.first_divergence
    assert fd is not None and fd["cause"] == "bench-only op" and "nothing on the target reads" in fd["culprit"], \
        r.summary.verdict
    assert next(x for x in r.rows if x.bench_seq == fd["culprit_bench_seq"]).bench_op == "aten.add.Tensor"
    clean = compare_dumps(bench, _post_norm_dump(tmp_path / "t2", False, True))
    assert clean.summary.failed == 0 and not any("bench-only op" in (x.cause or "") for x in clean.rows)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_a_sublayer_dropped_before_the_models_pooling_is_born_at_the_bench_only_add(autocast, tmp_path):
    """The last residual sum at a real size (1x512 tokens, hidden 1024), ``y + x``, then a
    mean over the tokens (a pooler); the target keeps ``x`` alone, its sublayer's output ``y``
    computed and never read. The pooling reads the sum on the bench and the model's input on
    the target: "model input self differs" before, though both runs read one input. The
    bench's add reads ``y``, which nothing on the target reads: a term dropped, named there."""
    from xray.compare import compare_dumps

    g = torch.Generator().manual_seed(0)
    w = torch.randn(1024, 1024, generator=g) * 0.03
    x = torch.randn(1, 512, 1024, generator=g)

    def run(folder, dropped):
        with _dropped_term_recording(folder, dropped, autocast and dropped) as d:
            y = torch.nn.functional.linear(torch.nn.functional.layer_norm(x, (1024,)), w).relu()
            (y + x).mean(1)
        return d.folder

    bench = run(tmp_path / "b", False)
    r = compare_dumps(bench, run(tmp_path / "t", True))
    fd = r.summary.first_divergence
    assert fd is not None and fd["cause"] == "bench-only op" and "nothing on the target reads" in fd["culprit"], \
        r.summary.verdict
    assert next(x for x in r.rows if x.bench_seq == fd["culprit_bench_seq"]).bench_op == "aten.add.Tensor"
    assert compare_dumps(bench, run(tmp_path / "t2", False)).summary.failed == 0


def _last_layer_dump(folder, dropped: bool, autocast: bool, final_norm: bool):
    """The last layer of an encoder at a real size (1x512 tokens, hidden 1024), recorded with the
    defaults: ``r = W0 x`` (the residual stream), ``h = r + W2 relu(W1 norm(r))``, then, with
    ``final_norm``, a final layer norm; without it ``h`` is the model's output. ``dropped``:
    ``h`` is the sublayer's output alone (``residual + hidden`` written ``hidden``, as
    ``_dropped_term`` leaves it) or, without ``final_norm``, the residual alone (``hidden +
    residual`` written ``residual``)."""
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(1024, 1024, generator=g) * 0.03
    w1, w2 = torch.randn(2816, 1024, generator=g) * 0.03, torch.randn(1024, 2816, generator=g) * 0.02
    x = torch.randn(1, 512, 1024, generator=g)
    with _dropped_term_recording(folder, dropped, autocast) as d:
        r = torch.nn.functional.linear(x, w0)
        y = torch.nn.functional.linear(torch.nn.functional.linear(
            torch.nn.functional.layer_norm(r, (1024,)), w1).relu(), w2)
        if final_norm:
            torch.nn.functional.layer_norm(r + y, (1024,))
        else:
            _ = y + r
    return d.folder


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_a_residual_left_out_of_the_last_layer_pairs_the_final_norm_and_names_the_add(autocast, tmp_path):
    """Nemotron's audio encoder, drawn by the sweep: the last layer's residual left out, so the
    final norm reads the sublayer's output on the target and the bench's sum on the bench. The
    residual is read elsewhere too (the pre-norm), so no value goes unread, and the two norms
    read other producers: they paired with nothing and "no row fails" before, the output moved
    by 129 %. A sum only one side forms reads both of its terms' roles, so the norms pair; the
    bench's add reads the residual, which the target's ops behind its norm never read."""
    from xray.compare import compare_dumps

    bench = _last_layer_dump(tmp_path / "b", False, False, True)
    r = compare_dumps(bench, _last_layer_dump(tmp_path / "t", True, autocast, True))
    fd = r.summary.first_divergence
    assert fd is not None and fd["cause"] == "bench-only op", r.summary.verdict
    assert next(x for x in r.rows if x.bench_seq == fd["culprit_bench_seq"]).bench_op == "aten.add.Tensor"
    assert any(x.bench_op == x.target_op == "aten.native_layer_norm.default" and x.bench_seq > fd["culprit_bench_seq"]
               for x in r.rows), "the final norms pair"
    assert compare_dumps(bench, _last_layer_dump(tmp_path / "t2", False, autocast, True)).summary.failed == 0


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_the_models_last_sum_left_out_is_the_bench_only_add(autocast, tmp_path):
    """VideoMAE's last layer, drawn by the sweep: ``dense(h) + residual`` written ``residual``,
    the model's last op. The dense output is made by the target's last op and read by nothing,
    which is what a model's output looks like; the bench goes on to add it to a value both runs
    computed, and the target ends without that step: "no row fails" before, the output moved by
    a third. The bench's add is born there."""
    from xray.compare import compare_dumps

    bench = _last_layer_dump(tmp_path / "b", False, False, False)
    r = compare_dumps(bench, _last_layer_dump(tmp_path / "t", True, autocast, False))
    fd = r.summary.first_divergence
    assert fd is not None and fd["cause"] == "bench-only op", r.summary.verdict
    assert next(x for x in r.rows if x.bench_seq == fd["culprit_bench_seq"]).bench_op == "aten.add.Tensor"
    assert compare_dumps(bench, _last_layer_dump(tmp_path / "t2", False, autocast, False)).summary.failed == 0


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_a_three_term_sums_first_add_left_out_is_named_not_its_second(autocast, tmp_path):
    """SqueezeBERT's embeddings (and GPT-J's parallel residual), drawn by the sweep: ``w + p + t``
    at a real size (1x512 tokens, hidden 1024) after the three lookups, run as ``p + t``. Op,
    shape and path tell neither of the bench's two adds from the target's one, which paired with
    the first (it reads ``p`` too), so the bench's second add was named, "reads ``t``, which
    nothing on the target reads", though the target's add reads it. The second add reads ``p``
    and ``t`` through the first, the first ``p`` alone: the pair goes to the twin that reads
    more of its partner's values, and the first add is born there."""
    from xray.compare import compare_dumps

    g = torch.Generator().manual_seed(0)
    tables = [torch.randn(n, 1024, generator=g) * 0.02 for n in (8192, 512, 2)]
    w1 = torch.randn(2816, 1024, generator=g) * 0.03
    ids = torch.randint(0, 8192, (1, 512), generator=g)

    def run(folder, dropped):
        with _dropped_term_recording(folder, dropped, autocast and dropped) as d:
            w, p, t = (torch.nn.functional.embedding(i, e)
                       for i, e in zip((ids, torch.arange(512)[None], torch.zeros_like(ids)), tables))
            e = w + p + t
            torch.nn.functional.linear(torch.nn.functional.layer_norm(e, (1024,)), w1).relu().sum()
        return d.folder

    bench = run(tmp_path / "b", False)
    r = compare_dumps(bench, run(tmp_path / "t", True))
    fd = r.summary.first_divergence
    assert fd is not None and fd["cause"] == "bench-only op", r.summary.verdict
    adds = sorted(x.bench_seq for x in r.rows if x.bench_op == "aten.add.Tensor")
    assert len(adds) == 2 and fd["culprit_bench_seq"] == adds[0], (adds, r.summary.verdict)
    assert compare_dumps(bench, run(tmp_path / "t2", False)).summary.failed == 0
