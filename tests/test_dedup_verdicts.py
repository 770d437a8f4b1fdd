"""Verdicts on de-duplicated dumps (X_DEDUP=True, the recorder's default).

De-dup records a signature's first call only, so the data edges have gaps: a recorded call's
input may come from a folded call. Before stop 39 such a row was an inherited FAIL whatever its
size, so every TF32 pair failed (Llama 16 rows, T5 51, ResNet 11). Now a row that computed right
on its inputs carries precision when its error is within ``precision_factor`` x what recorded
calls before it showed as precision; a run that shows none (the same kernels on both sides), or
an error beyond that, keeps the failure and names the folded call's seq.

The TF32 runs here are emulated on CPU and compared as a run whose header allows no TF32
(``tf32_declared=False``): the level then comes from what recorded calls show, the rule under test.
"""
import re
import sys
from pathlib import Path

import pytest
from conftest import sweep_noise_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy.runner import run_scenario  # noqa: E402
from accuracy.scenario import Fault, Scenario  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama-sdpa", "t5", "resnet"])
def test_tf32_pair_recorded_with_dedup_has_no_fail(arch, tmp_path):
    o = run_scenario(Scenario(f"t/{arch}", "noise", arch, noise="tf32", dedup=True, tf32_declared=False),
                     tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0 and o.summary["first_divergence"] is None, o.summary["first_divergence"]
    # one forward folds nothing (a key keeps a record per call in its first pass): nothing hidden to warn of
    assert not o.summary["dedup"], o.summary["dedup"]


@pytest.mark.usefixtures("one_record_per_key")
def test_a_bug_in_a_folded_call_still_fails_and_names_its_seq(tmp_path):
    """add #12 (layer 1's second residual add) is folded into the first one's record (one
    signature in one module, fed by the same kinds of producers: a residual add's output and a
    projection's view): it has no record of its own, and fp32 on both sides shows no precision to
    carry, so what it feeds fails. (Layer 0's first add reads the embedding: two records there.)"""
    s = Scenario("t/folded", "bug", "llama-sdpa", fault=Fault("aten.add.Tensor", 12), dedup=True)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.summary["failed"] > 0 and fd is not None
    assert "not recorded" in fd["culprit"] and fd["culprit_target_seq"] in o.truth.target
    # where it ran: its record's module, since de-dup folds a call into a record of its own module
    m = re.search(r"op seq (\d+) .*ran inside ([\w.]+)\)", fd["culprit"])
    assert m is not None and int(m[1]) in o.truth.target and m[2] == o.truth.target_module, fd["culprit"]


@pytest.mark.slow
def test_a_large_bug_in_a_folded_call_fails_under_tf32(tmp_path):
    """2e-2 carried in is far beyond 3x the TF32 rounding recorded calls show (about 5e-4)."""
    s = Scenario("t/folded-tf32", "bug", "llama-sdpa", fault=Fault("aten.mm.default", 3, amount=2e-2),
                 noise="tf32", dedup=True, tf32_declared=False)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] > 0 and o.summary["first_divergence"] is not None


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama-sdpa", "vit"])
def test_training_step_recorded_with_the_recorders_defaults_has_no_fail(arch, tmp_path):
    """X_DEDUP=True and X_DUMP_NUM=5 together, as a user meets them: a layer norm's or an
    attention backward's six inputs are not all saved, so no local error is measured (its outputs
    are: X_DUMP_NUM counts each side). Such a row carries precision when its error stays within
    the factor of what its inputs carry in (Llama: 10 FAIL rows before, ViT 9; ViT 152 once the
    outputs were saved and only the statistics' rule existed)."""
    s = Scenario(f"t/{arch}", "noise", arch, noise="tf32", dedup=True, dump_num=5, backward=True,
                 tf32_declared=False)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0 and o.summary["first_divergence"] is None, o.summary["first_divergence"]


def test_statistics_only_tf32_with_dedup_is_clean_where_tf32_is_declared_and_a_bug_still_fails(tmp_path):
    """Statistics only with de-dup: each signature has one recorded call, so no band of calls
    shows TF32's step, and only the run's settings can (a device's header; here declared, as
    compare's --tf32 on does for a switch the header cannot hold). ViT failed 23 rows without
    them. A 2e-2 bug in a recorded matmul is still far beyond 3x TF32's rounding."""
    clean = run_scenario(Scenario("t/vit", "noise", "vit", noise="tf32", dedup=True, data=False), tmp_path)
    assert clean.crash is None and clean.harness_error is None, (clean.crash, clean.harness_error)
    assert clean.summary["failed"] == 0 and clean.summary["first_divergence"] is None, \
        clean.summary["first_divergence"]
    bug = run_scenario(Scenario("t/vit-bug", "bug", "vit", fault=Fault("aten.addmm.default", 0, amount=2e-2),
                                noise="tf32", dedup=True, data=False), tmp_path)
    assert bug.crash is None and bug.harness_error is None, (bug.crash, bug.harness_error)
    assert bug.summary["failed"] > 0 and bug.exact, bug.summary["first_divergence"]


@pytest.mark.usefixtures("one_record_per_key")
def test_a_folded_producer_is_named_by_the_record_it_was_folded_into(tmp_path):
    """GPT-2's cat #3 (layer 1's value joined to its empty cache) is folded into the key's record:
    one signature in one module, fed the same way (split's items share a role). The dump's folds
    table names that record, and the call is the first divergence's culprit (culprit_target_seq),
    though its row is inherited."""
    s = Scenario("t/gpt2", "bug", "gpt2", fault=Fault("aten.cat.default", 3), dedup=True)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    m = re.search(r"op seq (\d+) .*a call of (\S+), folded into its record seq (\d+) \((\S+)\)", fd["culprit"])
    assert m is not None, fd["culprit"]
    assert m[2] == "aten.cat.default" and m[4] == "transformer.h.1.attn", fd["culprit"]
    assert int(m[3]) < int(m[1]) == fd["culprit_target_seq"] and o.exact, fd["culprit"]


@pytest.mark.slow
def test_a_gradient_read_through_folded_views_is_judged_by_the_call_that_made_it(tmp_path):
    """BERT's loss on LayerNorm outputs makes the gradient into the last LayerNorm 0 in exact
    arithmetic: the bf16 and fp32 runs hold different rounding of 0. The output layer's backward
    matmuls read it through a view that de-dup folds. The folds table names that view's argument,
    the LayerNorm backward's output, whose row holds only rounding, so they carry rounding, not a
    bug. Without the table they were 5 FAIL rows, inherited from an unrecorded call.

    Since de-dup keeps a record per module (stop 42), layer 1's backward has records of its own,
    with statistics only (its signatures' tensors were copied in layer 0's modules). Its query
    bias gradient, a sum of 8 values of that rounding, differs by 53 % between the runs while the
    values summed agree by their statistics within 4 %: statistics cannot tell noise from noise,
    and those 2 rows (the sum and its view) are the known false alarm left (docs/compare.md)."""
    s = Scenario("t/bert", "noise", "bert", noise="bf16", dedup=True, dump_num=5, backward=True)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.summary["failed"] <= 2, fd
    assert fd is None or fd["bench"].startswith("encoder.layer.1.attention.self.query/aten.sum.dim_IntList"), fd


@pytest.mark.slow
def test_a_call_the_bench_folded_under_another_layout_is_no_target_only_op(tmp_path):
    """De-dup keys a call by its arguments' strides: under CPU-emulated TF32 a MobileViT
    convolution returns a channels-last output, so the SiLU after it is a new signature on the
    target and a folded call on the bench. That record has no bench partner, but the bench ran
    SiLU as many times: it is a call the bench folded, judged as precision carried through an
    unrecorded call, not a target-only op born wrong (62 FAIL rows before)."""
    s = Scenario("t/mobilevit", "noise", "mobilevit", noise="tf32", dedup=True, dump_num=5)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0 and o.summary["first_divergence"] is None, o.summary["first_divergence"]


def test_an_op_only_the_target_runs_is_still_named_under_dedup(tmp_path):
    """The same rule leaves a real extra op alone: the target runs one more mul than the bench
    (after ViT's first MLP projection, a signature no other mul has, so de-dup records it)."""
    s = Scenario("t/extra", "target-only-op", "vit", target_only="vit.layers.0.mlp.fc1", dedup=True, dump_num=5)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert fd is not None and o.exact, fd
    assert "target-only op" in fd["culprit"], fd["culprit"]


def _sum_record():
    """A record of ``x.sum(0)`` over 39 positions of 32 channels (a linear bias's gradient), as
    a folded call's record: it lends the folded call its shapes."""
    from types import SimpleNamespace

    from xray.dump.model import Stats, TensorMeta

    arg = TensorMeta((39, 32), "float32", stats=Stats(-2e-10, 2e-10, 0.0, 6e-11, numel=39 * 32))
    out = TensorMeta((32,), "float32", stats=Stats(-1e-9, 1e-9, 0.0, 4e-10, numel=32))
    return SimpleNamespace(op="aten.sum.dim_IntList", inputs=[("self", arg)], outputs=[("out0", out)])


def test_a_folded_sum_is_judged_at_its_terms_magnitude():
    """A key bias's gradient sums 39 key gradients of RMS 6e-11 that carry TF32's 1.6e-3 and
    cancel to 1e-13 on both sides, 100 % apart: at its terms' magnitude the difference is
    3e-14 / (6e-11 x sqrt(39)) = 8e-5, within 3x what they carry. A 2 % bug in a sum that does
    not cancel (values of 1e-9) moves its extremes by 2e-11, 5e-2 at that magnitude: beyond."""
    from xray.compare.statistics_only import folded_sum
    from xray.dump.model import Stats

    arg = Stats(-2e-10, 2e-10, 0.0, 6e-11)
    bench, target = Stats(-1e-13, 1.2e-13, 1e-14, 6e-14), Stats(-1.1e-13, 0.9e-13, -2e-14, 5e-14)
    why = folded_sum(_sum_record(), 1.6e-3, arg, bench, target, 3.0)
    assert why is not None and "a sum of 39 terms" in why, why
    bench, target = Stats(-1e-9, 1e-9, 1e-11, 4e-10), Stats(-1.02e-9, 1.02e-9, 1.02e-11, 4.08e-10)
    assert folded_sum(_sum_record(), 1.6e-3, arg, bench, target, 3.0) is None


def test_a_cast_is_judged_by_its_statistics_where_nothing_was_saved():
    """An autocast cast in a backward, with statistics only: rounding to bfloat16 moves each value
    by at most 2^-8 of it, so min, max, mean and std by no more than that at the largest
    magnitude (3x allowed). A cast that scales by 1.05 moves them beyond; other NaN counts, a
    shape change or no statistics cannot be told (None)."""
    from xray.compare.statistics_only import cast_rounds_only
    from xray.dump.model import Stats, TensorMeta

    x = TensorMeta((8, 32), "float32", stats=Stats(-2.7651, 3.0469, -1.27e-4, 1.00007, numel=256))
    rounded = TensorMeta((8, 32), "bfloat16", stats=Stats(-2.765625, 3.046875, -1.2e-4, 1.0, numel=256))
    assert cast_rounds_only(x, rounded, 3.0) is True
    scaled = TensorMeta((8, 32), "bfloat16", stats=Stats(-2.903, 3.199, -1.33e-4, 1.05, numel=256))
    assert cast_rounds_only(x, scaled, 3.0) is False
    nan = TensorMeta((8, 32), "bfloat16", stats=Stats(-2.765625, 3.046875, -1.2e-4, 1.0, nan=1, numel=256))
    assert cast_rounds_only(x, nan, 3.0) is False
    assert cast_rounds_only(x, TensorMeta((256,), "bfloat16", stats=rounded.stats), 3.0) is None
    assert cast_rounds_only(x, TensorMeta((8, 32), "bfloat16"), 3.0) is None


@pytest.mark.slow
def test_key_bias_gradients_through_a_folded_sum_carry_precision_into_adamw(tmp_path):
    """Wav2Vec2's training step under CPU-emulated TF32, recorded with the defaults: each key
    projection's bias gradient is a folded sum. The last layer's sum reads a key gradient that a
    recorded attention backward made: it is judged at that gradient's magnitude and AdamW's
    moments carry precision. Since de-dup keeps a record per module (stop 42), the first layer's
    attention backward is recorded too, with statistics, and the rows its sum fed are precision
    as well (10 FAIL rows before stop 41, 5 at stop 41, 0 now)."""
    s = Scenario("t/wav2vec2", "noise", "wav2vec2", noise="tf32", dedup=True, dump_num=5, backward=True,
                 optimizer="foreach")
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0 and o.summary["first_divergence"] is None, o.summary["first_divergence"]


def test_a_call_the_bench_folded_is_no_op_inserted_on_a_shared_edge(tmp_path):
    """Phi adds its parallel attention and MLP outputs to the residual: two adds of one signature
    in one module on the fp32 bench (the second folded into the first), two signatures under
    bf16 autocast on the target. The target's second add record is a call the bench folded, not
    an op inserted on an edge both runs share that "changed its input by 0.899" (born). What is
    left is the pairing of the two adds, by dtype (docs/compare.md, weak points)."""
    s = Scenario("t/phi", "noise", "phi", noise="bf16", dedup=True, dump_num=5)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert fd is None or "changed its input" not in (fd["culprit"] or ""), fd


@pytest.mark.slow
def test_a_folded_cast_of_a_recorded_output_carries_that_outputs_difference(tmp_path):
    """BART's bf16 training step with the recorder's defaults: the cross-attention's key input
    gradient is a layer norm's input gradient (the rounding of a sum that cancels: 27 % between
    the runs) cast to bfloat16 by a call de-dup folded. The view that reads it differs by as
    much; the folds table names the norm's recorded output as the cast's argument, and the view's
    difference is within what that output carries (causality._folded_cast): no FAIL row (4 before)."""
    o = sweep_noise_run("bart", tmp_path)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow
def test_a_birth_the_last_rules_may_settle_does_not_stop_carrying_precision_through_folds(tmp_path):
    """Muse-Spark's bf16 training step with the recorder's defaults: an attention backward whose
    outputs were saved but not all its inputs (X_DUMP_NUM) fails first with nothing recomputed, a
    birth the rules run last settle as precision loss. It counted as an origin already, so a
    rotary backward's add fed by a folded call was left an inherited FAIL (3 rows) instead of
    carrying the precision calls before it showed."""
    o = sweep_noise_run("muse_spark_text", tmp_path)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow
def test_a_folded_product_carries_what_its_first_factor_carries(tmp_path):
    """GLM-4's bf16 training step with the recorder's defaults: a norm backward's gradient times
    rstd is folded into the forward's ``x * rstd`` record, and the gradient is the rounding of a
    sum that cancels (differs ~4x its RMS between the runs). The add that reads the product differs
    as much; the folds table names the product's first factor, whose statistics on both sides
    carry that difference (causality._folded_product): no FAIL row (1 before; 22 a version earlier)."""
    o = sweep_noise_run("glm4", tmp_path)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow
def test_a_bug_in_a_keys_second_call_is_judged_on_its_own_inputs(tmp_path):
    """Qwen3.5's linear attention, fp32, training step, recorded with the defaults: a 1e-2 bug in
    the norm backward's ``mul.Scalar`` that is its key's second call. With one record per key it
    was folded, and compare could only name a folded call after it in the same module (3 folded
    calls on the way, none seen by a recorded consumer). De-dup now gives each key two records
    (``DumpConfig.dedup_records``), so the call is recorded and named by its own local error."""
    from accuracy import zoo
    from accuracy.scenarios import RECORDER_DEFAULTS

    entry = next((x for x in zoo.listed() if x.model_type == "qwen3_5"), None)
    if entry is None:
        pytest.skip("this transformers has no qwen3_5")
    s = Scenario("t/qwen3_5", "bug", zoo.register(entry), backward=True,
                 fault=Fault("aten.mul.Scalar", 16, "rel", 1e-2, "backward"), **RECORDER_DEFAULTS)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact, fd
    assert (fd["origin"], fd["cause"]) == ("born", "local error"), fd


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["hrm_text", "vit_mae", "switch_transformers"])
def test_a_row_reading_random_draws_is_decided_again_when_its_other_producer_settles(model_type, tmp_path):
    """HRM's bf16 training step with the defaults: a weight gradient's accumulating add reads a
    gradient made from the recurrent state's random draws (skipped: they differ between the runs)
    and one through a folded call, whose recorded producer failed when the add was decided and
    was settled as precision loss by the statistics rules run last. The add stayed "inherited"
    because its random input counted as a failing producer; it is now decided again and skipped
    as made from the random draws: no FAIL row (1 before). ViT-MAE's (its random patch masking,
    a layer norm's residual add): 2 before; Switch Transformers' (its router's jitter): 39 before."""
    o = sweep_noise_run(model_type, tmp_path)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]
