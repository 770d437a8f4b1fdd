"""Tolerances per dtype, noise floors, ulp distances and the pass/warning/fail rule.

One place for every "how close is close enough" in xray. Defaults follow
``torch.testing.assert_close`` (rtol per dtype), but the absolute floor is scaled to the tensor's
own magnitude: a fixed 1e-5 would swallow a 1e-3 relative error in a variance of 5e-4.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported by the functions that use it: xray-compare --help stays light
    import torch

# torch.testing.assert_close defaults (torch/testing/_comparison.py, _DTYPE_PRECISIONS); integer
# and bool tensors must be equal.
_ASSERT_CLOSE = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
    # float8 is not covered by assert_close; one unit in the last place of e4m3 (3 mantissa bits)
    # and e5m2 (2 bits) relative to the value.
    "float8_e4m3fn": (1.25e-1, 1e-3),
    "float8_e4m3fnuz": (1.25e-1, 1e-3),
    "float8_e5m2": (2.5e-1, 1e-3),
    "float8_e5m2fnuz": (2.5e-1, 1e-3),
}
# each float dtype's smallest normal (torch.finfo(dtype).tiny), by name: rules.py imports no torch
SMALLEST_NORMAL = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126, "float64": 2.0 ** -1022,
                   "complex32": 2.0 ** -14, "complex64": 2.0 ** -126, "complex128": 2.0 ** -1022,
                   "float8_e4m3fn": 2.0 ** -6, "float8_e4m3fnuz": 2.0 ** -7, "float8_e5m2": 2.0 ** -14,
                   "float8_e5m2fnuz": 2.0 ** -15}

# For tensors larger than 1, the absolute floor grows as this many rtol of the tensor's RMS: an
# element near zero whose operands had the tensor's typical size carries a couple of roundings of
# those operands (x - mean), not a fixed 1e-5.
ATOL_PER_RTOL = 2.0

# Reduced-precision arithmetic a target may legitimately use on the same storage dtype, as the
# mantissa bits its inputs are rounded to (TF32 and fp16: 10, bf16: 7).
PRECISION_STEPS: dict[str, int] = {"tf32/fp16": 10, "bf16": 7}


@dataclass(frozen=True)
class Tolerance:
    """Element i is close when ``|t_i - b_i| <= floor(scale) + rtol * |b_i|``.

    ``atol`` is the absolute floor for a tensor of unit magnitude; ``floor(scale)`` scales it to
    the tensor's RMS, so a 1e-3 relative error in a variance of 5e-4 is not swallowed by 1e-5,
    and an element near zero in a tensor of RMS 1e3 is allowed its operands' rounding.
    ``tiny``: the coarser dtype's smallest normal. Below it rounding moves values by absolute
    steps (gradual underflow), so no floor is below ``rtol * tiny``: a float16 layer scale of 1e-6
    times activations of 0.05 keeps a bit or two, in any right kernel.
    Integers: all 0 (exact).
    """

    rtol: float
    atol: float
    tiny: float = 0.0

    def floor(self, scale: float) -> float:
        """Absolute floor for a tensor whose RMS is ``scale`` (``floor_of`` for one tolerance)."""
        return float(floor_of(self.rtol, self.atol, scale, self.tiny))

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.atol == 0


def floor_of(rtol, atol, scale, tiny=0.0):
    """The absolute floor of a tolerance (rtol, atol, tiny) at RMS ``scale``: numbers or numpy arrays.

    ``max(atol * min(scale, 1), ATOL_PER_RTOL * rtol * scale, rtol * tiny)``, 0 for an exact
    tolerance, written once: Python's ``max``/``min`` choice (NaN never wins against the first)
    for one pair, the same choice element by element for a column (``_where``), so both agree to
    the bit."""
    small = _where(1.0 < scale, 1.0, scale)
    a, r, u = atol * small, ATOL_PER_RTOL * rtol * scale, rtol * tiny
    floor = _where(r > a, r, a)
    return _where((rtol == 0) & (atol == 0), 0.0, _where(u > floor, u, floor))


def _where(condition, yes, no):
    """``yes if condition else no``, element by element when ``condition`` is an array."""
    if type(condition) is bool:  # one pair: compare's per-pair path calls this per tensor
        return yes if condition else no
    import numpy as np

    return np.where(condition, yes, no)


def default_tolerance(dtype: str) -> Tolerance:
    rtol, atol = _ASSERT_CLOSE.get(dtype, (0.0, 0.0))
    return Tolerance(rtol, atol, SMALLEST_NORMAL.get(dtype, 0.0) if rtol or atol else 0.0)


def eps(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype (0 for integers and bool)."""
    import torch

    if dtype.is_floating_point:
        return float(torch.finfo(dtype).eps)
    if dtype.is_complex:
        return float(torch.finfo(dtype.to_real()).eps)
    return 0.0


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between two float tensors of one dtype, elementwise (int64).

    Floats are mapped to integers that increase with the value (sign-magnitude to two's
    complement), so the distance counts the representable values between a and b.
    """
    import torch

    if a.dtype != b.dtype or not a.dtype.is_floating_point:
        raise ValueError(f"ulp_distance needs two tensors of one float dtype, got {a.dtype} and {b.dtype}")
    bits = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}.get(a.dtype)
    if bits is None:
        raise ValueError(f"ulp_distance: unsupported dtype {a.dtype}")

    def ordered(x: torch.Tensor) -> torch.Tensor:
        i = x.contiguous().view(bits).to(torch.int64)
        top = torch.iinfo(bits).min
        return torch.where(i < 0, top - i, i)

    return (ordered(a) - ordered(b)).abs()


def round_mantissa(t: torch.Tensor, bits: int) -> torch.Tensor:
    """``t`` (float32/float64) rounded to ``bits`` explicit mantissa bits, nearest-even, as float64.

    Simulates what TF32 (10 bits), fp16 (10) or bf16 (7) math does to a matmul's inputs, keeping
    float32's exponent range.
    """
    import torch

    x = t.to(torch.float32).contiguous()
    drop = 23 - bits
    u = x.view(torch.int32)  # the sign bit takes no carry short of the NaN patterns, left below as they were
    rounded = (u + ((1 << (drop - 1)) - 1) + ((u >> drop) & 1)) & -(1 << drop)  # nearest, ties to even
    return torch.where(torch.isfinite(x), rounded.view(torch.float32), x).to(torch.float64)


@dataclass(frozen=True)
class Rules:
    """How a pair's metrics become a verdict. Documented in docs/compare.md.

    With data: pass when every element is within its floor. Warning (precision loss, not a bug)
    only when the error is spread like rounding: relative RMSE <= ``warn_rel_rmse`` x rtol, no
    element beyond ``warn_max_ratio`` x its floor and cosine >= ``warn_cosine``. A few wrong
    elements, a spike or a zeroed column therefore fail, however many elements stay close.
    Exact dtypes (integers, bool) pass or fail, never warn.
    With statistics only: pass when min/max/mean/std are within the floor at the bench's range,
    warning within ``stats_warn_factor`` times it, fail beyond.
    With a float64 reference: a pair that is not all-close still passes when the target's RMSE
    against the reference is at most ``fp64_multiplier`` x the bench's (torch._dynamo's rule).
    Local error (an op recomputed on the target's own inputs): born only when it exceeds
    ``local_factor`` x the CPU's error at the target's dtype; precision loss when within
    ``precision_factor`` x the error of inputs rounded to a known reduced precision.
    ``tf32``: whether the target's fp32 matmuls and convolutions may round to TF32, declared by
    the user; None reads the dump header's math settings (numerics.math_settings.run_math).
    """

    overrides: dict[str, Tolerance] = field(default_factory=dict)
    warn_cosine: float = 0.999
    warn_rel_rmse: float = 10.0
    warn_max_ratio: float = 50.0
    stats_warn_factor: float = 10.0
    fp64_multiplier: float = 2.0
    local_factor: float = 8.0
    precision_factor: float = 3.0
    tf32: bool | None = None

    def tolerance(self, bench_dtype: str, target_dtype: str | None = None) -> Tolerance:
        """The looser of the two dtypes' tolerances: bf16 vs fp32 is judged at bf16 precision."""
        tols = [self._one(bench_dtype)] + ([self._one(target_dtype)] if target_dtype else [])
        return Tolerance(max(t.rtol for t in tols), max(t.atol for t in tols), max(t.tiny for t in tols))

    def _one(self, dtype: str) -> Tolerance:
        return self.overrides.get(dtype) or default_tolerance(dtype)

    def with_override(self, dtype: str, rtol: float | None = None, atol: float | None = None) -> "Rules":
        base = self._one(dtype)
        tol = Tolerance(base.rtol if rtol is None else rtol, base.atol if atol is None else atol, base.tiny)
        return replace(self, overrides={**self.overrides, dtype: tol})

    # -- verdicts --------------------------------------------------------------------------
    def judge_data(self, *, not_close: int, numel: int, max_ratio: float, rel_rmse: float | None,
                   cosine: float | None, tol: Tolerance) -> str:
        """"pass", "warning" or "fail" for a pair compared element by element (finite part)."""
        if not_close == 0:
            return "pass"
        if tol.exact:
            return "fail"
        spread = rel_rmse is not None and bool(self.spread_like_rounding(rel_rmse, max_ratio,
                                                                         1.0 if cosine is None else cosine, tol.rtol))
        return "warning" if spread else "fail"

    def spread_like_rounding(self, rel_rmse, max_ratio, cosine, rtol):
        """Whether an error is spread like rounding (the warning band of ``judge_data``): numbers,
        or numpy arrays element by element (the sample judge, numerics/sample_judge.py)."""
        return (rel_rmse <= self.warn_rel_rmse * rtol) & (max_ratio <= self.warn_max_ratio) & (cosine >= self.warn_cosine)

    def least_floor(self, floor: float, dtype: torch.dtype) -> float:
        """The least floor of a local error whose CPU error at ``dtype`` is ``floor``:
        ``local_factor`` x it plus two units of roundoff, before an op's accumulation bound and
        precision steps raise it (compare/noise_floor.py)."""
        return self.local_factor * floor + 2 * eps(dtype)

    def is_local_error(self, local: float, floor: float, dtype: torch.dtype) -> bool:
        """Whether an op's error against float64 is beyond what CPU makes at its dtype."""
        return local > self.least_floor(floor, dtype)


def parse_tolerance_arg(text: str) -> tuple[str, float | None, float | None]:
    """``bfloat16:rtol=0.02,atol=1e-4`` -> ("bfloat16", 0.02, 0.0001); raises ValueError with a hint."""
    dtype, sep, rest = text.partition(":")
    if not sep or not dtype:
        raise ValueError(f"bad tolerance {text!r}: expected DTYPE:rtol=R,atol=A (e.g. bfloat16:rtol=0.02)")
    vals: dict[str, float] = {}
    for part in rest.split(","):
        k, eq, v = part.partition("=")
        if not eq or k.strip() not in ("rtol", "atol"):
            raise ValueError(f"bad tolerance {text!r}: expected DTYPE:rtol=R,atol=A")
        try:
            vals[k.strip()] = float(v)
        except ValueError:
            raise ValueError(f"bad tolerance {text!r}: {v!r} is not a number") from None
    return dtype.strip().removeprefix("torch."), vals.get("rtol"), vals.get("atol")
