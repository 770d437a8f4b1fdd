"""Comparison rules as values: a Tolerance per dtype and the Rules that turn metrics into a Status.

Defaults follow ``torch.testing.assert_close`` (rtol/atol per dtype), so "pass" here means what it
means in a PyTorch test. Everything is a frozen dataclass: a compare is reproducible from its rules.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

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


@dataclass(frozen=True)
class Tolerance:
    """Element i is close when ``|target_i - bench_i| <= atol + rtol * |bench_i|`` (assert_close)."""

    rtol: float
    atol: float


def default_tolerance(dtype: str) -> Tolerance:
    rtol, atol = _ASSERT_CLOSE.get(dtype, (0.0, 0.0))
    return Tolerance(rtol, atol)


@dataclass(frozen=True)
class Rules:
    """How a pair's metrics become a Status. Documented in docs/compare.md.

    With data: pass when every element is close; warning (precision loss, not a bug) when at
    least ``warn_close_pct`` % are close and cosine >= ``warn_cosine``, or when the relative RMSE
    is at most ``warn_rel_rmse`` x rtol (the error is within tolerance on average; the elements
    that fail are near zero, where atol rules); fail otherwise.
    With statistics only: pass when min/max/mean/std are within the tolerance (scaled by the
    bench's range), warning within ``stats_warn_factor`` times it, fail beyond.
    With a float64 reference: a pair that is not all-close still passes when the target's RMSE
    against the reference is at most ``fp64_multiplier`` x the bench's (torch._dynamo's rule).
    """

    overrides: dict[str, Tolerance] = field(default_factory=dict)
    warn_close_pct: float = 99.0
    warn_cosine: float = 0.999
    warn_rel_rmse: float = 1.0
    stats_warn_factor: float = 10.0
    fp64_multiplier: float = 2.0

    def tolerance(self, bench_dtype: str, target_dtype: str | None = None) -> Tolerance:
        """The looser of the two dtypes' tolerances: bf16 vs fp32 is judged at bf16 precision."""
        tols = [self._one(bench_dtype)] + ([self._one(target_dtype)] if target_dtype else [])
        return Tolerance(max(t.rtol for t in tols), max(t.atol for t in tols))

    def _one(self, dtype: str) -> Tolerance:
        return self.overrides.get(dtype) or default_tolerance(dtype)

    def with_override(self, dtype: str, rtol: float | None = None, atol: float | None = None) -> "Rules":
        base = self._one(dtype)
        tol = Tolerance(base.rtol if rtol is None else rtol, base.atol if atol is None else atol)
        return replace(self, overrides={**self.overrides, dtype: tol})


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
