"""explain's verdict in plain words: a clean reduced-precision run is said to be within its
precision (compare's own verdict on every call), a broken call is still named, the call compare
singles out is always in the op table, and negative shares are explained in the HTML."""
from __future__ import annotations

import pytest

from xray.explain import analysis, report
from xray.explain.analysis import Explanation, Row
from xray.explain.cli import parse_inject
from xray.explain.examples import demo_llama

FAULT = "aten.mm.default#5+0.05"  # layer 0's up_proj matmul
FAULT_MODULE = "model.layers.0.mlp.up_proj"


def test_a_clean_bf16_run_is_within_its_precision_and_says_so_first():
    """It led with "lm_head (Linear) makes 28% of it", as if lm_head were broken."""
    model, args = demo_llama()
    x = analysis.explain(model, args, target="cpu:bf16", residual=False)
    assert x.compare["verdict_kind"] == "precision"
    first = x.verdict.split(";")[0]
    assert first.startswith(f"final error {x.error:.3g} is within bf16's precision, no bug")
    assert "makes" not in first and "\n" not in x.verdict
    assert f"the largest part accumulates in {x.top}" in x.verdict


@pytest.fixture(scope="module")
def faulted():
    """fp32 target with the demo's broken call, only two op grafts allowed."""
    model, args = demo_llama()
    return analysis.explain(model, args, target="cpu", target_context=parse_inject(FAULT), max_ops=2,
                            residual=False)


@pytest.mark.slow
def test_a_broken_call_is_not_called_precision(faulted):
    x = faulted
    assert x.compare["verdict_kind"] == "bug" and "precision, no bug" not in x.verdict
    assert x.verdict.startswith(f"final error {x.error:.3g}; {FAULT_MODULE} (Linear) makes")


@pytest.mark.slow
def test_the_born_call_is_in_the_op_table_even_past_max_ops(faulted):
    """Calls inside the top modules were cut at max_ops in execution order, the born call with them."""
    x = faulted
    born = x.compare["born"]
    assert born and born[0].startswith(FAULT_MODULE + "/aten.mm.default#")
    assert x.row(born[0]).key and born[0] in report.terminal(x)


def _explanation(op_shares: list[float], key_share: float) -> Explanation:
    rows = [Row("module", "a", "a", "Linear", 1, 0, self_share=-0.25, share=-0.25),
            Row("module", "b", "b", "Linear", 1, 1, self_share=1.25, share=1.25)]
    rows += [Row("op", f"b/aten.add.Tensor#{i}", "b", "aten.add.Tensor", 2, 1, share=s) for i, s in enumerate(op_shares)]
    rows.append(Row("op", "b/aten.mm.default#99", "b", "aten.mm.default", 2, 1, share=key_share, key=True))
    return Explanation("cpu", "cpu:bf16", 0.1, rows, top="b", verdict="v")


def test_terminal_op_table_keeps_a_singled_out_call_below_the_cut():
    text = report.terminal(_explanation([0.5] * 12, 0.01), top=10)
    assert "b/aten.mm.default#99" in text and "b/aten.add.Tensor#11" not in text


def test_negative_shares_are_explained_in_the_html(tmp_path):
    page = report.write_html(_explanation([0.5], 0.5), tmp_path / "x.html").read_text()
    assert "self -25.0%" in page  # printed as measured ...
    assert "A negative share means that grafting the bench&#x27;s value there made the final error larger" in page
    assert "background:rgb(255,255,255)'><code>a</code>" in page  # ... and coloured as no share
