"""What quantization is allowed to cost a tensor, and what it did cost.

Error of a quantized run against float is read as noise: the noise-to-signal ratio
``NSR = sum((q - f)^2) / sum(f^2)`` (SQNR = -10 log10 NSR). The budget follows the additive
noise model of uniform quantization (Widrow): rounding a tensor to steps ``s`` adds noise of
power ``s^2 / 12`` per element, independent of the signal, and independent noise powers add:

- a tensor quantized per tensor (activations, asymmetric int8: ``s = (max - min) / 255``, the
  range including 0) or per output channel (weights, symmetric int8: ``s_c = max|W_c| / 127``)
  gains ``NSR_q = mean(s^2 / 12) / mean(f^2)``;
- a product (``mm``, ``addmm``, ``bmm``, ``convolution``, ``mul``) carries the sum of its
  inputs' NSRs (relative errors of factors add);
- a sum (``add``, ``sub``) carries the sum of its inputs' noise powers over its own signal power;
- an elementwise nonlinearity (relu, gelu, softmax...) passes up to twice its input's NSR on;
- a layer norm removes the mean and keeps the noise: NSR x mean(x^2) / var(x);
- every other op passes the largest NSR of its inputs on (views, normalisations: an
  approximation, which the margin below absorbs).

Every op's output is granted one rounding of its own: each flow picks which tensors it stores as
int8 (XNNPACK's quantizer: linear, conv, add, mul, cat...; ORT's QDQ: more), and a dequantized
value may be captured after a view of the op that rounded it.

Steps come from the *float* values, the ones a correct int8 flow would choose; a deployed
scale that is wrong (a weight scale off by a factor, one per-tensor scale where per-channel was
meant) is therefore beyond the budget instead of explaining itself.

A captured tensor is within int8 quantization when its measured NSR is at most what its inputs
brought (their measured NSRs where the backend exposed them, else their allowed NSRs, combined by
the rules above) plus ``MARGIN`` times its own quantization noise (a weight's own noise, too,
enters with ``MARGIN``). Floats keep compare's rules; this module is only used for quantized runs.

The other schemes (``SCHEMES``) differ only in where rounding happens, each step again from the
values a correct flow would round: ``int8-dynamic`` rounds a product's activation inputs at run
time (per tensor, from the input it is given) and leaves every output float; ``int4`` and
``int8-weights`` round the weights only (int4 in groups of 32 along the input dimension).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

# How much more noise than the uniform-rounding model a correctly quantized tensor may carry:
# the model ignores clipping, the range of one calibration batch, ops that amplify relative
# error (softmax, normalisation) and requantization inside fused kernels.
MARGIN = 8.0

PRODUCTS = frozenset({"mm", "addmm", "bmm", "convolution", "mul", "matmul", "linear", "conv2d", "baddbmm"})
SUMS = frozenset({"add", "sub"})
# Elementwise nonlinearities can raise a relative error they pass on (relu zeroes half of a
# signal's power; the noise near the zero crossings stays): their inherited NSR may double.
NONLINEAR = frozenset({"relu", "gelu", "silu", "tanh", "sigmoid", "hardtanh", "clamp", "_softmax", "softmax",
                       "exp", "erf"})
NONLINEAR_GAIN = 2.0

ACT_LEVELS = 255.0  # asymmetric int8 activations: 256 levels over [min, max] (0 included)
WEIGHT_LEVELS = 127.0  # symmetric int8 weights: [-127, 127] * s

# What a float32 kernel may add to an op a scheme leaves float (two float32 kernels of one op,
# different summation orders, agree to ~1e-6 relative: 120 dB). It enters by the triangle
# inequality, not as independent noise: the kernel's error is measured against a replay of the
# same inputs, and its cross term with the inherited error is what it can move.
FLOAT_NSR = 1e-12


@dataclass(frozen=True)
class Scheme:
    """Where a quantization scheme rounds, and to which steps: the one rule per scheme.

    ``weight_levels``: symmetric weights, step ``max|W_g| / weight_levels`` over each group ``g``
    (an output channel, or ``weight_group`` elements of one along the input dimension; such a
    group's grid is ``[-levels, levels - 1]`` steps with its largest magnitude at ``-levels``);
    ``activations``: ``static`` rounds every output per tensor (calibrated), ``dynamic`` rounds a
    product's activation inputs per tensor at run time, ``none`` keeps activations float."""

    name: str
    weight_levels: float
    weight_group: int | None
    activations: str
    summary: str

    def output_nsr(self, f: torch.Tensor) -> float:
        """The NSR rounding an op's output adds (static int8 stores every output as int8)."""
        return activation_nsr(f) if self.activations == "static" else 0.0

    def input_nsr(self, kind: str, activations: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """The NSR a product's run-time rounding of its activation inputs adds, given (float value,
        value the kernel received) pairs: dynamic int8 picks ``(max - min) / 255`` per tensor from
        the input it receives (behind a faulty layer, a wider one), against the float input's
        signal; relative errors of factors add."""
        if self.activations != "dynamic" or kind not in MATMULS:
            return 0.0
        out = 0.0
        for f, got in activations:
            power = float(f.detach().double().pow(2).mean()) if f.numel() else 0.0
            out += activation_step(got) ** 2 / 12.0 / power if power > 0 else 0.0
        return out

    @property
    def float_noise(self) -> float:
        """The float kernels' allowance on ops the scheme leaves float (none under static int8,
        whose one output rounding per op is far larger)."""
        return 0.0 if self.activations == "static" else FLOAT_NSR


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("int8", WEIGHT_LEVELS, None, "static",
           "static int8: per-channel symmetric weights, per-tensor activations calibrated on the run's inputs"),
    Scheme("int8-dynamic", WEIGHT_LEVELS, None, "dynamic",
           "dynamic int8 linear: per-channel symmetric weights, activations rounded per tensor at run time"),
    # ONNX Runtime's symmetric int4 blocks map the largest magnitude to -8: step max|W_g| / 8 (measured)
    Scheme("int4", 8.0, 32, "none", "int4 weight-only: symmetric, one scale per 32 weights along the input "
           "dimension; activations float"),
    Scheme("int8-weights", WEIGHT_LEVELS, None, "none",
           "int8 weight-only: per-channel symmetric weights; activations float"),
)}

# The products whose activation inputs a dynamic int8 kernel rounds (not an elementwise ``mul``).
MATMULS = frozenset({"mm", "addmm", "bmm", "convolution", "matmul", "linear", "conv2d", "baddbmm"})


def scheme(name: str | None) -> Scheme:
    """The scheme of a ``quant=`` value (None: static int8, the first scheme)."""
    return SCHEMES[name or "int8"]


def nsr(ref: torch.Tensor, got: torch.Tensor) -> float:
    """Noise-to-signal ratio of ``got`` against ``ref`` (0: identical; inf: a zero reference
    with any error)."""
    r, g = ref.detach().double().reshape(-1), got.detach().double().reshape(-1)
    same = g == r  # equal values carry no error, infinities (a mask's -inf) included
    noise = float(((g - r).masked_fill(same, 0.0) ** 2).sum())
    signal = float((r.masked_fill(~torch.isfinite(r), 0.0) ** 2).sum())
    if noise == 0.0:
        return 0.0
    return noise / signal if signal > 0 else math.inf


def sqnr_db(nsr_value: float) -> float:
    """10 log10(signal power / noise power); inf for no noise."""
    if nsr_value <= 0.0:
        return math.inf
    if math.isinf(nsr_value):
        return -math.inf
    return -10.0 * math.log10(nsr_value)


def rel_err(ref: torch.Tensor, got: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| (L2): sqrt(NSR)."""
    return math.sqrt(nsr(ref, got))


def activation_step(t: torch.Tensor) -> float:
    """The int8 step a per-tensor asymmetric quantizer calibrated on ``t`` would use."""
    f = t.detach().double()
    if not f.numel():
        return 0.0
    lo, hi = min(float(f.min()), 0.0), max(float(f.max()), 0.0)
    return (hi - lo) / ACT_LEVELS


def activation_nsr(t: torch.Tensor) -> float:
    """NSR that rounding ``t`` to its per-tensor int8 step adds."""
    power = float(t.detach().double().pow(2).mean()) if t.numel() else 0.0
    return activation_step(t) ** 2 / 12.0 / power if power > 0 else 0.0


def weight_nsr(w: torch.Tensor, sch: Scheme | None = None) -> float:
    """NSR that the scheme's symmetric weight rounding (default: int8 per output channel, dim 0) adds."""
    f = w.detach().double()
    if f.dim() < 2 or not f.numel():
        return 0.0
    power = float(f.pow(2).mean())
    return float(weight_rounding_variance(f, sch).mean()) / power if power > 0 else 0.0


NORMALIZATIONS = frozenset({"native_layer_norm", "layer_norm"})


def normalization_gain(x: torch.Tensor, dims: int) -> float:
    """How much a layer norm over the last ``dims`` dimensions raises the NSR it is fed: it keeps
    the noise and removes the mean, so NSR grows by mean(x^2) / var(x)."""
    f = x.detach().double()
    if not f.numel() or dims <= 0:
        return 1.0
    flat = f.reshape(-1, int(torch.tensor(f.shape[-dims:]).prod()))
    var = float(flat.var(dim=1, unbiased=False).mean())
    return float(flat.pow(2).mean()) / var if var > 0 else 1.0


def combine(kind: str, inputs: list[tuple[float, float]], out_power: float, gain: float | None = None) -> float:
    """NSR an op's output carries from its float inputs, given as (NSR, signal power) pairs.
    ``gain``: an elementwise op's measured NSR gain at its float input (``elementwise_gain``);
    the larger of it and the rule's is used."""
    if not inputs:
        return 0.0
    if kind in PRODUCTS:
        return sum(n for n, _ in inputs)
    if kind in SUMS:
        noise = sum(n * p for n, p in inputs)
        return noise / out_power if out_power > 0 else max(n for n, _ in inputs)
    rule = NONLINEAR_GAIN if kind in NONLINEAR else 1.0
    return max(rule, gain or 0.0) * max(n for n, _ in inputs)


def elementwise_gain(x: torch.Tensor, call: Callable[[torch.Tensor], Any], nsr_in: float) -> float | None:
    """How much a one-input elementwise op raises the NSR of noise on its input, measured at the
    float input: ``call(x + e)`` against ``call(x)`` for Gaussian ``e`` of NSR ``nsr_in``.

    The fixed rules miss ops whose relative error grows with their argument: ``cos`` of a rotary
    angle of 7 rad turns the angle's small relative error into a large one on a value near 0."""
    f = x.detach().double()
    power = float(f.pow(2).mean()) if f.numel() else 0.0
    if power <= 0 or nsr_in <= 0 or not math.isfinite(nsr_in):
        return None
    e = torch.randn(f.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    noisy = f + e * math.sqrt(nsr_in * power)
    try:
        ref, got = call(f), call(noisy)
    except Exception:  # noqa: BLE001 - an op that does not take float64 is left to the rules
        return None
    if not isinstance(ref, torch.Tensor) or not isinstance(got, torch.Tensor) or ref.shape != f.shape:
        return None
    measured_in = nsr(f, noisy)
    return nsr(ref, got) / measured_in if measured_in > 0 else None


@dataclass
class Budget:
    """One tensor's int8 budget: what it inherits, what its own quantization adds, the allowed total."""

    inherited: float  # NSR its inputs may bring (measured where captured, else allowed), combined by the rules
    expected_inherited: float  # the same with the model's expectation for inputs not captured
    own: float  # NSR its own rounding (output, or a dynamic kernel's inputs) adds, from float steps
    step: float  # the output's int8 step (per-tensor, from the float values)
    float_noise: float = 0.0  # a float kernel's own error (``Scheme.float_noise``), by the triangle inequality

    @property
    def allowed(self) -> float:
        return (math.sqrt(self.inherited + MARGIN * self.own) + math.sqrt(self.float_noise)) ** 2

    @property
    def expected(self) -> float:
        return self.expected_inherited + self.own


def within(measured: float, budget: Budget) -> bool:
    """The verdict: the measured NSR fits what int8 quantization explains (no error always does:
    a constant -inf has no finite budget)."""
    if measured == 0.0:
        return True
    return measured <= budget.allowed * (1 + 1e-9) + 1e-30


def rms_steps(ref: torch.Tensor, got: torch.Tensor, step: float) -> float | None:
    """The RMS error of ``got`` in units of the output's int8 step (one rounding: 0.29)."""
    if step <= 0 or not ref.numel():
        return None
    d = got.detach().double().reshape(-1) - ref.detach().double().reshape(-1)
    return float(d.pow(2).mean().sqrt()) / step


# --- a weighted layer's own error, fed float inputs ----------------------------------------
#
# A layer fed float inputs (the backend's isolated run) errs only by its weights' rounding, its
# int8 input's rounding where its input was not fed float, and its output's rounding where the
# value is read after it. Each is a sum of independent uniform rounding errors, so its noise
# power is known exactly from the float tensors: for y = x W (a product linear in each), weight
# errors of variance v_c = s_c^2 / 12 (per output channel c) give noise variance op(x^2, v) at
# every output, and input errors of variance s_x^2 / 12 give op(s_x^2 / 12, W^2). Unlike the
# accumulated budget, nothing here is a propagation rule, so the margin can be small: a per-tensor
# weight scale (the largest channel's step on every channel) or a wrong scale shows as several
# times the predicted noise, where per-channel rounding stays within a few percent of it.

# How much more noise than predicted a correctly rounded layer may show: the prediction is the
# expectation of a sum over many elements; its spread (a few percent for the smallest layers of
# the benchmark) and clipping at the calibrated range stay well inside 1.5x (1.8 dB).
LOCAL_MARGIN = 1.5
WEIGHTED = frozenset({"mm", "addmm", "convolution"})
# The prediction is an expectation; a small layer fed correlated rows (post-ReLU, all positive)
# spreads widely around it: tiny_mlp's head (10 x 64 weights, 16 rows) by 30%, so a correct
# head measured 1.57x under dynamic int8. The band is also LOCAL_Z standard deviations of that
# spread (``prediction_spread``), where that is wider than LOCAL_MARGIN.
LOCAL_Z = 3.0


def prediction_spread(kind: str, x: torch.Tensor, w: torch.Tensor, sch: Scheme | None = None) -> float | None:
    """The standard deviation of a linear layer's weight rounding noise (summed over its output)
    around ``local_noise_power``'s expectation: ``2 sum_c v_c^T (A o A) v_c`` with ``A = x^T x``
    and ``v_c`` output channel c's rounding variances (Gaussian errors; uniform ones spread less,
    so this bounds them). None for a convolution (not modelled: its margin is LOCAL_MARGIN)."""
    if kind == "convolution" or w.dim() != 2:
        return None
    xf = x.detach().double().reshape(-1, w.shape[1])
    a = xf.t() @ xf
    v = weight_rounding_variance(w, sch)
    return math.sqrt(2.0 * float(((v @ (a * a)) * v).sum()))


def local_margin(predicted: float, spread: float | None) -> float:
    """How many times its predicted noise a correctly rounded layer may show, fed float inputs."""
    if not spread or predicted <= 0:
        return LOCAL_MARGIN
    return max(LOCAL_MARGIN, 1.0 + LOCAL_Z * spread / predicted)


def round_weights(w: torch.Tensor, sch: Scheme | None = None, scale: float = 1.0) -> torch.Tensor:
    """``w`` rounded to the scheme's grid (dequantized): symmetric per output channel (dim 0;
    int8 by default), ``[-levels, levels] * s_c``; or in groups of ``weight_group`` along the
    input dimension, ``[-levels, levels - 1] * s_g`` with the group's largest magnitude at
    ``-levels`` (ONNX Runtime's blockwise int4: the other sign clips at ``levels - 1``; the last
    group zero-padded). ``scale``: the steps read that many times too large (a wrong scale)."""
    sch = sch or SCHEMES["int8"]
    f = w.detach().double()
    flat = f.reshape(f.shape[0], -1)
    if sch.weight_group is None:
        step = flat.abs().amax(dim=1, keepdim=True) / sch.weight_levels
        step = torch.where(step > 0, step, torch.ones_like(step))
        q = torch.clamp(torch.round(flat / step), -sch.weight_levels, sch.weight_levels)
        return (q * step * scale).reshape(f.shape)
    k, g = flat.shape[1], sch.weight_group
    groups = torch.nn.functional.pad(flat, (0, -k % g)).reshape(flat.shape[0], -1, g)
    peak = groups.gather(2, groups.abs().argmax(dim=2, keepdim=True))  # signed: it lands on -levels
    step = torch.where(peak != 0, -peak / sch.weight_levels, torch.ones_like(peak))
    q = torch.clamp(torch.round(groups / step), -sch.weight_levels, sch.weight_levels - 1) * step * scale
    return q.reshape(flat.shape[0], -1)[:, :k].reshape(f.shape)


def weight_rounding_variance(w: torch.Tensor, sch: Scheme | None = None) -> torch.Tensor:
    """Per element of ``w``: the variance of the scheme's weight rounding (``round_weights``).

    Per output channel: ``s_c^2 / 12``, the uniform model (the grid covers the channel's range).
    In groups (int4): the group's mean square rounding error over its weights (not the zero
    padding of a last, short group), from its float values: 16 levels
    clip the other sign's top half step, no small part (1.15x the uniform model on nn.Linear's
    weights, measured)."""
    sch = sch or SCHEMES["int8"]
    f = w.detach().double()
    flat = f.reshape(f.shape[0], -1)
    if sch.weight_group is None:
        steps = flat.abs().amax(dim=1, keepdim=True) / sch.weight_levels
        return (steps ** 2 / 12.0).expand_as(flat).reshape(f.shape)
    k, g = flat.shape[1], sch.weight_group
    err = torch.nn.functional.pad((round_weights(flat, sch) - flat).pow(2), (0, -k % g)).reshape(flat.shape[0], -1, g)
    real = torch.nn.functional.pad(torch.ones(k, dtype=f.dtype), (0, -k % g)).reshape(-1, g).sum(dim=1)
    var = (err.sum(dim=2) / real).unsqueeze(2).expand(-1, -1, g)  # over its real weights, not the padding
    return var.reshape(flat.shape[0], -1)[:, :k].reshape(f.shape)


def _apply(kind: str, x: torch.Tensor, w: torch.Tensor, conv_args: tuple) -> torch.Tensor:
    """The layer's linear op on (x, w), w in its module's layout (out channels first)."""
    if kind == "convolution":
        return torch.ops.aten.convolution.default(x, w, None, *conv_args)
    return x @ w.t()


def local_noise_power(kind: str, x: torch.Tensor, w: torch.Tensor, conv_args: tuple = (),
                      input_step: float = 0.0, sch: Scheme | None = None) -> tuple[float, float]:
    """(weight rounding, input rounding) noise power, summed over the output, of the product
    ``kind`` (mm/addmm: ``x @ w.T``; convolution: ``conv(x, w)``) under the scheme's weight
    rounding (default per-channel int8) and, with ``input_step``, an input rounded to that step."""
    xf, wf = x.detach().double(), w.detach().double()
    weight = float(_apply(kind, xf ** 2, weight_rounding_variance(wf, sch).contiguous(), conv_args).sum())
    inputs = 0.0
    if input_step > 0:
        # an exact zero (ReLU's half of its input, padding) lies on the grid: it rounds to itself
        var = (xf != 0).double() * (input_step ** 2 / 12.0)
        inputs = float(_apply(kind, var, wf ** 2, conv_args).sum())
    return weight, inputs


# ONNX Runtime's CPU kernel for a float activation times int8 weights (MatMulNBits, which its
# optimizer fuses ``DequantizeLinear(W) -> Gemm`` into when the activation is not itself
# dequantized) rounds the activation on the fly: symmetric int8, one step per row and block of
# 32 along the reduced dimension (measured: it reproduces tiny_mlp's fed-float layers to 1e-9).
ACTIVATION_BLOCK = 32


def input_roundings(x: torch.Tensor, step: float, kind: str) -> dict[str, torch.Tensor]:
    """The ways an int8 kernel may have rounded a layer's float input ``x`` before multiplying:
    not at all, to its per-tensor grid of ``step`` (a Q/DQ pair), or per row in blocks of
    ``ACTIVATION_BLOCK`` (a dynamic int8 kernel). Each is a known error, not noise."""
    xf = x.detach().double()
    out = {"float": xf}
    if step > 0:
        out["per tensor"] = torch.round(xf / step) * step
    if kind != "convolution" and xf.dim() == 2 and xf.shape[1] % ACTIVATION_BLOCK == 0:
        blocks = xf.reshape(xf.shape[0], -1, ACTIVATION_BLOCK)
        s = blocks.abs().amax(-1, keepdim=True) / WEIGHT_LEVELS
        out["blocks"] = (torch.round(blocks / torch.where(s > 0, s, 1.0)) * s).reshape(xf.shape)
    return out


def weight_error_alone(kind: str, err: torch.Tensor, x: torch.Tensor, w: torch.Tensor, conv_args: tuple,
                       step: float, sch: Scheme | None = None) -> tuple[float, float, str]:
    """(noise power left, the weights' predicted rounding noise, how the input was rounded) of a
    layer's measured error ``err`` (its output fed float input ``x``, minus the float output) once
    the input's rounding is taken out: of the roundings ``input_roundings`` knows, the one that
    leaves the least. A weight's own error is independent of its input's, so this choice cannot
    absorb a wrong weight; what is left is the weights' rounding and the output's."""
    wf = w.detach().double()
    best = None
    for how, xq in input_roundings(x, step, kind).items():
        left = float((err - _apply(kind, xq - x.detach().double(), wf, conv_args).reshape(err.shape)).pow(2).sum())
        if best is None or left < best[0]:
            best = (left, xq, how)
    left, xq, how = best
    return left, local_noise_power(kind, xq, wf, conv_args, sch=sch)[0], how


def grid_step(t: torch.Tensor) -> float | None:
    """The step of the int8 grid ``t``'s values lie on (a dequantized tensor holds at most 256
    distinct values, so some repeat), or None when they do not, or all differ (no evidence)."""
    f = t.detach().reshape(-1)
    if not f.is_floating_point():
        return None
    u = torch.unique(f)
    if u.numel() > 256 or u.numel() < 2 or u.numel() == f.numel():
        return None
    return float(torch.diff(u.double()).min())
