"""A half-precision elementwise op's self-check (xray/record/elementwise_check.py): every element
of its output against the op run again on its inputs in float32, so that a fault in a few
elements of a statistics-only record is seen, which neither its statistics nor its 32-element
sample see under bf16. At a real size (512 tokens, hidden 1024)."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import xray
from xray.compare import compare_dumps
from xray.record.elementwise_check import SMALL_OUTPUT, elementwise_check, rerun_op

ADD = torch.ops.aten.add.Tensor
TOKENS, HIDDEN = 512, 1024


class _DoubleElements(TorchDispatchMode):
    """Doubles three elements of the ``call``-th output of ``op``, below the recorder (so it is
    recorded as the op's own output): a fault of a few elements, as a kernel's tail loop makes."""

    def __init__(self, op, call: int) -> None:
        super().__init__()
        self.op, self.call, self.seen = op, call, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is self.op:
            self.seen += 1
            if self.seen - 1 == self.call:
                out.view(-1)[[7, out.numel() // 3, out.numel() - 2]] *= 2
        return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_right_elementwise_kernel_reads_at_most_one_unit_and_three_doubled_elements_read_one(dtype):
    torch.manual_seed(0)
    a, b = torch.randn(TOKENS, HIDDEN).to(dtype), torch.randn(TOKENS, HIDDEN).to(dtype)
    unit = torch.finfo(dtype).eps
    calls = {"aten.add.Tensor": ({"self": a, "other": b, "alpha": 1}, a + b),
             "aten.mul.Tensor": ({"self": a, "other": b}, a * b),
             "aten.silu.default": ({"self": a}, torch.nn.functional.silu(a)),
             "aten.exp.default": ({"self": a}, a.exp()),
             "aten.gelu.default": ({"self": a, "approximate": "none"}, torch.nn.functional.gelu(a)),
             "aten.rsqrt.default": ({"self": a.abs()}, a.abs().rsqrt()),
             "aten.pow.Tensor_Scalar": ({"self": a, "exponent": 2}, a.pow(2))}
    for name, (bound, out) in calls.items():
        residual, *steps = elementwise_check(name, bound, out)
        assert residual <= unit and all(math.isnan(s) for s in steps), (name, residual)
    wrong = (a + b).clone()
    wrong.view(-1)[[7, wrong.numel() // 3, wrong.numel() - 2]] *= 2
    assert elementwise_check("aten.add.Tensor", {"self": a, "other": b, "alpha": 1}, wrong)[0] >= 0.5
    # a float32 output: none in a run all float32, against float64 in one that computes in half too
    fp32 = {"self": a.float(), "other": b.float(), "alpha": 1}
    assert elementwise_check("aten.add.Tensor", fp32, a.float() + b.float()) is None
    assert elementwise_check("aten.add.Tensor", fp32, a.float() + b.float(), mixed=True)[0] == 0


def test_values_non_finite_on_one_side_only_read_one_and_on_both_sides_nothing():
    x = torch.tensor([-1.0, 0.0, 1.0, 4.0] * 64, dtype=torch.bfloat16)
    out = x.log()  # NaN, -inf, 0, 1.386...: the reference makes the same
    assert elementwise_check("aten.log.default", {"self": x}, out)[0] == 0
    wrong = out.clone()
    wrong[3] = math.nan
    assert elementwise_check("aten.log.default", {"self": x}, wrong)[0] == 1


def test_ops_that_round_a_quotient_and_writing_or_random_ops_are_not_checked():
    for name in ("aten.remainder.Tensor", "aten.fmod.Tensor", "aten.floor_divide.default", "aten.add_.Tensor",
                 "aten.add.out", "aten.bernoulli.p", "aten.mm.default", "aten.nonexistent.default"):
        assert rerun_op(name) is None, name
    x = (torch.randn(64) * 10).half()
    assert elementwise_check("aten.div.Tensor_mode", {"self": x, "other": x + 100, "rounding_mode": "floor"},
                             torch.div(x, x + 100, rounding_mode="floor")) is None
    assert rerun_op("aten.add.Tensor") is not None and rerun_op("aten.where.self") is not None


def _model(dtype):
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(2)).to(dtype)

    def forward(h):
        for layer in layers:
            h = h + torch.nn.functional.silu(layer(h))  # the residual add: aten.add.Tensor
        return h
    return forward


def _record(folder, fault=None, dtype=torch.bfloat16, autocast=False):
    forward = _model(dtype)
    x = torch.randn(1, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), \
            fault or contextlib.nullcontext(), xray.dump(dump_dir=folder) as d:  # the defaults
        forward(x)
    return d.folder


def test_three_doubled_elements_of_a_statistics_only_residual_add_are_born_there(tmp_path):
    """A bf16 run, the recorder's defaults: the second layer's residual add keeps statistics and
    a sample only (de-dup saved the first's tensors). Three of its 524,288 elements doubled leave
    its statistics and sample within bf16's band; its self-check reads them, and compare names
    that call born, on its own inputs."""
    bench = _record(tmp_path / "bench")
    target = _record(tmp_path / "target", _DoubleElements(ADD, 1))
    result = compare_dumps(bench, target, progress=False)
    add = [r for r in result.rows if r.target_op == "aten.add.Tensor" and r.module == ""]
    assert len(add) == 2 and add[0].status == "pass" and add[1].mode == "stats"
    assert (add[1].status, add[1].origin, add[1].cause) == ("fail", "born", "local error"), add[1]
    assert "every element" in add[1].note and add[1].local_err >= 0.5
    assert result.summary.verdict.startswith("born at aten.add.Tensor")


def test_under_autocast_a_float32_residual_add_with_three_doubled_elements_is_born_there(tmp_path):
    """bf16 autocast on a float32 model: the residual add is float32 (a float32 stream plus a bf16
    branch), yet carries bf16's rounding, whose band hides three doubled elements. Once the run
    has made a half-precision output, its float32 elementwise calls are checked against float64;
    a run all float32 keeps no elementwise check (its float32 tolerance sees them)."""
    bench = _record(tmp_path / "bench", dtype=torch.float32)
    target = _record(tmp_path / "target", _DoubleElements(ADD, 1), dtype=torch.float32, autocast=True)
    result = compare_dumps(bench, target, progress=False)
    add = [r for r in result.rows if r.target_op == "aten.add.Tensor" and r.module == ""]
    assert len(add) == 2 and add[1].target_dtype == "float32" and add[1].mode == "stats"
    assert (add[1].status, add[1].origin, add[1].cause) == ("fail", "born", "local error"), add[1]
    assert "every element" in add[1].note
    checks = [m.check for r in xray.load_dump(bench).records if r.op == "aten.add.Tensor" for _, m in r.output_tensors()]
    assert checks and all(c is None for c in checks)


def test_identical_bf16_runs_and_a_bf16_run_against_float32_fail_nothing(tmp_path):
    """No fault: two identical bf16 runs, a bf16 run and an autocast one against the float32
    one, have no FAIL row, however many elementwise checks they hold."""
    bf16, again = _record(tmp_path / "bf16"), _record(tmp_path / "again")
    fp32 = _record(tmp_path / "fp32", dtype=torch.float32)
    autocast = _record(tmp_path / "autocast", dtype=torch.float32, autocast=True)
    for bench, target in ((bf16, again), (fp32, bf16), (fp32, autocast)):
        rows = compare_dumps(bench, target, progress=False).rows
        assert not [r for r in rows if r.status == "fail"], [r for r in rows if r.status == "fail"][:2]


def _two_layer_recorder(branch, backward=False):
    """``record(folder, fault=None)`` -> its dump folder: two bf16 Linear layers at 512 x 1024,
    ``h = h + branch(layer(h))``, recorded with the defaults (``backward``: a training step, its
    backward recorded too)."""
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(2)).to(torch.bfloat16)
    x = torch.randn(1, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)

    def record(folder, fault=None):
        with contextlib.nullcontext() if backward else torch.no_grad(), fault or contextlib.nullcontext(), \
                xray.dump(dump_dir=folder, **({"X_DEBUG": 0x10A} if backward else {})) as d:
            h = x
            for layer in layers:
                h = h + branch(layer(h))
            if backward:
                h.float().square().mean().backward()
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        return d.folder
    return record


def test_a_fault_in_an_op_exact_at_its_dtype_is_born_there(tmp_path):
    """A division by 32 is exact in bf16: the sample's recomputation reads 0 against a floor of
    0, which must not outweigh the self-check (three doubled elements read 1 there)."""
    div = torch.ops.aten.div.Scalar
    record = _two_layer_recorder(lambda y: div(y, 32.0))
    result = compare_dumps(record(tmp_path / "bench"), record(tmp_path / "target", _DoubleElements(div, 1)),
                           progress=False)
    second = [r for r in result.rows if r.target_op == "aten.div.Scalar"][1]
    assert second.mode == "stats" and (second.status, second.origin) == ("fail", "born"), second
    assert result.summary.verdict.startswith("born at aten.div.Scalar")


ROW_OPS = {  # an op whose output element reads one row of its input, as the layer uses it
    "aten._softmax.default": lambda y: torch.softmax(y, -1) * HIDDEN,
    "aten._safe_softmax.default": lambda y: torch.ops.aten._safe_softmax(y, -1) * HIDDEN,
    "aten._log_softmax.default": lambda y: torch.log_softmax(y, -1) / 8,
    "aten.glu.default": lambda y: torch.nn.functional.glu(torch.cat([y, y.flip(-1)], -1), -1),
}


@pytest.mark.parametrize("call", [0, 1])
@pytest.mark.parametrize("name", sorted(ROW_OPS))
def test_three_doubled_elements_of_a_softmax_or_glu_are_born_there(tmp_path, name, call):
    """Softmax, log-softmax and GLU are not tagged pointwise (an output element reads its row, or
    two elements), yet cost what an elementwise op costs to run again whole: a bf16 run with the
    defaults, three doubled elements of the first layer's call (its tensors saved: their normwise
    error is a few thousandths) or the second's (statistics only), is named born there."""
    op = getattr(torch.ops.aten, name.split(".")[1]).default
    record = _two_layer_recorder(ROW_OPS[name])
    bench = record(tmp_path / "bench")
    result = compare_dumps(bench, record(tmp_path / "target", _DoubleElements(op, call)), progress=False)
    calls = [r for r in result.rows if r.target_op == name]
    assert [r.mode for r in calls] == ["data", "stats"] and calls[1 - call].status == "pass", calls
    assert (calls[call].status, calls[call].origin) == ("fail", "born"), calls[call]
    assert result.summary.verdict.startswith(f"born at {name}"), result.summary.verdict
    again = compare_dumps(bench, record(tmp_path / "again"), progress=False)
    assert not [r for r in again.rows if r.status == "fail"]


def test_a_bf16_softmax_backward_with_three_doubled_elements_is_born_there(tmp_path):
    """The backward of a softmax (``_softmax_backward_data``: each input gradient reads its row
    of the output and of its gradient) in a bf16 training step, recorded with backward on."""
    op = torch.ops.aten._softmax_backward_data.default
    record = _two_layer_recorder(lambda y: torch.softmax(y, -1) * HIDDEN, backward=True)
    bench = record(tmp_path / "bench")
    result = compare_dumps(bench, record(tmp_path / "target", _DoubleElements(op, 0)), progress=False)
    calls = [r for r in result.rows if r.target_op == "aten._softmax_backward_data.default"]
    assert len(calls) == 2, calls
    faulted = [r for r in calls if r.status == "fail"]
    assert len(faulted) == 1 and faulted[0].origin == "born", calls
    assert result.summary.verdict.startswith("born at aten._softmax_backward_data"), result.summary.verdict


def test_a_small_float32_output_is_checked_in_a_run_all_float32_and_a_large_one_is_not():
    """A float32 output of at most SMALL_OUTPUT elements keeps a check in any run: its 32-element
    sample can miss the element that makes a statistic. A larger one keeps none outside a
    half-precision run (its statistics compare at float32's tolerance)."""
    small, large = torch.rand(16, 4) + 0.01, torch.rand(SMALL_OUTPUT + 1) + 0.01
    assert elementwise_check("aten.reciprocal.default", {"self": small}, small.reciprocal())[0] <= torch.finfo().eps
    wrong = small.reciprocal()
    wrong[3, 1] *= 1.01
    assert elementwise_check("aten.reciprocal.default", {"self": small}, wrong)[0] == pytest.approx(0.01, rel=1e-3)
    assert elementwise_check("aten.reciprocal.default", {"self": large}, large.reciprocal()) is None


def test_a_division_whose_smallest_divisor_makes_its_minimum_carries_tf32_with_the_defaults(tmp_path):
    """PhiMoE's router (sparsemixer) divides by ``scores.abs().clamp(min=max)``: under TF32 the
    smallest divisor of 64 (0.0024) moves 0.84 % and becomes the output's minimum, which its
    32-element sample leaves out. Judged on statistics against its inputs' normwise error
    (7e-5), the training step's division was born there, a false FAIL; its self-check reads
    every element right, so it carries its inputs' precision."""
    from conftest import sweep_noise_run

    o = sweep_noise_run("phimoe", tmp_path, noise="tf32", backward=True, train_mode=True)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


def test_a_float16_gradient_below_the_smallest_normal_reads_its_rounding_and_doubled_elements_still_read():
    """Below float16's smallest normal (6.1e-5) rounding moves a value by absolute steps (gradual
    underflow): a right ``sigmoid_backward`` on gradients of 2e-5, as an fp16 training step's are,
    rounds twice and reads a unit, not the 26 % its relative error there would be; three doubled
    elements still read far above any floor."""
    torch.manual_seed(0)
    g, y = (torch.randn(TOKENS, HIDDEN) * 2e-5).half(), torch.rand(TOKENS, HIDDEN).half()
    bound = {"grad_output": g, "output": y}
    right = torch.ops.aten.sigmoid_backward.default(g, y)
    assert 0 < elementwise_check("aten.sigmoid_backward.default", bound, right)[0] <= torch.finfo(torch.float16).eps
    wrong = right.clone()
    wrong.view(-1)[[7, wrong.numel() // 3, wrong.numel() - 2]] *= 2
    assert elementwise_check("aten.sigmoid_backward.default", bound, wrong)[0] >= 0.1
