"""tools/device_check.py end to end on the CPU, with a small budget: the script the device machine
runs must work before it is spent there (issue 30)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
TOOL = Path(__file__).parents[1] / "tools" / "device_check.py"


@pytest.mark.slow  # the whole device script end to end on CPU (9 s)
def test_device_check_runs_on_cpu_and_scores_a_fault_and_a_legit_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("device_check", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--device", "cpu", "--out", str(tmp_path), "--archs", "llama",
                      "--variants", "dev_fp32,fault_fp32_1e-3,defaults_bf16", "--bench-repeats", "0"]) == 0
    check = json.loads((tmp_path / "check.json").read_text())
    fault = next(r for r in check["runs"] if r["variant"] == "fault_fp32_1e-3")
    assert fault["injected_op"] == fault["fault_op"] and fault["fault_target_seq"] > 0
    assert check["right"] == "3/3", check["scores"]
    (legit, found, defaults) = check["scores"]
    # the recorder's defaults on both sides (de-dup, X_DUMP_NUM=5): a bench of its own
    assert {r["variant"] for r in check["runs"]} >= {"cpu_fp32", "cpu_fp32_defaults", "defaults_bf16"}
    assert defaults["first_divergence"] is None and not defaults["fail_rows"]
    assert legit["first_divergence"] is None and found["first_divergence"]["target_seq"] == fault["fault_target_seq"]
    (suite,) = check["suites"]
    assert suite["pytest_rc"] == 0 and suite["passed"] == suite["tests"] > 10, suite
    assert "verdicts right 3/3" in capsys.readouterr().out
