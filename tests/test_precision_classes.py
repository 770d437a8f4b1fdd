"""A measured precision class (causality._mark_precision_loss): an op kind whose failing calls
carry local error near one reduced-precision step's is precision loss on this run. "Near" is
each call's, not the median's: the sweep's fortieth 33 (CTRL, fp32, defaults) had two failing
addmm calls, a 1e-2 bug at 4x the bf16 step and a right fp32 call at 7e-4 of it; their median,
2x, sat in the band, bf16 was "established" on an fp32 CPU run, and the bug read "consistent
with bf16 on every call": missed."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy import zoo  # noqa: E402
from accuracy.runner import run_scenario  # noqa: E402
from accuracy.scenario import Fault, Scenario  # noqa: E402
from accuracy.scenarios import RECORDER_DEFAULTS  # noqa: E402


@pytest.mark.slow  # CTRL recorded twice: about 10 s
def test_a_bug_and_a_right_call_are_no_precision_class(tmp_path):
    entry = next((e for e in zoo.listed() if e.model_type == "ctrl"), None)
    if entry is None:
        pytest.skip("this transformers has no CTRL")
    s = Scenario("t/ctrl", "bug", zoo.register(entry), fault=Fault("aten.addmm.default", 8, amount=1e-2),
                 **RECORDER_DEFAULTS)
    o = run_scenario(s, tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    fd = o.summary["first_divergence"]
    assert fd is not None and fd["op"] == "aten.addmm.default" and fd["origin"] == "born", fd
    assert "multi_head_attention.Wv" in fd["module"] and "bf16" not in (fd.get("note") or ""), fd
