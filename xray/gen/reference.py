"""High-precision CPU reference and the error metrics / pass criteria of generated op tests.

Pure functions on tensors: no pytest, no files. The criteria are documented in docs/gen.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..dump.tensorio import dtype_name

# The reference runs one step up in precision: the inputs convert exactly, so the reference is the
# exact result for the very inputs the device saw, up to rounding of the wider type.
UPCAST = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float64,
    torch.complex32: torch.complex64,
    torch.complex64: torch.complex128,
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _name):
        UPCAST[getattr(torch, _name)] = torch.float32

THRESHOLDS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)

# Budget in units of the output dtype's machine epsilon. A correctly rounded result is within
# 0.5 eps; fp16/bf16 kernels compute in fp32 and round once (<= 1 eps with the reference's own
# rounding); libm-style transcendental functions are accurate to 1-4 ulp. 4 eps therefore
# accepts every correct elementwise kernel and still flags a single wrong bit in the top
# mantissa bits. Reductions get sqrt(K) on top (see reduction_size): rounding errors of K
# accumulated terms grow like sqrt(K) for the pairwise/blocked sums every backend uses.
ULP_BUDGET = 4.0

# Ops that contract a dimension: K is the contracted length, not a numel ratio.
_MATMUL = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "addmv", "mv", "dot", "vdot",
           "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
           "scaled_dot_product_attention", "_scaled_dot_product_attention_math", "einsum", "tensordot"}
_CONV = {"convolution", "conv1d", "conv2d", "conv3d", "_convolution", "conv_transpose1d", "conv_transpose2d",
         "cudnn_convolution", "mkldnn_convolution"}


def upcast_dtype(dtype: torch.dtype) -> torch.dtype:
    return UPCAST.get(dtype, dtype)


def upcast(value: Any) -> Any:
    """CPU copies of every tensor in ``value``, floating ones one precision step up."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu")
        dt = upcast_dtype(t.dtype)
        return t.to(dt) if dt != t.dtype else t.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(upcast(v) for v in value)
    return value


def to_cpu(value: Any) -> Any:
    """CPU copies at the same dtype (for the fallback reference when an op rejects upcast inputs)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").clone()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def eps_of(dtype: torch.dtype) -> float:
    if dtype.is_floating_point:
        return torch.finfo(dtype).eps
    if dtype.is_complex:
        return torch.finfo(dtype.to_real()).eps
    return 0.0  # integers and bool: exact


def reduction_size(op_name: str, tensors_in: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """How many terms each output element accumulates (K), for the sqrt(K) error budget."""
    packet = op_name.split(".")[1] if op_name.count(".") >= 2 else op_name
    packet = packet.rstrip("_")
    if packet in _MATMUL:
        mats = [t for t in tensors_in if t.dim() >= 1]
        # the first matrix operand's last dim (or for addmm-style ops, the second tensor's)
        pick = mats[1] if packet in ("addmm", "baddbmm", "addbmm", "addmv") and len(mats) > 1 else (mats[0] if mats else None)
        return max(1, int(pick.shape[-1])) if pick is not None else 1
    if packet in _CONV and len(tensors_in) >= 2:
        w = tensors_in[1]
        return max(1, int(w[0].numel())) if w.dim() >= 1 and w.shape[0] else 1
    n_out = max((o.numel() for o in outputs), default=0)
    n_in = max((t.numel() for t in tensors_in), default=0)
    if n_out == 0:
        return 1
    return max(1, n_in // n_out)


def tolerance(dtype: torch.dtype, k: int) -> float:
    """Relative error budget for an output of ``dtype`` accumulating ``k`` terms."""
    return ULP_BUDGET * eps_of(dtype) * math.sqrt(max(1, k))


@dataclass
class Comparison:
    """Errors of one device output against the reference (see docs/gen.md for definitions)."""

    dtype: str
    shape: list[int]
    min_val: float
    max_val: float
    max_abs_err: float
    max_rel_err: float
    counts: dict[float, int] = field(default_factory=dict)
    is_pass: bool = True
    tolerance: float = 0.0
    reason: str = ""


def _finite_range(r: torch.Tensor) -> tuple[float, float]:
    f = r[torch.isfinite(r)] if r.is_floating_point() else r
    if f.numel() == 0:
        return math.nan, math.nan
    return float(f.min()), float(f.max())


def compare(device_out: Any, ref_out: Any, k: int = 1) -> Comparison:
    """Compare one output. Tensors: elementwise errors in float64; other values: equality."""
    if not isinstance(device_out, torch.Tensor):
        return _compare_scalar(device_out, ref_out)
    if not isinstance(ref_out, torch.Tensor):
        return Comparison(dtype=dtype_name(device_out.dtype), shape=list(device_out.shape),
                          min_val=math.nan, max_val=math.nan, max_abs_err=math.inf, max_rel_err=math.inf,
                          counts={t: device_out.numel() for t in THRESHOLDS}, is_pass=False,
                          reason=f"reference returned {type(ref_out).__name__}")
    dtype = device_out.dtype
    name = dtype_name(dtype)
    shape = list(device_out.shape)
    if tuple(device_out.shape) != tuple(ref_out.shape):
        return Comparison(name, shape, math.nan, math.nan, math.inf, math.inf,
                          {t: device_out.numel() for t in THRESHOLDS}, False,
                          reason=f"shape {shape} != reference {list(ref_out.shape)}")
    wide = torch.complex128 if (dtype.is_complex or ref_out.dtype.is_complex) else torch.float64
    d = device_out.detach().to("cpu").to(wide)
    r = ref_out.detach().to("cpu").to(wide)
    if wide == torch.complex128:
        lo, hi = _finite_range(torch.view_as_real(r))
    else:
        lo, hi = _finite_range(r)
    if d.numel() == 0:
        return Comparison(name, shape, lo, hi, 0.0, 0.0, {t: 0 for t in THRESHOLDS}, True)

    # Non-finite values must agree exactly (same NaN positions, same infinities).
    d_fin, r_fin = torch.isfinite(d), torch.isfinite(r)
    nonfinite_mismatch = ~(d_fin & r_fin) & ~((d == r) | (torch.isnan(d) & torch.isnan(r)))
    both = d_fin & r_fin
    diff = torch.where(both, (d - r).abs(), torch.zeros((), dtype=torch.float64))
    mag = torch.where(both, r.abs(), torch.zeros((), dtype=torch.float64))
    diff = diff.real if diff.is_complex() else diff
    mag = mag.real if mag.is_complex() else mag
    diff = torch.where(nonfinite_mismatch, torch.full((), math.inf, dtype=torch.float64), diff)
    n_fin = int(both.sum())
    rms = float((mag.square().sum() / max(1, n_fin)).sqrt()) if n_fin else 0.0

    max_abs = float(diff.max())
    # Relative error only where |ref| is not negligible next to the output's typical magnitude
    # (1e-3 rms): near-zero references from cancellation make |d-r|/|r| meaningless.
    rel_mask = mag > 1e-3 * rms
    rel = diff[rel_mask] / mag[rel_mask]
    max_rel = float(rel.max()) if rel.numel() else (0.0 if max_abs == 0 else math.inf)
    if bool(nonfinite_mismatch.any()):
        max_rel = math.inf
    # Counts use the mixed error |d-r| / max(|r|, 1): absolute below 1, relative above.
    mixed = diff / mag.clamp(min=1.0)
    counts = {t: int((mixed > t).sum()) for t in THRESHOLDS}

    if not (dtype.is_floating_point or dtype.is_complex):
        tol = 0.0
        ok = max_abs == 0.0
        reason = "" if ok else f"{int((diff > 0).sum())} integer/bool element(s) differ"
    else:
        tol = tolerance(dtype, k)
        # Elements smaller than the output's rms are judged against the rms (absolute floor):
        # their rounding error is set by the magnitude of the terms that produced them.
        bound = tol * torch.maximum(mag, torch.full((), rms, dtype=torch.float64)) + torch.finfo(dtype).tiny
        bad = diff > bound
        ok = not bool(bad.any())
        reason = "" if ok else (f"{int(bad.sum())}/{d.numel()} element(s) exceed {tol:.3g} x max(|ref|, rms {rms:.3g})"
                                 f"; max abs err {max_abs:.3g}, max rel err {max_rel:.3g}")
    return Comparison(name, shape, lo, hi, max_abs, max_rel, counts, ok, tol, reason)


def _compare_scalar(d: Any, r: Any) -> Comparison:
    name = type(d).__name__
    if isinstance(d, (int, float, bool)) and isinstance(r, (int, float, bool)) and not isinstance(d, bool):
        err = abs(float(d) - float(r))
        rel = err / abs(float(r)) if r else (0.0 if err == 0 else math.inf)
        # A Python scalar from a device is a double computed from its tensor: allow fp32-level error.
        ok = err <= ULP_BUDGET * torch.finfo(torch.float32).eps * max(abs(float(r)), 1.0) or (
            math.isnan(float(d)) and math.isnan(float(r)))
        return Comparison(name, [], float(r), float(r), err, rel, {t: int(err > t) for t in THRESHOLDS}, ok,
                          reason="" if ok else f"{d!r} != reference {r!r}")
    ok = d == r
    return Comparison(name, [], math.nan, math.nan, 0.0 if ok else math.inf, 0.0 if ok else math.inf,
                      {t: 0 if ok else 1 for t in THRESHOLDS}, bool(ok), reason="" if ok else f"{d!r} != {r!r}")


def combine(parts: list[Comparison]) -> Comparison:
    """One row for a test with several outputs: worst errors, summed counts, pass if all pass."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return Comparison("none", [], math.nan, math.nan, 0.0, 0.0, {t: 0 for t in THRESHOLDS}, True)
    first = parts[0]
    lo = min((p.min_val for p in parts if not math.isnan(p.min_val)), default=math.nan)
    hi = max((p.max_val for p in parts if not math.isnan(p.max_val)), default=math.nan)
    return Comparison(
        dtype=",".join(dict.fromkeys(p.dtype for p in parts)),
        shape=first.shape,
        min_val=lo, max_val=hi,
        max_abs_err=max(p.max_abs_err for p in parts),
        max_rel_err=max(p.max_rel_err for p in parts),
        counts={t: sum(p.counts.get(t, 0) for p in parts) for t in THRESHOLDS},
        is_pass=all(p.is_pass for p in parts),
        tolerance=max(p.tolerance for p in parts),
        reason="; ".join(f"output {i}: {p.reason}" for i, p in enumerate(parts) if p.reason),
    )
