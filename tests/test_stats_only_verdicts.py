"""Verdicts on statistics-only recordings under legitimate reduced precision (stop 36).

A device run is usually recorded with statistics only: nothing can be recomputed, so noise must
be told from a bug by the statistics alone. Every noise case below raised false FAIL rows before
(measured at d2aefa6: a deep CNN under TF32 56 rows, a ViT under TF32 83, fp16 runs through a
``finfo(float16).min`` mask 4-20, an fp16 LayerNorm's mean 4, a bf16 max pool's indices 1);
each rule that clears them also keeps a 2e-2 bug under the same noise named at its call.
The runs are real transformers models (tiny configs, random weights) through the accuracy
benchmark's harness (tools/accuracy).
"""
from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
from conftest import sweep_noise_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import xray  # noqa: E402
from accuracy.faults import CorruptCall, ReducedPrecisionMatmul, relative  # noqa: E402
from accuracy.runner import run_scenario  # noqa: E402
from accuracy.scenario import Fault, Scenario  # noqa: E402
from xray.compare import compare_dumps  # noqa: E402

pytest.importorskip("transformers")


def _scenario(*args, **kw) -> Scenario:
    """A TF32-emulated target compared as a run whose header allows no TF32: the rules here read
    the level from what the run itself shows (a device's header, or compare's --tf32 on, sets it
    instead: test_dedup_verdicts, test_module_statistics_under_declared_tf32...)."""
    return Scenario(*args, tf32_declared=False, **kw)

NOISE = [  # (arch, noise, dump): what each exercises
    ("mobilenet", "tf32", "trace"),  # loss growing through 52 convolutions, one born call
    ("mobilenet", "tf32", "module"),  # the same, modules entered before the modules inside them
    ("vit", "tf32", "trace"),  # one patch convolution, then matmuls that round again
    ("qwen2", "tf32", "trace"),  # a row inheriting from a row settled later
    ("llama-eager", "fp16", "trace"),  # scalar_tensor(finfo(float16).min): a constant, judged from its statistics
    ("bert", "fp16", "trace"),  # LayerNorm's mean of fp16 inputs that agree within fp16's tolerance
    ("resnet", "bf16", "trace"),  # max pooling's indices where bf16 breaks a near-tie another way
    # a LayerNorm over a LayerNorm's output: its mean cancels to ~1e-8, judged at its input's
    # magnitude (held-out set 5, stop 37)
    ("swin", "tf32", "trace"),
    # masked_fill(mask, finfo(dtype).min): -3.4e38 in float32, -65504 in float16 (held-out set 7)
    ("deberta", "fp16", "trace"),
    # TF32 changes a convolution's output layout, so F.linear after it runs mm + add on one side
    # and addmm on the other: different kinds, not a pair (held-out set 7)
    ("segformer", "tf32", "trace"),
]


@pytest.mark.slow
def test_training_step_key_bias_gradient_is_rounding_not_a_bug(tmp_path):
    """A key projection's bias gets a gradient that is 0 in exact arithmetic (softmax ignores a
    shift of every key): a sum that cancels to ~1e-12, judged at its input's magnitude, then a
    view and a detach of it that carry its 100% statistics difference. Before stop 38: 4 FAIL rows."""
    s = _scenario("t/vit", "noise/tf32/optimizer-step/stats", "vit", noise="tf32", data=False, backward=True,
                 optimizer="foreach")
    o = run_scenario(s, tmp_path)
    assert o.harness_error is None and o.crash is None, o.trace or o.harness_error
    assert o.summary["failed"] == 0 and o.summary["first_divergence"] is None, o.summary["first_divergence"]
    fault = Fault("aten._foreach_addcdiv_.ScalarList", 0, "rel", 2e-2)  # the step's parameter update, wrong
    o = run_scenario(_scenario("t/vit", "bug", "vit", fault=fault, noise="tf32", data=False, backward=True,
                              optimizer="foreach"), tmp_path)
    assert o.exact and o.summary["first_divergence"]["origin"] == "born", o.summary["first_divergence"]
    # BERT's key bias gradient is rounding noise on both runs (relative error 1e3); Adam squares
    # it (3e6): beyond the first order, no jump means a bug (causality.LINEAR_REGIME)
    o = run_scenario(_scenario("t/bert", "noise/tf32/optimizer-step/stats", "bert", noise="tf32", data=False,
                               backward=True, optimizer="foreach", dedup=True, dump_num=5), tmp_path)
    assert o.summary["failed"] == 0 and o.summary["first_divergence"] is None, o.summary["first_divergence"]


@pytest.mark.slow
@pytest.mark.parametrize("arch,noise,dump", NOISE, ids=["-".join(c) for c in NOISE])
def test_statistics_only_noise_raises_no_fail_row(arch, noise, dump, tmp_path):
    o = run_scenario(_scenario(f"t/{arch}", f"noise/{noise}/stats", arch, noise=noise, dump=dump, data=False), tmp_path)
    assert o.harness_error is None and o.crash is None, o.trace or o.harness_error
    assert o.summary["failed"] == 0 and o.summary["first_divergence"] is None, o.summary["first_divergence"]
    assert o.summary["warned"] > 0  # the noise is there, and reported as precision loss


@pytest.mark.parametrize("arch,fault,noise", [
    # deep: 29 TF32 convolutions before it leave its 64-element input 0.9 % off element by element
    # (its statistics 0.14 %), so a 2 % error is within 3x of what its inputs carry on statistics
    # and samples alone; its recorded self-check (record/self_check.py) measures the 2 % itself
    ("mobilenet", Fault("aten.convolution.default", 30, "rel", 2e-2), "tf32"),
    ("qwen2", Fault("aten.mm.default", 5, "rel", 2e-2), "tf32"),
    # no noise: the convolutions after a 1e-3 bug jump as TF32's would, but the ones before it
    # were exact, so they never set a precision level that would hide it
    ("mobilenet", Fault("aten.convolution.default", 2, "rel", 1e-3), None),
    ("swin", Fault("aten.addmm.default", 20, "rel", 2e-2), "tf32"),  # after the cancelling means above
], ids=["mobilenet-conv30-tf32", "qwen2-mm5-tf32", "mobilenet-conv2-fp32", "swin-addmm20-tf32"])
def test_statistics_only_bug_is_named_at_its_call(arch, fault, noise, tmp_path):
    o = run_scenario(_scenario(f"t/{arch}", "bug/stats", arch, fault=fault, noise=noise, data=False), tmp_path)
    assert o.harness_error is None and o.crash is None, o.trace or o.harness_error
    assert o.exact, o.summary["first_divergence"]
    assert o.summary["first_divergence"]["origin"] == "born"


def _llama_1024():
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=1, num_attention_heads=16,
                                   num_key_value_heads=4, vocab_size=2048, max_position_embeddings=512,
                                   attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _record(model, ids, folder, *modes):
    """One statistics-only trace; ``modes`` are entered first, below the recorder, so it records
    what they make (the harness's order)."""
    with ExitStack() as stack:
        for m in modes:
            stack.enter_context(m)
        xray.begin_dump(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0, dump_dir=folder)
        try:
            with torch.no_grad():
                model(input_ids=ids)
        finally:
            path = xray.end_dump()
    return path


@pytest.mark.slow
@pytest.mark.real_size
def test_statistics_only_tf32_at_real_size_is_clean_and_a_bug_is_named(tmp_path):
    """A Llama layer at hidden 1024, GQA, eager attention, 512 tokens: TF32-rounded matmuls with
    statistics only give no FAIL row; a 2e-2 error in one projection under the same rounding is
    named at that call."""
    model = _llama_1024()
    ids = torch.randint(0, 2048, (1, 512), generator=torch.Generator().manual_seed(0))
    bench = _record(model, ids, tmp_path / "bench")
    noisy = _record(model, ids, tmp_path / "tf32", ReducedPrecisionMatmul())
    summary = compare_dumps(bench, noisy).summary
    assert summary.failed == 0 and summary.first_divergence is None and summary.warned > 0
    fault = CorruptCall("aten.mm.default", 5, relative(2e-2))
    buggy = _record(model, ids, tmp_path / "bug", fault, ReducedPrecisionMatmul())
    assert fault.hit
    fd = compare_dumps(bench, buggy).summary.first_divergence
    mms = [r for r in xray.load_dump(buggy).records if r.kind == "op" and r.op == "aten.mm.default"]
    assert fd is not None and fd["target_seq"] == mms[5].seq and fd["origin"] == "born", fd


def test_values_below_float16s_normal_range_are_its_range_not_a_bug(tmp_path):
    """float16 holds values below 6.1e-05 as subnormals and rounds smaller ones to 0: squared
    gradients ~1e-8, scaled by Adam's 1e-3, are 0 there. Statistics only, both runs below that
    range: each element is within half a subnormal step of the bench's, float16's rounding there
    (``Tolerance.tiny``), so the products pass, and the float32 sum of those zeros is at most a
    warning, never a target-only cast's or a sum's bug. A value above the range stays judged."""
    def run(dtype, folder, scale=1e-3):
        x = (torch.randn(256, generator=torch.Generator().manual_seed(0)) * 1e-3).to(dtype)
        with xray.dump(dump_dir=folder, X_DEDUP=False, X_DUMP_NUM=0) as d:
            (x * x * scale).float().sum()
        return d.folder

    rows = compare_dumps(run(torch.float32, tmp_path / "b"), run(torch.float16, tmp_path / "t")).rows
    by_op = {r.bench_op: r for r in rows if r.bench_op}
    assert [r.status for r in rows if r.bench_op == "aten.mul.Tensor"] == ["pass", "pass"]
    assert by_op["aten.sum.default"].status == "warning"
    assert not any(r.status in ("fail", "nan/inf") for r in rows)
    # a 1e3 scale keeps them in float16's normal range: a 10 % error there is a bug, not the range
    with torch.no_grad():
        b = run(torch.float32, tmp_path / "b2", 1e3)
        t = run(torch.float16, tmp_path / "t2", 1.1e3)
    assert any(r.status == "fail" for r in compare_dumps(b, t).rows)


@pytest.mark.parametrize("saved", (0, 64), ids=("statistics", "tensors"))
def test_float32_subnormals_a_kernel_flushes_are_the_range_not_a_bug(tmp_path, saved):
    """The same dtype on both sides, but the target's kernels flush subnormals to 0 (GPU tensor
    cores and TF32 math do; here the CPU's own ``torch.set_flush_denormal``). Activations a chain
    of near-zero products left at 1e-42 (held-out MobileViT's last stage, uncalibrated) are 0
    there: its convolution was born and 3 rows failed. Both runs below float32's smallest normal
    number: the range, not a bug. A 10% error on normal values of the same run stays a failure."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    torch.set_flush_denormal(False)
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 8, 1)
    x = torch.randn(1, 8, 4, 4, generator=torch.Generator().manual_seed(0))

    def run(folder, flush, scale=1e-41, bump=1.0):
        torch.set_flush_denormal(flush)
        try:
            with torch.no_grad(), xray.dump(dump_dir=folder, X_DEDUP=False, X_DUMP_NUM=saved) as d:
                tiny = torch.nn.functional.conv2d(x * scale, conv.weight)  # no bias: stays subnormal
                (tiny * 2.0 + x * bump).sum()
        finally:
            torch.set_flush_denormal(False)
        return d.folder

    rows = compare_dumps(run(tmp_path / "b", False), run(tmp_path / "t", True)).rows
    tiny_rows = [r for r in rows if r.bench_op in ("aten.mul.Tensor", "aten.convolution.default")][:3]
    assert any(r.status == "warning" and "smallest normal" in r.culprit for r in tiny_rows), \
        [(r.bench_op, r.status, r.culprit) for r in rows]
    assert not any(r.status in ("fail", "nan/inf") for r in rows), [(r.bench_op, r.status, r.culprit) for r in rows]
    buggy = compare_dumps(run(tmp_path / "b2", False), run(tmp_path / "t2", True, bump=1.1)).rows
    assert any(r.status == "fail" for r in buggy)


class _Stem(torch.nn.Conv2d):
    """A convolution under another class name (BiT's WeightStandardizedConv2d is one)."""


def _record_modules(folder, *modes):
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Stem(3, 64, 7, stride=2, padding=3), torch.nn.ReLU(),
                                torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(64 * 112 * 112, 10))
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    dbg = xray.PrecisionDebugger(dump_path=folder, model=model, task="statistics")
    with ExitStack() as stack:
        for m in modes:
            stack.enter_context(m)
        dbg.start()
        with torch.no_grad():
            model(x)
        dbg.stop()
    dbg.close()
    return next(Path(folder).rglob("*.h5"))


def test_module_statistics_under_declared_tf32_are_precision_and_a_bug_still_fails(tmp_path):
    """A module-level statistics dump at 224x224: a module may hold matmuls and convolutions, so
    where the run allows TF32 (its header, or declared: Rules(tf32=True), compare's --tf32 on) a
    module's statistics within 3x TF32's rounding are precision. Before, only ops named as
    matmuls and convolutions got TF32's level, and the first convolution's module (a class of
    its own name, inputs agreeing) was born: 4 FAIL rows here, every row of held-out BiT's 46.
    A 5e-2 error in that convolution's output still fails there."""
    from xray.numerics.rules import Rules

    bench = _record_modules(tmp_path / "bench")
    noisy = _record_modules(tmp_path / "tf32", ReducedPrecisionMatmul())
    summary = compare_dumps(bench, noisy, rules=Rules(tf32=True)).summary
    assert summary.failed == 0 and summary.first_divergence is None and summary.warned > 0, summary.first_divergence
    fault = CorruptCall("aten.convolution.default", 0, relative(5e-2))
    buggy = _record_modules(tmp_path / "bug", fault, ReducedPrecisionMatmul())
    assert fault.hit
    fd = compare_dumps(bench, buggy, rules=Rules(tf32=True)).summary.first_divergence
    assert fd is not None and fd["op"] == "_Stem" and fd["origin"] == "born", fd


def test_a_bf16_matmul_bug_recorded_with_statistics_only_is_born_on_its_self_check(tmp_path):
    """XGLM (2 layers) with the recorder's defaults, fp32 against bf16 autocast, 5e-2 on layer 1's
    probabilities @ values bmm, recorded with statistics only. Its error (5.1e-2) is within bf16's
    warning band, and its kind has 2 statistics-only calls, too few for the outlier rule. Its
    recorded self-check (record/self_check.py: Freivalds' estimate of its error against its own
    inputs) reads the 5 % the bug put there, where bf16 itself makes 2e-3: a local error, born."""
    from accuracy import zoo
    from accuracy.scenarios import RECORDER_DEFAULTS

    arch = zoo.register(zoo.Entry("xglm", "XGLMModel"))
    o = run_scenario(Scenario("t/xglm", "bug", arch, noise="bf16", fault=Fault("aten.bmm.default", 3, amount=5e-2),
                              **RECORDER_DEFAULTS), tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact, fd
    assert fd["origin"] == "born" and fd["cause"] == "local error" and 3e-2 < fd["local_err"] < 8e-2, fd


def test_a_few_wrong_elements_in_an_autocast_weight_cast_with_statistics_only_are_born_there(tmp_path):
    """CLIP's text encoder under bf16 autocast with the recorder's defaults: three elements of
    layer 1's fc2 weight cast (2048 elements, recorded with statistics only) doubled. The
    cast's extremes stay its input's, its mean moves 1.5e-4 where bf16's rounding of the
    weight may move it 3.4e-4, and its sample holds none of the three: compare found no
    divergence. Its self-check reads 4.5e-2: born at the cast."""
    from accuracy import zoo
    from accuracy.scenarios import RECORDER_DEFAULTS

    arch = zoo.register(zoo.Entry("clip_text_model", "CLIPTextModel"))
    o = run_scenario(Scenario("t/clip-text", "bug", arch, noise="bf16",
                              fault=Fault("aten._to_copy.default", 31, "few", 1.0), **RECORDER_DEFAULTS), tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact and fd["origin"] == "born" and fd["cause"] == "local error", fd


def _zoo_noise_run(model_type: str, cls: str, tmp_path, **kw) -> list:
    """A bf16-autocast noise run of an untuned transformers architecture
    (tools/accuracy/zoo.py), recorded with the recorder's defaults."""
    from accuracy import zoo
    from accuracy.scenarios import RECORDER_DEFAULTS

    arch = zoo.register(zoo.Entry(model_type, cls))
    s = Scenario(f"t/{model_type}", "noise", arch, noise="bf16", **kw, **RECORDER_DEFAULTS)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    return o


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about a minute
def test_a_norms_mean_of_centred_values_is_judged_at_its_terms_magnitude(tmp_path):
    """CLIP's vision encoder normalizes the output of another LayerNorm: the second norm's mean
    (its saved ``out1``) is the sum of centred values, ~1e-8 from terms of 1, and moves by 28 %
    under bf16 autocast. Its kind's other calls move far less, so it was an outlier of its kind
    (statistics_only.kind_outliers): born there, a false FAIL on the sweep's first run. What its
    input carries, grown by that sum's cancellation (statistics_only.carried_error), explains it."""
    o = _zoo_noise_run("clip_vision_model", "CLIPVisionModel", tmp_path)
    assert o.summary["failed"] == 0 and o.summary["nan_inf"] == 0, o.summary.get("first_divergence")


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about a minute
def test_a_backward_row_within_what_its_incoming_gradient_carries_is_not_born(tmp_path):
    """BART's bf16 training step: the encoder's LayerNorm backward cancels gradients down to
    1e-12, which move 30-60 % because the incoming gradient moves 17-39 % (its statistics and
    sample). They were born "inputs within precision (local error not measured)", 3 false FAIL
    rows and the run's first divergence. A row within ``precision_factor`` x what its inputs
    carry is what it received (causality._within_what_it_receives); a matmul bug's row under the
    same noise still is not (test_a_bf16_matmul_bug_recorded_with_statistics_only_is_born_on_its_self_check)."""
    from accuracy import runner, zoo
    from accuracy.scenarios import RECORDER_DEFAULTS

    arch = zoo.register(zoo.Entry("bart", "BartModel"))
    s = Scenario("t/bart", "noise", arch, noise="bf16", backward=True, **RECORDER_DEFAULTS)
    bench_model, target_model = runner._models(s)
    dumps = [runner._record(s, side, m, tmp_path / side, []) for side, m in (("bench", bench_model),
                                                                             ("target", target_model))]
    rows = compare_dumps(*dumps, rules=runner._rules(s)).rows
    norms = [r for r in rows if "native_layer_norm_backward" in (r.target_op or "")]
    assert norms, "no LayerNorm backward was recorded"
    assert [r.status for r in norms if r.status in ("fail", "nan/inf")] == [], \
        [(r.index, r.culprit) for r in norms if r.status == "fail"]


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about a minute
def test_a_folded_sum_before_any_precision_loss_is_judged_at_its_terms_magnitude(tmp_path):
    """Cohere's bf16 training step, recorded with the defaults: the loss's backward starts outside
    any module with sums de-dup folds into an earlier record. The first recorded consumer of one
    (an add of two gradients that cancel to 1e-7 from terms of 0.4) differs 100 % and was an
    inherited FAIL "from a call not recorded": the folded-sum judgement (what its recorded argument
    carries, at the terms' magnitude: statistics_only.folded_sum) was skipped because no call
    before it had shown a precision level yet. The level is one way to justify a carried error;
    the sum's own terms are another, and need none."""
    o = _zoo_noise_run("cohere", "CohereModel", tmp_path, backward=True)
    assert o.summary["failed"] == 0 and o.summary["nan_inf"] == 0, o.summary.get("first_divergence")


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about a minute
def test_an_attention_backward_that_cancels_is_judged_at_its_terms_magnitude(tmp_path):
    """Canary's decoder cross-attention under a bf16 training step, recorded with the defaults:
    its keys' scores are all alike, so the fused attention backward's dQ cancels to ~1e-13 from
    terms of ~1e-3 and moves 115 % between the runs. With nothing recomputed it was born
    "inputs within precision (local error not measured)", the run's first divergence and 4 FAIL
    rows. What its inputs carry, grown by the backward's own cancellation
    (statistics_only.attention_backward_terms: dQ, dK and dV's chained products), explains it."""
    o = _zoo_noise_run("canary", "CanaryModel", tmp_path, backward=True)
    assert o.summary["failed"] == 0 and o.summary["nan_inf"] == 0, o.summary.get("first_divergence")


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about a minute
def test_a_norms_mean_fed_by_a_folded_call_is_judged_with_its_cancellation(tmp_path):
    """CodeGen under emulated TF32, recorded with the defaults: the final LayerNorm reads a
    residual add that de-dup folded into the layer's previous add. Its saved mean (out1) moved
    5.2e-4 of itself while the stream it averages moved 1.4e-4: the mean of a residual stream
    nearly cancels. What a row fed by a folded call carries in was taken without its sum's
    cancellation (causality._carried_in), so it stayed an inherited FAIL; it is now grown by
    ``statistics_only.cancellation``, which counts a mean's terms at 1/n of what it reads."""
    from accuracy import zoo
    from accuracy.scenarios import RECORDER_DEFAULTS

    arch = zoo.register(zoo.Entry("codegen", "CodeGenModel"))
    o = run_scenario(Scenario("t/codegen", "noise", arch, noise="tf32", **RECORDER_DEFAULTS), tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0 and o.summary["nan_inf"] == 0, o.summary.get("first_divergence")


class _NormalisedHead(torch.nn.Module):
    """A linear then a layer norm whose output is the loss's only input: the loss (its mean
    square) is constant in exact arithmetic up to the norm's eps, so the norm's input gradient is
    eps/var = 1e-5 of its terms, which fp32 resolves and bf16 rounds to noise (Segformer's last
    norm in a bf16 training step)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.proj, self.norm = torch.nn.Linear(width, width), torch.nn.LayerNorm(width, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


def _training_step(model: torch.nn.Module, x: torch.Tensor, folder: Path, bf16: bool, fault=None) -> Path:
    with ExitStack() as stack:
        if fault is not None:
            stack.enter_context(fault)
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16))
        d = stack.enter_context(xray.dump(dump_dir=folder, X_DEBUG=0x10A))  # the defaults, with backward
        model(x).float().square().mean().backward()
    model.zero_grad()
    return d.folder


def test_a_norm_gradient_below_bf16s_rounding_of_its_terms_is_rounding_and_a_bug_in_it_still_fails(tmp_path):
    """Judged at the coarser of the two runs' precisions: the bf16 run's norm gradient is rounding
    noise 100x the fp32 one's and is no bug (before: the norm's backward born, 6 FAIL rows); the
    same gradient off by 10 % of its terms (beyond bf16's rounding of them) still fails there."""
    torch.manual_seed(0)
    model, x = _NormalisedHead(), torch.randn(2, 16, 64)
    bench = _training_step(model, x, tmp_path / "fp32", bf16=False)
    clean = compare_dumps(bench, _training_step(model, x, tmp_path / "bf16", bf16=True))
    assert clean.summary.failed == 0 and clean.summary.first_divergence is None, clean.summary.first_divergence
    # it did differ: judged, not passed; recomputed (its bias, past X_DUMP_NUM, is read for its
    # shape only: local._unsaved_unread), else held to bf16's rounding of its terms
    assert any(r.target_op == "aten.native_layer_norm_backward.default" and r.status == "warning"
               and ("rounding" in r.note or "computed correctly on its inputs" in r.note) for r in clean.rows)

    def wrong(t: torch.Tensor) -> torch.Tensor:  # 10 % of the incoming gradient's size, added
        return t + 0.1 * t.new_full(t.shape, 1.0 / t.shape[-1] ** 0.5 / 8)

    fault = CorruptCall("aten.native_layer_norm_backward.default", 0, wrong, "backward")
    bug = compare_dumps(bench, _training_step(model, x, tmp_path / "bug", bf16=True, fault=fault))
    assert fault.hit
    fd = bug.summary.first_divergence
    assert fd is not None and fd["op"] == "aten.native_layer_norm_backward.default" and fd["origin"] == "born", fd


@pytest.mark.slow  # an untuned transformers architecture recorded four times: about 20 s
def test_cpmant_norm_scale_bug_under_bf16_is_born_at_its_broadcast_mul_and_its_noise_is_clean(tmp_path):
    """CPM-Ant's own LayerNorm multiplies by ``rsqrt(var)`` of shape (batch, seq, 1), recorded with
    statistics only by the defaults (layer 0 already saved that signature's tensors). A 5 % bug
    there under bf16 autocast was missed: the rsqrt (40 elements) was not sampled whole, so
    nothing was recomputed. Samples drawn axis by axis line it up with the output's: the local
    error on the sample names the mul. The same samples see the bf16 rounding a square doubles in
    its ``pow``, sampled where its statistics agree; the pow computed right on those elements, so
    it received that difference (rule O11a): the clean run has no FAIL row."""
    from accuracy import zoo
    from accuracy.scenarios import RECORDER_DEFAULTS

    arch = zoo.register(zoo.Entry("cpmant", "CpmAntModel"))
    o = run_scenario(Scenario("t/cpmant", "bug", arch, noise="bf16", fault=Fault("aten.mul.Tensor", 10, amount=5e-2),
                              **RECORDER_DEFAULTS), tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact and fd["origin"] == "born", fd
    o = _zoo_noise_run("cpmant", "CpmAntModel", tmp_path)
    assert o.summary["failed"] == 0 and o.summary["nan_inf"] == 0, o.summary.get("first_divergence")


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 20 s
def test_a_norm_backward_that_cancels_is_judged_at_its_terms_size(tmp_path):
    """ModernVBERT's first norm reads the embedding (std 0.017, so rstd ~57): under a bf16 training
    step its input gradient, recorded with statistics only, is 1/30 of its terms (rstd x weight x
    incoming gradient: ``statistics_only.norm_backward_terms``) and moves 12 % where the other
    norms' move 1.5 %. It was an outlier of its kind, born, a false FAIL on the sweep's first run;
    grown by that cancellation, what its incoming gradient carries explains it."""
    o = _zoo_noise_run("modernvbert", "ModernVBertModel", tmp_path, backward=True)
    assert o.summary["failed"] == 0 and o.summary["nan_inf"] == 0, o.summary.get("first_divergence")


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 10 s
def test_a_call_the_bench_folded_is_judged_on_its_own_local_error(tmp_path):
    """CWM's attention clones two tensors of one shape: the fp32 bench folds the second call into
    the first's record, the bf16 target (one input bf16, one fp32 under autocast) keeps two. A 5 %
    bug in the second was never judged: a target record with no partner was only "unmatched".
    Its local error needs no partner: wrong on its own inputs, it is born there."""
    from accuracy import zoo
    from accuracy.scenarios import RECORDER_DEFAULTS

    arch = zoo.register(zoo.Entry("cwm", "CwmModel"))
    o = run_scenario(Scenario("t/cwm", "bug", arch, noise="bf16", fault=Fault("aten.clone.default", 1, amount=5e-2),
                              **RECORDER_DEFAULTS), tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact and fd["origin"] == "born", fd


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 20 s
def test_a_gradient_cast_to_bf16_and_back_is_held_to_bf16_rounding(tmp_path):
    """AIMv2's RMSNorm returns ``weight * h.to(input_dtype)``: under a bf16 training step its
    backward casts the float32 gradient to bfloat16 and back, two calls the float32 bench never
    makes. The widening cast is looked through to the narrowing one, so the change across both is
    bfloat16's rounding; it was held to float32's and called a target-only op, born in the norm
    (every call recorded, the sweep's first run)."""
    from accuracy import zoo

    arch = zoo.register(zoo.Entry("aimv2_vision_model", "Aimv2VisionModel"))
    o = run_scenario(Scenario("t/aimv2", "noise", arch, noise="bf16", backward=True, dedup=False, dump_num=None),
                     tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0 and o.summary["nan_inf"] == 0, o.summary.get("first_divergence")


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 20 s
def test_a_call_one_side_folds_keeps_its_role_through_calls_it_did_not_match(tmp_path):
    """Idefics2's grouped-query attention backward sums the key's and the value's gradients with
    one signature: the fp32 bench folds the second sum (and the slice after it) into the first's
    record, the bf16 target keeps two (one float32 after a cast). The bench's slice stands for the
    value's; paired by dtype with the key's, it failed with cosine -0.02. Its target twin reads an
    unmatched sum, looked through to the matched view it sums (``matching._through_unmatched``):
    another role than the bench's, so it is not paired."""
    o = _zoo_noise_run("idefics2", "Idefics2Model", tmp_path, backward=True)
    assert o.summary["failed"] == 0 and o.summary["nan_inf"] == 0, o.summary.get("first_divergence")


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 10 s
def test_a_slice_is_weighed_against_its_inputs_sample_not_its_statistics_alone(tmp_path):
    """Qwen3-VL's vision rotary embedding slices half of each query head, recorded with statistics
    only. Under TF32 the half's statistics move 4.9e-4 where the whole query's move 1.0e-4: a
    subset's mean and spread are not bounded by the whole's. It read as "precision loss, and
    more", an inherited FAIL with 21 rows behind it (the sweep's first run). Its input's sample
    differs by 2.8e-4, elementwise, as the sample of the slice (3.6e-4): what the query carries
    in is the larger of its statistics' and its sample's error (``carried_error``)."""
    o = sweep_noise_run("qwen3_vl_vision", tmp_path, noise="tf32", backward=False)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 15 s
def test_a_cancelling_sum_with_its_local_error_measured_is_rounding_whatever_a_folded_input_carries(tmp_path):
    """ALBERT runs one shared layer 12 times; de-dup folds the repeats. A loss made constant by the
    final LayerNorm leaves that norm's input gradient the rounding of a sum that cancels: 6.5e-10
    in fp32, 9.4e-6 under bf16 autocast, both within the rounding of their terms. Its mean and
    rstd come from a folded forward call, whose difference (a mean that cancels too) exceeded
    the level calls before it showed: an inherited FAIL with 99 rows behind it, although the
    call computed right on its inputs. A value 0 in exact arithmetic on both sides carries
    nothing, whether or not its local error was measured (``statistics_only.holds_rounding``)."""
    o = sweep_noise_run("albert", tmp_path, noise="bf16", backward=True)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow  # two untuned transformers architectures, each recorded twice: about 30 s
@pytest.mark.parametrize("model_type, noise", [("falcon_mamba", "tf32"), ("yoso", "bf16")])
def test_a_nonlinear_op_carries_what_its_inputs_samples_make_through_it(model_type, noise, tmp_path):
    """Falcon-Mamba's ``rsqrt`` of a small norm's variance (8 values), statistics only under TF32,
    moved 1.9e-3 at its peak where its input carried 1.1e-4 at its own: its peak is the input's
    smallest value, whose relative error is the largest. Read as "precision loss, and more": an
    inherited FAIL with 148 rows behind it (the sweep's first run); YOSO's bf16 square likewise
    (4.4e-2 against 6.2e-3: born). An elementwise op's inputs carry what their sampled
    differences make through the op itself (``sample_local.carried_on_sample``)."""
    o = sweep_noise_run(model_type, tmp_path, noise=noise, backward=False)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 15 s
def test_a_call_the_bench_folded_into_another_signature_is_judged_on_its_own_sample(tmp_path):
    """MiniMax's residual scale (``x * 1``) in a bf16 training step: the target records it (after
    autocast's cast, its dtype gives it a signature of its own), the bench folded it into a record
    of another. Taken for an op the target inserted, it could only pass by moving values, so the
    view reading it stayed an inherited FAIL with 5 rows behind it (the sweep's first run). The
    bench ran that call too: its own local error, on its sample, judges it, as a substituted
    kernel's does."""
    o = sweep_noise_run("minimax", tmp_path, noise="bf16", backward=True)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow
def test_a_bias_gradient_zero_in_exact_arithmetic_sums_what_its_terms_carry(tmp_path):
    """PoolFormer's bf16 training step, every call recorded: its token mixer (a pooling minus its
    input) ignores a shift of each channel, so each group norm's bias gradient is 0 in exact
    arithmetic. The bench's cancels to float32 rounding; the target's sums the differences its
    incoming gradient carries from the bf16 blocks, 3e4 times the bench's value. Both are 0 at
    what their terms hold (statistics_only._within_rounding): no FAIL row (4 before)."""
    o = sweep_noise_run("poolformer", tmp_path, defaults=False, noise="bf16", backward=True)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 20 s
def test_a_call_whose_self_check_measured_it_right_is_no_outlier_of_its_kind(tmp_path):
    """MobileViT's bf16 training step: an attention gradient's ``bmm`` makes 256 dot products of
    8 bf16 terms that cancel, so its statistics move 18 % while its kind's other calls move
    0.4 %. Its self-check measured it exactly right on its inputs (local error 0), yet it was an
    outlier of its kind on statistics alone (statistics_only.kind_outliers): born there, the
    run's one false FAIL row. A local error measured no larger than a CPU kernel's at its dtype
    outranks what statistics infer (a bf16 matmul 5 % off, under its long sum's device floor, is
    still judged by its kind: the quick set's noise+bug/bf16/stats scenarios)."""
    o = _zoo_noise_run("mobilevit", "MobileViTModel", tmp_path, backward=True)
    assert o.summary["failed"] == 0 and o.summary["nan_inf"] == 0, o.summary.get("first_divergence")


@pytest.mark.slow
def test_a_row_that_passes_yet_whose_self_check_is_wrong_is_born_there(tmp_path):
    """transformers' GIT vision model (built tiny, as the architecture sweep builds it), fp32
    against bf16 autocast, three elements of its last layer norm's output doubled (the sweep's
    sparse fault), the recorder's defaults. Its statistics and 32-element sample stay within
    bf16's band, so the row passed and compare said "no row fails", though the fault moves the
    final output 1,500x what bf16 itself does; the layer norm's recorded self-check reads 0.10.
    A passing row whose self-check is beyond every floor of its dtype is weighed by it."""
    from accuracy import zoo
    from accuracy.scenarios import RECORDER_DEFAULTS

    entry = next((x for x in zoo.listed() if x.model_type == "git"), None)
    if entry is None:
        pytest.skip("this transformers has no git")
    fault = Fault("aten.native_layer_norm.default", 4, "few", 1.0)
    o = run_scenario(Scenario("t/git", "bug", zoo.register(entry), noise="bf16", fault=fault, **RECORDER_DEFAULTS),
                     tmp_path)
    assert o.harness_error is None and o.crash is None, o.trace or o.harness_error
    assert o.exact, o.summary["verdict"]
    assert o.summary["first_divergence"]["origin"] == "born"
