"""A training step's optimizer: its multi-tensor and fused kernels are recorded, compared,
generated, and a run that implements the step another way is told what to change.

torch.optim runs AdamW as per-tensor ops (foreach=False, CPU's default), as ``_foreach_*_``
kernels (accelerators' default) or as one ``_fused_adamw_`` kernel. The last two return nothing:
what they write is their result.
"""
from __future__ import annotations

import contextlib
import copy
import subprocess
import sys

import pytest
import torch

import xray
from xray.compare import compare_dumps

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tools"))
from accuracy.faults import CorruptCall, relative  # noqa: E402

IMPLEMENTATIONS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def _model(hidden: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.GELU(), torch.nn.LayerNorm(hidden),
                               torch.nn.Linear(hidden, 4))


def _step(model, folder, implementation: str, fault=None, **dump_options):
    """One recorded training step (forward, backward, AdamW step); the step's parameters after it."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, **IMPLEMENTATIONS[implementation])
    with fault if fault is not None else contextlib.nullcontext():
        with xray.dump(dump_dir=folder, X_DEDUP=False, **dump_options) as d:
            model(x).square().mean().backward()
            opt.step()
    return d.folder, [p.detach().clone() for p in model.parameters()]


def _outputs(folder, op_prefix: str):
    return [r for r in xray.load_dump(folder).records if r.op.startswith(op_prefix)]


@pytest.mark.parametrize("implementation, op", [("foreach", "aten._foreach_addcdiv_"),
                                                ("fused", "aten._fused_adamw_")])
def test_written_arguments_are_the_outputs_of_an_op_that_returns_nothing(tmp_path, implementation, op):
    folder, params = _step(_model(), tmp_path / "d", implementation)
    rec = _outputs(folder, op)[0]
    first = rec.outputs[0]  # the params list (self) after the call
    assert isinstance(first, list) and [m.shape for m in first] == [tuple(p.shape) for p in params]
    # after the call: the statistics are the updated parameters'
    assert first[0].stats.mean == pytest.approx(params[0].double().mean().item(), rel=1e-6, abs=1e-9)
    if implementation == "fused":  # one output per written argument: params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs
        assert len(rec.outputs) == 5 and rec.outputs[4] == []


def test_recording_the_step_changes_no_number(tmp_path):
    ref = _model()
    plain = copy.deepcopy(ref)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-3, weight_decay=0.01, foreach=True)
    plain(x).square().mean().backward()
    opt.step()
    _, recorded = _step(ref, tmp_path / "d", "foreach")
    for a, b in zip(plain.parameters(), recorded):
        assert torch.equal(a.detach(), b)


@pytest.mark.parametrize("implementation, op", [("foreach", "aten._foreach_addcdiv_.ScalarList"),
                                                ("foreach", "aten._foreach_lerp_.Scalar"),
                                                ("fused", "aten._fused_adamw_.default")])
def test_a_wrong_multi_tensor_kernel_is_the_first_divergence(tmp_path, implementation, op):
    """Before stop 38 these kernels' records had no output: the fault showed nowhere in the step."""
    bench, _ = _step(_model(), tmp_path / "b", implementation)
    fault = CorruptCall(op, 0, relative(1e-3))
    target, _ = _step(_model(), tmp_path / "t", implementation, fault=fault)
    assert fault.hit
    s = compare_dumps(bench, target).summary
    assert s.failed >= 1 and s.first_divergence["op"] == op and s.first_divergence["origin"] == "born"
    assert not any("optimizer step" in w for w in s.warnings)


@pytest.mark.slow
@pytest.mark.parametrize("bench_impl, target_impl", [("loop", "foreach"), ("loop", "fused"), ("foreach", "fused")])
def test_two_implementations_of_the_step_say_what_to_change(tmp_path, bench_impl, target_impl):
    bench, _ = _step(_model(), tmp_path / "b", bench_impl)
    target, _ = _step(_model(), tmp_path / "t", target_impl)
    s = compare_dumps(bench, target).summary
    note = [w for w in s.warnings if w.startswith("optimizer step")]
    assert len(note) == 1 and "foreach=" in note[0]
    assert f"bench ran {'per-tensor' if bench_impl == 'loop' else 'multi-tensor' if bench_impl == 'foreach' else 'one fused'}" in note[0]
    same, _ = _step(_model(), tmp_path / "s", target_impl)
    assert not any(w.startswith("optimizer step") for w in compare_dumps(target, same).summary.warnings)


def test_a_forward_only_bench_is_not_told_about_optimizers(tmp_path):
    """The target's unmatched step records alone (the bench recorded no step) are no mismatch of implementations."""
    model = _model()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), xray.dump(dump_dir=tmp_path / "b", X_DEDUP=False) as d:
        model(x)
    target, _ = _step(_model(), tmp_path / "t", "foreach")
    assert not any(w.startswith("optimizer step") for w in compare_dumps(d.folder, target).summary.warnings)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["foreach", "fused"])
def test_generated_suite_of_a_training_step_passes(tmp_path, implementation):
    """torch.optim's step opens a profiler range: its marker ops are blacklisted by default, so
    the step's kernels get tests (it used to refuse the whole dump)."""
    folder, _ = _step(_model(), tmp_path / "d", implementation, X_DUMP_NUM=100)
    out = tmp_path / "suite"
    gen = subprocess.run([sys.executable, "-m", "xray.gen.cli", str(folder), "-o", str(out), "-q"],
                         capture_output=True, text=True, timeout=600)
    assert gen.returncode == 0, gen.stderr
    kernel = "_foreach_addcdiv_" if implementation == "foreach" else "_fused_adamw_"
    assert list(out.glob(f"test_aten_{kernel}*.py"))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out), "--device", "cpu"],
                         capture_output=True, text=True, cwd=out, timeout=600)
    assert run.returncode == 0 and " passed" in run.stdout and " failed" not in run.stdout, run.stdout[-2000:]


def test_begin_dump_with_a_folder_for_its_flags_says_so():
    with pytest.raises(ValueError, match="dump_dir="):
        xray.begin_dump("my_dump")
    assert xray.record.config.DumpConfig.resolve("0x10A").debug == 0x10A


@pytest.mark.slow
def test_real_size_training_step_with_a_wrong_foreach_kernel(tmp_path):
    """Hidden 1024, GQA (16 heads, 8 KV), eager attention, 512 tokens, one layer: a whole step
    (forward, backward, AdamW foreach) recorded with statistics only, as a device run would be."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def model():
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(vocab_size=1024, hidden_size=1024, intermediate_size=2816,
                                            num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=8,
                                            max_position_embeddings=512, attn_implementation="eager"))

    ids = torch.randint(0, 1024, (1, 512), generator=torch.Generator().manual_seed(0))

    def step(folder, fault=None):
        m = model()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, foreach=True)
        with fault if fault is not None else contextlib.nullcontext():
            with xray.dump(dump_dir=folder, X_DEBUG=0x10A, X_DEDUP=False, X_DUMP_NUM=0) as d:
                m(input_ids=ids, labels=ids).loss.backward()
                opt.step()
        return d.folder

    bench = step(tmp_path / "b")
    same = compare_dumps(bench, step(tmp_path / "s")).summary
    assert same.failed == 0 and same.unmatched == 0 and same.first_divergence is None
    fault = CorruptCall("aten._foreach_addcdiv_.ScalarList", 0, relative(1e-3))
    s = compare_dumps(bench, step(tmp_path / "t", fault)).summary
    assert fault.hit and s.first_divergence["op"] == "aten._foreach_addcdiv_.ScalarList"
    assert s.first_divergence["origin"] == "born"


@pytest.mark.parametrize("implementation, op", [("loop", "aten.addcmul_.default"),
                                                ("foreach", "aten._foreach_addcdiv_.ScalarList"),
                                                ("fused", "aten._fused_adamw_.default")])
def test_an_in_place_kernel_is_judged_on_its_own_inputs(tmp_path, implementation, op):
    """Local error re-runs an op that writes its arguments on copies of the inputs recorded
    before its call: the kernel as recorded is within its floor, the same kernel made wrong is
    beyond it. (Before stop 38 such ops had no local error: an inherited 2x relative error of a
    squared gradient under bf16 was a born FAIL.)"""
    from xray.compare.local import local_error

    for fault, beyond in ((None, False), (CorruptCall(op, 0, relative(1e-3)), True)):
        folder, _ = _step(_model(), tmp_path / f"d{beyond}", implementation, fault=fault, X_DUMP_NUM=1000)
        dump = xray.load_dump(folder)
        rec = _outputs(folder, op)[0]
        outputs = list(rec.output_tensors())
        le = local_error(rec, dump, outputs[0][1], 0)
        assert le is not None and (le.local > 10 * max(le.floor, 1e-7)) == beyond, (le, beyond)
        if len(outputs) > 1:  # the last written tensor (not corrupted): inputs stay as recorded between runs
            later = local_error(rec, dump, outputs[-1][1], len(outputs) - 1)
            assert later is not None and later.local <= 10 * max(later.floor, 1e-7)


@pytest.mark.slow
def test_float16_adamw_infs_are_reported_not_called_precision_loss(tmp_path):
    """A pure float16 AdamW: eps (1e-8) is 0 in float16 and squared gradients underflow, so the
    update divides by 0 and parameters become Inf where the float32 bench's are finite. Every
    step before it is float16's precision; the Infs stay NaN/Inf rows, the first divergence,
    with that precision named as their cause. (Before stop 38 they were downgraded to warnings.)"""
    from accuracy.runner import run_scenario
    from accuracy.scenario import Scenario

    o = run_scenario(Scenario("t/qwen2", "fp16-adamw", "qwen2", noise="fp16", backward=True, optimizer="foreach"),
                     tmp_path)
    assert o.harness_error is None and o.crash is None, o.trace or o.harness_error
    fd = o.summary["first_divergence"]
    assert o.summary["nan_inf"] > 0 and fd["status"] == "nan/inf", fd
    assert fd["op"] == "aten._foreach_addcdiv_.ScalarList" and fd["cause"] == "precision loss", fd
    assert "_foreach_add_" in fd["culprit"]  # the eps added to the denominator: 0 in float16
