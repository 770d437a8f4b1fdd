"""The measured-noise rule: is a result's error explained by the rounding noise of the op itself?

The reference is the op in fp64 on CPU: the exact result for the very inputs, up to fp64
rounding. The *noise* is what CPU at the result's own dtype makes against that reference on the
same inputs: how far an honest kernel at that precision lands, whatever the op (a long
reduction, a fused attention, a libm call). A result passes when, element by element, its error
is within ``K_NOISE`` times that noise at the element's scale, plus the smallest normal number.
No op names: the op's own CPU run says how noisy it is.

Definitions (docs/gen.md, "Pass criteria"):

* scale ``s_i = max(|r_i|, rms(r))``: an element much smaller than the output's typical size
  (cancellation in a sum) carries the rounding error of the large terms that made it.
* noise level ``nu = max(max_i |c_i - r_i| / s_i, eps(D) * sqrt(depth))``: the CPU's worst
  error in units of scale, floored at the rounding of a ``depth``-term sum, because a
  few-element output can land near-exact on CPU by luck while another summation order does not.
* pass: ``|d_i - r_i| <= K_NOISE * nu * s_i + smallest_normal(D)`` for every finite element;
  non-finite values where the reference (or CPU at the same dtype) has the same ones; integer
  and bool results exactly equal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# How many times the CPU's own noise another kernel may make. Measured by tools/gen_selfcheck.py
# on 7 transformers architectures x 3 seeds (771 generated tests): computing every op another way
# at the same dtype (split-K matmuls, sums of two halves, channels-last convolutions, torch's ATen
# decompositions) reaches at most 1.33x the CPU's noise; one thread instead of two, 1.00x. The
# largest fp32 noise level there is 1.7e-6, so 4 x nu < 7e-6 still flags a 1e-3 relative error
# (all 615 floating tests failed with their op 1e-3 off, whole tensor or 3 elements).
K_NOISE = 4.0

_WIDE = {False: torch.float64, True: torch.complex128}


def is_inexact(dtype: torch.dtype) -> bool:
    """Floating or complex: results carry rounding noise (integers and bools must be exact)."""
    return dtype.is_floating_point or dtype.is_complex


def eps(dtype: torch.dtype) -> float:
    """Machine epsilon of ``dtype`` (of its real part for complex); 0 for exact dtypes."""
    if dtype.is_complex:
        return torch.finfo(dtype.to_real()).eps
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def smallest_normal(dtype: torch.dtype) -> float:
    """The absolute floor: a device that flushes subnormals to zero (most GPU fast paths) moves
    a value by at most this much."""
    if dtype.is_complex:
        dtype = dtype.to_real()
    return torch.finfo(dtype).smallest_normal if dtype.is_floating_point else 0.0


def wide(t: torch.Tensor) -> torch.Tensor:
    """A CPU fp64 (complex128) copy: every error is computed there."""
    return t.detach().to("cpu").to(_WIDE[t.is_complex()])


# -- ulps ----------------------------------------------------------------------------------------

def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s representable numbers at ``|x|`` (fp64; subnormal spacing below
    the smallest normal)."""
    a = wide(x).abs()
    _, exponent = torch.frexp(a.clamp(min=smallest_normal(dtype)))  # a = m * 2**e, m in [0.5, 1)
    return eps(dtype) * torch.ldexp(torch.ones_like(a), exponent - 1)


_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns as integers in the order of the values they encode (-0 and +0 equal)."""
    i = t.contiguous().view(_BITS[t.element_size()]).to(torch.int64)
    magnitude = i & ((1 << (8 * t.element_size() - 1)) - 1)
    return torch.where(i < 0, -magnitude, magnitude)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable numbers of ``a``'s real floating dtype lie between ``a`` and ``b``
    (``b`` is rounded to that dtype first). int64; NaNs give the largest int64."""
    if not a.dtype.is_floating_point or a.dtype.itemsize not in _BITS:
        raise TypeError(f"ulp_distance needs a real floating tensor, got {a.dtype}")
    b = b.detach().to("cpu").to(a.dtype)
    a = a.detach().to("cpu")
    ia, ib = _ordered(a), _ordered(b)
    if a.element_size() == 8:  # the difference of two int64 keys can overflow: saturate
        d = (ia.to(torch.float64) - ib.to(torch.float64)).abs().clamp(max=2.0**62).to(torch.int64)
    else:
        d = (ia - ib).abs()
    nan = torch.isnan(a) | torch.isnan(b)
    return torch.where(nan, torch.iinfo(torch.int64).max, d)


# -- scale and noise -----------------------------------------------------------------------------

def rms(x: torch.Tensor) -> float:
    """Root mean square of the finite elements of an fp64 tensor, finite for any finite input
    (scaled by the largest magnitude, so squares of values near fp64's range do not overflow)."""
    a = x.abs()
    a = a[torch.isfinite(a)]
    if a.numel() == 0:
        return 0.0
    top = float(a.max())
    if top == 0.0:
        return 0.0
    return top * math.sqrt(float((a / top).square().mean()))


def scale(reference: torch.Tensor) -> torch.Tensor:
    """Per-element scale ``max(|r_i|, rms(r))`` of an fp64 reference (0 where not finite)."""
    a = reference.abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype))
    return a.clamp(min=rms(reference))


@dataclass(frozen=True)
class Noise:
    """How noisy an honest result of ``dtype`` is for this op and these inputs."""

    dtype: torch.dtype
    level: float  #: nu: the allowed error unit, relative to each element's scale
    measured: float  #: the CPU's own worst error / scale (nan: not measured)
    cpu_max_abs_err: float  #: max |c - r| of CPU at the same dtype (nan: not measured)
    floor: float  #: eps(D) * sqrt(depth), the level's lower bound

    @property
    def budget(self) -> float:
        """The allowed error relative to the scale: ``K_NOISE * level``."""
        return K_NOISE * self.level


def depth_of(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """How many input elements feed each output element at least (largest input / output numel):
    1 for elementwise ops, the reduced length for sums and norms."""
    n_out = max((o.numel() for o in outputs), default=0)
    n_in = max((t.numel() for t in inputs), default=0)
    return max(1, n_in // n_out) if n_out else 1


def measure(reference: torch.Tensor, same_dtype: torch.Tensor | None, dtype: torch.dtype,
            depth: int = 1) -> Noise:
    """The noise of ``dtype`` on CPU (``same_dtype``) against the fp64 ``reference``.

    ``same_dtype`` None (CPU cannot run the op at that dtype): the level is the floor alone.
    """
    floor = eps(dtype) * math.sqrt(max(1, depth))
    if not is_inexact(dtype):
        return Noise(dtype, 0.0, 0.0, 0.0, 0.0)
    if same_dtype is None or tuple(same_dtype.shape) != tuple(reference.shape):
        return Noise(dtype, floor, math.nan, math.nan, floor)
    r, c = wide(reference), wide(same_dtype)
    both = torch.isfinite(r) & torch.isfinite(c)
    if not bool(both.any()):
        return Noise(dtype, floor, 0.0, 0.0, floor)
    err = (c - r).abs()[both]
    s = scale(r)[both]
    worst_abs = float(err.max())
    ratio = torch.where(s > 0, err / s.clamp(min=torch.finfo(torch.float64).tiny), torch.zeros_like(err))
    measured = float(ratio.max())
    return Noise(dtype, max(measured, floor), measured, worst_abs, floor)


def assumed(dtype: torch.dtype) -> Noise:
    """The noise level when no fp64 reference can be run (replay compares two backends at the
    same dtype): fp16/bf16/fp8 kernels accumulate in fp32 and round the result once or twice
    (2 eps); fp32/fp64 kernels accumulate at their own precision, where a reordered sum of up to
    4096 terms moves by ~sqrt(4096) = 64 eps."""
    if not is_inexact(dtype):
        return Noise(dtype, 0.0, math.nan, math.nan, 0.0)
    e = eps(dtype)
    level = e * (2.0 if e > 1e-4 else 64.0)
    return Noise(dtype, level, math.nan, math.nan, level)


# -- the verdict ---------------------------------------------------------------------------------

@dataclass
class Verdict:
    """One result judged against its noise."""

    ok: bool
    numel: int
    bad: int  #: elements outside the budget (or with mismatched non-finite values)
    max_abs_err: float  #: max |d - r| over finite pairs (inf when a non-finite value mismatches)
    max_rel_err: float  #: max |d - r| / |r| over elements with |r| > 1e-3 rms(r)
    err_vs_noise: float  #: max |d - r| / (nu s + smallest_normal / K_NOISE); passes up to K_NOISE
    max_ulp_err: float  #: max ulp distance from the reference rounded to D (nan: not floating)
    reason: str = ""


def judge(result: torch.Tensor, reference: torch.Tensor, noise: Noise,
          same_dtype: torch.Tensor | None = None) -> Verdict:
    """Judge ``result`` (dtype D, any device) against the fp64 ``reference`` with ``noise``.

    ``same_dtype`` (CPU at D, optional) also licenses its own non-finite values (an overflow at D
    the wide reference does not have) and, for exact dtypes, its own values.
    """
    n = result.numel()
    if tuple(result.shape) != tuple(reference.shape):
        return Verdict(False, n, n, math.inf, math.inf, math.inf, math.nan,
                       f"shape {list(result.shape)} != reference {list(reference.shape)}")
    if n == 0:
        return Verdict(True, 0, 0, 0.0, 0.0, 0.0, 0.0)
    d, r = wide(result), wide(reference)
    c = wide(same_dtype) if same_dtype is not None and tuple(same_dtype.shape) == tuple(result.shape) else None
    if not is_inexact(result.dtype):
        return _judge_exact(d, r, c)

    both = torch.isfinite(d) & torch.isfinite(r)
    nonfinite_bad = ~both & ~_same_value(d, r)
    if c is not None:  # the CPU at D overflowed (or made a NaN) where the wide reference did not
        nonfinite_bad &= ~(~torch.isfinite(c) & _same_value(d, c))
    zero = torch.zeros((), dtype=torch.float64)
    err = torch.where(both, (d - r).abs(), zero)  # abs of complex128 is fp64
    s = scale(r)
    floor = smallest_normal(result.dtype)
    bound = noise.budget * s + floor
    bad = (err > bound) | nonfinite_bad
    unit = noise.level * s + floor / K_NOISE
    vs_noise = float((err / unit).max())
    max_abs = float(err.max())
    mag = torch.where(both, r.abs(), zero)
    keep = mag > 1e-3 * rms(r)
    max_rel = float((err[keep] / mag[keep]).max()) if bool(keep.any()) else (0.0 if max_abs == 0 else math.inf)
    ulps = math.nan
    if result.dtype.is_floating_point and bool(both.any()):
        ulps = float(ulp_distance(result.detach().to("cpu")[both], r[both]).max())
    if bool(nonfinite_bad.any()):
        max_abs = max_rel = vs_noise = math.inf
    n_bad = int(bad.sum())
    reason = ""
    if n_bad:
        reason = (f"{n_bad}/{n} element(s) beyond {K_NOISE:g} x the CPU's {_dtype(result.dtype)} noise "
                  f"({noise.level:.3g} x max(|ref|, rms {rms(r):.3g})); worst {vs_noise:.3g} x noise, "
                  f"max abs err {max_abs:.3g}, max rel err {max_rel:.3g}")
        if bool(nonfinite_bad.any()):
            reason += f"; {int(nonfinite_bad.sum())} non-finite value(s) where the reference differs"
    return Verdict(n_bad == 0, n, n_bad, max_abs, max_rel, vs_noise, ulps, reason)


def _judge_exact(d: torch.Tensor, r: torch.Tensor, c: torch.Tensor | None) -> Verdict:
    """Integers and bools: equal to the reference, or to CPU at the same dtype (an index chosen
    among values the narrower dtype rounded to equal)."""
    bad = d != r
    if c is not None:
        bad &= d != c
    diff = (d - r).abs()
    n_bad = int(bad.sum())
    max_abs = float(diff.max())
    reason = f"{n_bad} integer/bool element(s) differ from the reference" if n_bad else ""
    return Verdict(n_bad == 0, d.numel(), n_bad, max_abs, 0.0 if max_abs == 0 else math.inf,
                   0.0 if n_bad == 0 else math.inf, math.nan, reason)


def _same_value(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
