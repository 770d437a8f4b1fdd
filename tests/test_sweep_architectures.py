"""tools/sweep_architectures.py: every transformers architecture built tiny, swept, tabulated, resumed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import sweep_architectures as sweep  # noqa: E402

FIELDS = {"kind", "model", "family", "recording", "scenario", "verdict"}


def _line(model: str, recording: str, scenario: str, verdict: str, **kw) -> dict:
    return {"kind": "scenario", "model": model, "family": model, "recording": recording, "scenario": scenario,
            "verdict": verdict, **kw}


def test_figures_and_table_from_lines(tmp_path):
    lines = [_line("a", "defaults", "identical", "clean"), _line("a", "defaults", "bf16", "FAIL", fail_rows=2,
                                                                   first_fail={"op": "aten.add.Tensor", "cause": "x"}),
             _line("a", "defaults", "fault", "exact"), _line("a", "defaults", "fault", "missed"),
             _line("a", "defaults", "fault", "left out"), _line("a", "every call", "identical", "FAIL", fail_rows=1),
             {"kind": "model", "model": "a", "family": "a", "status": "ok"},
             {"kind": "model", "model": "b", "family": "b", "status": "not buildable", "reason": "no"}]
    f = sweep.figures(lines)
    assert f["defaults"]["identical_fail"] == 0 and f["defaults"]["noise_fail"] == 1
    assert (f["defaults"]["faults"], f["defaults"]["exact"], f["defaults"]["missed"], f["defaults"]["left_out"]) == \
        (2, 1, 1, 1)
    assert f["every call"]["identical_fail"] == 1
    text = sweep.table(lines)
    assert "family" in text and "totals, defaults:" in text and "totals, every call:" in text
    assert "1 not buildable" in text
    assert any("aten.add.Tensor" in x for x in sweep.failures(lines))
    out = tmp_path / "s.jsonl"
    out.write_text("\n".join(json.dumps(x) for x in lines) + "\n{cut")  # a line cut by a kill is skipped
    assert sweep.done_models([out]) == {"a", "b"}


def _sweep_gpt2(out: Path, scenarios: str):
    """The sweep over GPT-2 alone, one fault per precision and direction: (its command, the
    finished process, the JSON lines it wrote)."""
    cmd = [sys.executable, str(TOOLS / "sweep_architectures.py"), "--out", str(out), "--models", "gpt2",
           "--scenarios", scenarios, "--faults", "1", "--timeout", "600"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return cmd, proc, [json.loads(x) for x in out.read_text().splitlines()]


def test_training_mode_faults_are_graded_as_faults():
    """A fault drawn and recorded in training mode is graded as the eval-mode faults are, never
    counted as a noise run or listed among the noise runs' failures."""
    lines = [_line("a", "defaults", "fault-trainmode", "exact"), _line("a", "defaults", "fault-trainmode", "wrong"),
             _line("a", "defaults", "fault", "exact"), _line("a", "defaults", "tf32-trainmode", "clean")]
    f = sweep.figures(lines)["defaults"]
    assert (f["faults"], f["exact"], f["wrong"], f["noise"], f["noise_fail"]) == (3, 2, 1, 1, 0)
    assert sweep.failures(lines) == []


def test_float16_and_thread_count_runs_are_noise_runs():
    """A model run whole in float16, and one on another thread count, are legitimate precision
    differences: counted and listed with the noise runs, never as faults."""
    lines = [_line("a", "defaults", "fp16", "clean"), _line("a", "defaults", "fp16-train", "FAIL", fail_rows=3,
                                                           first_fail={"op": "aten.mul.Tensor", "cause": "x"}),
             _line("a", "defaults", "threads", "clean"), _line("a", "defaults", "threads-train", "clean")]
    f = sweep.figures(lines)["defaults"]
    assert (f["noise"], f["noise_fail"], f["faults"]) == (4, 1, 0)
    assert any("fp16-train" in x for x in sweep.failures(lines))
    assert {"fp16", "fp16-train", "threads", "threads-train"} <= set(sweep.NOISE_SCENARIOS) <= set(sweep.SCENARIOS)


@pytest.mark.slow
def test_training_mode_faults_run_in_training_mode(tmp_path):
    """``fault-trainmode`` draws its faults from a training-mode run (GPT-2's dropout drawn, the
    same draws on both sides: seeded) and names each it grades."""
    _, _, lines = _sweep_gpt2(tmp_path / "sweep.jsonl", "fault-trainmode")
    faults = [r for r in lines if r["kind"] == "scenario"]
    assert faults and all(r["scenario"] == "fault-trainmode" for r in faults)
    graded = [r for r in faults if r["verdict"] != "left out"]
    assert graded and all(r["train_mode"] and r["verdict"] == "exact" for r in graded), \
        [(r["fault"]["op"], r["verdict"]) for r in graded]


@pytest.mark.slow
def test_sweep_one_model_end_to_end(tmp_path):
    out = tmp_path / "sweep.jsonl"
    cmd, proc, lines = _sweep_gpt2(out, "identical,fault")
    models = {r["model"]: r for r in lines if r["kind"] == "model"}
    assert set(models) == {"gpt2"} and all(m["status"] == "ok" for m in models.values())
    scenarios = [r for r in lines if r["kind"] == "scenario"]
    assert all(FIELDS <= set(r) for r in scenarios)
    assert {r["recording"] for r in scenarios} == set(sweep.RECORDINGS)
    identical = [r for r in scenarios if r["scenario"] == "identical"]
    assert len(identical) == 2 and all(r["fail_rows"] == 0 and r["verdict"] == "clean" for r in identical)
    faults = [r for r in scenarios if r["scenario"] == "fault"]
    assert faults and all(r["verdict"] in ("exact", "module", "wrong", "missed", "left out", "harness error")
                          for r in faults)
    assert "totals, defaults:" in proc.stdout and "totals, every call:" in proc.stdout
    # a rerun resumes: nothing left to do, nothing appended
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert "1 already in" in again.stdout and len(out.read_text().splitlines()) == len(lines)


def test_a_fault_corrupts_the_output_it_is_told():
    """``CorruptCall``'s ``output`` counts a call's tensor outputs: 1 is a layer norm's mean, the
    others stay bitwise; a slot the call lacks never fires; an integer output is one too (an
    ``arange`` off by one). The sweep draws a floating-point slot where ``--fault-output any``."""
    import torch

    from accuracy.faults import CorruptCall, int_bump, relative, tensor_outputs

    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    clean = torch.ops.aten.native_layer_norm.default(x, [8], w, b, 1e-5)
    assert len(tensor_outputs(clean)) == 3
    with CorruptCall("aten.native_layer_norm.default", 0, relative(1e-2), output=1) as fault:
        got = torch.ops.aten.native_layer_norm.default(x, [8], w, b, 1e-5)
    assert fault.hit and fault.shape == tuple(clean[1].shape)
    assert torch.equal(got[0], clean[0]) and torch.equal(got[2], clean[2])
    assert torch.allclose(got[1], clean[1] * 1.01) and not torch.equal(got[1], clean[1])
    with CorruptCall("aten.native_layer_norm.default", 0, relative(1e-2), output=3) as fault:
        torch.ops.aten.native_layer_norm.default(x, [8], w, b, 1e-5)
    assert not fault.hit
    with CorruptCall("aten.arange.default", 0, int_bump()) as fault:
        got = torch.arange(6)
    assert fault.hit and int(got.sum()) == 16


def test_a_real_size_model_is_1024_wide_on_512_tokens():
    """``--size real`` builds the same shrunk config at REAL's widths (tiny configs hide bugs:
    reductions as long as a production model's) and feeds it REAL_SEQ tokens; depth and
    vocabulary stay tiny."""
    from accuracy import zoo

    entry = next((x for x in zoo.listed() if x.model_type == "llama"), None)
    if entry is None:
        pytest.skip("this transformers has no llama")
    config = zoo.tiny_config("llama", "real")
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.intermediate_size,
            config.num_hidden_layers, config.vocab_size) == (1024, 16, 4, 2816, 2, zoo.VOCAB)
    name = zoo.register(entry, "real")
    assert name == "zoo-real/llama" and zoo.ARCHS[name].inputs()["input_ids"].shape == (1, zoo.REAL_SEQ)
    assert zoo.tiny_config("llama").hidden_size == 32  # the sweep's default size is untouched
