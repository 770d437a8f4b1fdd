"""A bug in a call that only moves values (a view, a reshape, a transpose), recorded with the
recorder's defaults (X_DEDUP=True, X_DUMP_NUM=5).

Such a call is never the origin of what it carries in, but it is of what it writes where its
inputs are the same on both runs (equal statistics and samples): causality._changed_what_it_moved.
And where de-dup folded it, a consumer whose input fails while the call the folds table looks
through to passes names the folded call (causality._changed_in_a_fold). Before both, each of
these faults read as "precision loss" or pointed elsewhere: 0 of the 5 cases below were exact.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy import zoo  # noqa: E402
from accuracy.runner import run_scenario  # noqa: E402
from accuracy.scenario import Fault, Scenario  # noqa: E402
from accuracy.scenarios import RECORDER_DEFAULTS  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("arch,call", [("llama-sdpa", 3), ("llama-sdpa", 5), ("gpt2", 3), ("gpt2", 5)])
def test_a_recorded_reshape_that_changes_values_is_the_origin(arch, call, tmp_path):
    """1e-2 on one _unsafe_view's output in fp32, recorded with statistics only: the reshape is
    named, not called precision loss. Its result is new memory, so its statistics are its own,
    and their difference from its input's is its local error (compare/moved_values.py), which
    names it before the rule that its inputs are the same on both runs (O13) is reached."""
    s = Scenario(f"t/{arch}", "bug", arch, fault=Fault("aten._unsafe_view.default", call, amount=1e-2),
                 **RECORDER_DEFAULTS)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact, fd
    assert (fd["origin"], fd["cause"]) == ("born", "local error") and "on the target's own inputs" in fd["culprit"], fd


def test_a_folded_reshape_that_changes_values_is_named(tmp_path, monkeypatch):
    """XLM's second attention layer reshapes its context in a call de-dup folds (one record per
    key, in its first pass too: X_DEDUP_RECORDS=1, X_DEDUP_PASS_RECORDS=1; with the defaults that
    call has a record of its own): the
    transpose after it fails while the bmm the folds table looks through to passes, so the
    folded call is named."""
    monkeypatch.setenv("X_DEDUP_RECORDS", "1")
    monkeypatch.setenv("X_DEDUP_PASS_RECORDS", "1")
    arch = zoo.register(zoo.Entry("xlm", "XLMModel"))
    s = Scenario("t/xlm", "bug", arch, fault=Fault("aten._unsafe_view.default", 3, amount=1e-2), **RECORDER_DEFAULTS)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact, fd
    assert "not recorded: de-duplicated" in fd["culprit"] and fd["culprit_target_seq"] in o.truth.target, fd


@pytest.mark.slow
def test_a_clone_within_bf16s_band_that_changed_values_is_named(tmp_path):
    """CWM under bf16 autocast, recorded with the defaults: a 5e-2 bug in a clone of a bf16
    key (the repeated key-value heads) moves its sample 2.6 % from the float32 bench, within
    bf16's band, so the row passed and nothing looked at it again. Its own input, in the same
    run, has other values at the same sampled positions (sample_verdicts.moved_and_changed):
    the row is suspect, and its local error on the sample names it."""
    entry = next((x for x in zoo.listed() if x.model_type == "cwm"), None)
    if entry is None:
        pytest.skip("this transformers has no cwm")
    s = Scenario("t/cwm", "bug", zoo.register(entry), noise="bf16",
                 fault=Fault("aten.clone.default", 1, amount=5e-2), **RECORDER_DEFAULTS)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact, fd
    assert (fd["origin"], fd["cause"]) == ("born", "local error"), fd


@pytest.mark.slow
@pytest.mark.parametrize("noise,call,amount", [(None, 3, 1e-2), ("bf16", 4, 5e-2)])
def test_an_embedding_lookup_is_no_reduction(noise, call, amount, tmp_path):
    """LayoutLM's position embeddings, recorded with the defaults: a bug in one lookup was called
    "within the accumulation-order bound of a 128-term reduction of inputs of magnitude 292", its
    table's size over its output's taken for terms summed and its integer indices for their
    magnitude. A gather copies each element (op_classes.GATHERS): it sums nothing, and the bug is
    born there (missed in fp32 and under bf16 before)."""
    entry = next((x for x in zoo.listed() if x.model_type == "layoutlm"), None)
    if entry is None:
        pytest.skip("this transformers has no layoutlm")
    s = Scenario("t/layoutlm", "bug", zoo.register(entry), noise=noise,
                 fault=Fault("aten.embedding.default", call, amount=amount), **RECORDER_DEFAULTS)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact, fd
    assert (fd["origin"], fd["cause"]) == ("born", "local error"), fd


def _handing_copies_on(monkeypatch) -> None:
    """Record as earlier recorders did, whose dumps compare still reads: a copy of its input's
    shape takes its input's statistics (only its sample is its own). Python's row path, where
    the rule can be swapped."""
    from xray.record import cache_rules, rows

    def same_values(src, dst):
        return src.dtype == dst.dtype and src.numel() == dst.numel() and (
            src.shape == dst.shape or src.data_ptr() == dst.data_ptr())
    monkeypatch.setenv("XRAY_NATIVE_ROWS", "0")
    monkeypatch.setattr(cache_rules, "same_values", same_values)
    monkeypatch.setattr(rows, "same_values", same_values)


@pytest.mark.slow
@pytest.mark.parametrize("handed_on", [False, True], ids=["copies-measured", "copies-handed-on"])
@pytest.mark.parametrize("model_type,call", [("mpnet", 2), ("nemotron3_5_asr", 2)])
def test_a_sparse_bug_in_a_copy_its_sample_missed_is_named(model_type, call, handed_on, tmp_path, monkeypatch):
    """MPNet in fp32, recorded with the defaults: three elements of an attention output's clone
    doubled (tools/accuracy's "few" fault: a tail or index bug); its 32 sampled elements miss
    the three. Today's recorder measures the clone's own statistics, which are not its input's:
    born at the clone (compare/moved_values.py).

    Dumps of earlier recorders hand a clone its input's statistics. There the matmul reading it
    differs by 45 % while each input agrees with the bench on every statistic and sampled
    element, bit for bit, and the matmul computed right on them: its inputs differ where their
    records do not show it, and the nearest copy up the chain of value-moving ops is named
    (compare/unseen_inputs.py). Nemotron-3.5-ASR's repeated key-value heads: the clone's
    consumer, a same-shape expand whose data X_DUMP_NUM saved, measures its own statistics, and
    they are not the ones its input was recorded with: the expand moved the values right, so its
    input's record is what does not describe them."""
    entry = next((x for x in zoo.listed() if x.model_type == model_type), None)
    if entry is None:
        pytest.skip(f"this transformers has no {model_type}")
    if handed_on:
        _handing_copies_on(monkeypatch)
    s = Scenario(f"t/{model_type}", "bug", zoo.register(entry), fault=Fault("aten.clone.default", call, "few", 1.0),
                 **RECORDER_DEFAULTS)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert o.exact, fd
    if handed_on:  # the clone named: born on its own self-check (a small float32 output keeps one in
        # any run, and reads every element), or as the nearest copy behind the matmul's unseen input
        assert fd["op"] == "aten.clone.default" or "aten.clone.default" in fd["culprit"], fd
    else:
        assert fd["op"] == "aten.clone.default" and (fd["origin"], fd["cause"]) == ("born", "local error"), fd
