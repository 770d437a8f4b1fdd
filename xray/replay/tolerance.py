"""Per-dtype tolerances for backend-vs-baseline comparison, and the comparison itself.

A backend passes when ``|got - ref| <= atol * scale + rtol * |ref|`` elementwise, where
``scale = max(1, max|ref|)``. Scaling atol with the output's magnitude keeps the test meaningful
for both tiny and large activations (a sum of K products drifts by ~K * eps * |values| when a
backend reorders the reduction, as XNNPACK's and MLAS's blocked GEMMs do).

Why these numbers: fp32 machine epsilon is 1.2e-7; reordered reductions over the K <= 1e3
elements of our models' matmuls, and the polynomial exp/tanh/sigmoid approximations of XNNPACK
and ONNX Runtime (a few ulp), stay below ~1e-5 relative. fp16 (eps 9.8e-4) and bf16 (eps 7.8e-3)
get about ten epsilons; integers and bools must match exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {  # dtype -> (rtol, atol)
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (8e-2, 8e-2),
    torch.complex64: (1e-5, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for ``dtype``; exact for integer and bool dtypes."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if dtype.is_floating_point:  # float8 and friends: 1 ulp is already 6-12 %
        return (0.25, 0.25)
    return (0.0, 0.0)


@dataclass
class Comparison:
    ok: bool
    max_abs: float | None  # largest |got - ref| over all outputs (None when nothing was compared)
    max_rel: float | None  # largest |got - ref| / max(1, max|ref|): error relative to the output's magnitude
    message: str | None = None


def compare(ref: list[torch.Tensor], got: list[torch.Tensor], precision: torch.dtype | None = None) -> Comparison:
    """Compare every output; ``precision`` overrides the dtype whose tolerance applies (fp16 presets)."""
    if len(ref) != len(got):
        return Comparison(False, None, None, _count_note(ref, got))
    worst_abs, worst_rel, ok, notes = 0.0, 0.0, True, []
    for i, (r, g) in enumerate(zip(ref, got)):
        if tuple(r.shape) != tuple(g.shape):
            return Comparison(False, None, None, _shape_note(i, r, g))
        note = _dtype_note(i, r, g)
        if note:
            notes.append(note)
            ok = False
        if r.numel() == 0:
            continue
        rtol, atol = tolerance(precision if precision is not None and r.dtype.is_floating_point else r.dtype)
        rd, gd = _as_float(r), _as_float(g)
        both_nan = torch.isnan(rd) & torch.isnan(gd)
        same_inf = torch.isinf(rd) & (rd == gd)
        diff = (gd - rd).abs()
        diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
        diff = torch.nan_to_num(diff, nan=float("inf"))
        finite_ref = rd[torch.isfinite(rd)]
        scale = max(1.0, float(finite_ref.abs().max())) if finite_ref.numel() else 1.0
        bound = atol * scale + rtol * rd.abs().nan_to_num(posinf=0.0, neginf=0.0)
        bad = diff > bound
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float(diff.max()) / scale)
        if bool(bad.any()):
            ok = False
            notes.append(f"output {i}: {int(bad.sum())}/{bad.numel()} elements beyond "
                         f"rtol={rtol:g} atol={atol:g}x{scale:.3g}")
    return Comparison(ok, worst_abs, worst_rel, "; ".join(notes) or None)


def compare_layout(ref: list[torch.Tensor], got: list[torch.Tensor]) -> Comparison:
    """Output count, shapes and dtypes only, for outputs whose values are random or uninitialized.
    Float dtypes may differ, as in ``compare`` (fp16 presets return float16)."""
    if len(ref) != len(got):
        return Comparison(False, None, None, _count_note(ref, got))
    notes = []
    for i, (r, g) in enumerate(zip(ref, got)):
        note = _shape_note(i, r, g) if tuple(r.shape) != tuple(g.shape) else _dtype_note(i, r, g)
        if note:
            notes.append(note)
    return Comparison(not notes, None, None, "; ".join(notes) or None)


def _count_note(ref: list[torch.Tensor], got: list[torch.Tensor]) -> str:
    return f"{len(got)} outputs, baseline has {len(ref)}"


def _shape_note(i: int, r: torch.Tensor, g: torch.Tensor) -> str:
    return f"output {i}: shape {tuple(g.shape)}, baseline {tuple(r.shape)}"


def _dtype_note(i: int, r: torch.Tensor, g: torch.Tensor) -> str | None:
    """A dtype difference that matters: float outputs may differ (fp16 presets return float16)."""
    if r.dtype != g.dtype and not (r.dtype.is_floating_point and g.dtype.is_floating_point):
        return f"output {i}: dtype {g.dtype}, baseline {r.dtype}"
    return None


def _as_float(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return torch.view_as_real(t).to(torch.float64)
    return t.to(torch.float64)
