"""Compare's one-line verdict (xray/compare/verdict.py): bug, precision, or cannot tell, with why.

The summaries are built by hand for the rules, then a real pair (the H200 fixtures) is checked
end to end: the terminal's last line, the summary JSON and the HTML say the same sentence.
"""
import json
import sys
from pathlib import Path

import pytest

from xray.compare.result import Summary
from xray.compare.verdict import BUG, CANNOT_TELL, PRECISION, verdict_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from accuracy import devices  # noqa: E402


def _summary(**kw) -> Summary:
    s = Summary(bench="b", target="t", rows=10, passed=8, warned=2)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def _fd(**kw) -> dict:
    fd = {"op": "aten.mm.default", "bench": "model.layers.0.mlp.up_proj/aten.mm.default#125", "bench_seq": 125,
          "origin": "born", "cause": "local error", "culprit": "this op, on the target's own inputs", "rank": ""}
    fd.update(kw)
    return fd


def test_a_born_divergence_judged_on_its_inputs_is_a_bug_at_that_call():
    v = verdict_of(_summary(failed=3, first_divergence=_fd()))
    assert v.kind == BUG
    assert "aten.mm.default in model.layers.0.mlp.up_proj (bench record #125)" in v.sentence


def test_no_failing_row_is_precision_and_says_what_was_not_compared():
    assert verdict_of(_summary()).kind == PRECISION
    v = verdict_of(_summary(dedup=["target dump is DE-DUPLICATED"]))
    assert v.kind == PRECISION and "de-duplicated" in v.sentence


def test_an_error_whose_origin_was_not_judged_is_never_called_a_bug():
    """A real H200 LSTM in fp32: cuDNN's RNN runs only on the target and cannot be recomputed
    (its weights arrive through set_), and a view after it fails; that view is no bug."""
    culprit = ("target-only op rnn/aten._cudnn_rnn.default#5 is not judged: rnn/aten.set_.source_Storage#4 "
               "cannot be recomputed here; it feeds self")
    v = verdict_of(_summary(failed=3, first_divergence=_fd(op="aten.view.default", cause="target-only op",
                                                           culprit=culprit)))
    assert v.kind == CANNOT_TELL and "not judged" in v.sentence
    inherited = verdict_of(_summary(failed=3, first_divergence=_fd(origin="inherited")))
    assert inherited.kind == CANNOT_TELL and "X_DEDUP=0" in inherited.sentence


def test_nothing_compared_cannot_tell():
    assert verdict_of(_summary(rows=4, passed=0, warned=0, unmatched=4)).kind == CANNOT_TELL


@pytest.mark.slow  # two real compares
def test_the_terminal_the_json_and_the_html_carry_compares_verdict(tmp_path):
    from xray.compare.cli import main

    root = devices.unpack(tmp_path / "h200", devices.H200_FIXTURES)
    entries = devices.manifest(root)
    bench = root / entries["llama/cpu_fp32"]["path"]
    for variant, kind in (("fault_bf16_5e-2", BUG), ("dev_bf16", PRECISION)):
        target = root / entries[f"llama/{variant}"]["path"]
        out = tmp_path / variant
        assert main([str(bench), str(target), str(out.with_suffix(".csv")), "--summary-json",
                     str(out.with_suffix(".json")), "--html", str(out.with_suffix(".html"))]) in (0, 1)
        summary = json.loads(out.with_suffix(".json").read_text())
        assert summary["verdict_kind"] == kind, summary["verdict"]
        assert f"verdict: {kind}" in out.with_suffix(".html").read_text()
