"""The CPU runs a generated op test judges by, and one output's verdict for the result CSV.

Pure functions on tensors: no pytest, no files. The rule itself is ``xray.numerics.noise``
(docs/gen.md, "Pass criteria"): the device's error against the fp64 CPU reference must be
within a few times the error CPU at the device's own dtype makes on the same inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..dump.tensorio import dtype_name
from ..numerics import noise

THRESHOLDS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """The reference's dtype: fp64 (complex128) for every inexact dtype; exact dtypes stay."""
    if dtype.is_complex:
        return torch.complex128
    return torch.float64 if dtype.is_floating_point else dtype


def widen(value: Any) -> Any:
    """CPU copies of every tensor in ``value``, inexact ones in fp64: the inputs convert exactly,
    so the reference is the exact result for the very inputs the device saw, up to fp64 rounding."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu")
        dt = wide_dtype(t.dtype)
        return t.to(dt) if dt != t.dtype else t.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(widen(v) for v in value)
    return value


def to_cpu(value: Any) -> Any:
    """CPU copies at the same dtype: the noise measurement (and the reference of an op that
    refuses fp64 inputs)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").clone()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


@dataclass
class OutputVerdict:
    """One device output judged against the reference and the CPU's noise (a result CSV row)."""

    dtype: str
    shape: list[int]
    min_val: float
    max_val: float
    max_abs_err: float
    max_rel_err: float
    counts: dict[float, int] = field(default_factory=dict)
    is_pass: bool = True
    cpu_max_abs_err: float = math.nan  #: the noise measurement: CPU at the same dtype vs fp64
    noise_level: float = math.nan  #: nu, relative to max(|ref|, rms)
    err_vs_noise: float = math.nan  #: the device's worst error in units of that noise
    max_ulp_err: float = math.nan
    reason: str = ""


def _finite_range(r: torch.Tensor) -> tuple[float, float]:
    if r.is_complex():
        r = torch.view_as_real(r)
    f = r[torch.isfinite(r)] if r.is_floating_point() else r
    if f.numel() == 0:
        return math.nan, math.nan
    return float(f.min()), float(f.max())


def _failed(device_out: Any, reason: str) -> OutputVerdict:
    n = device_out.numel() if isinstance(device_out, torch.Tensor) else 1
    name = dtype_name(device_out.dtype) if isinstance(device_out, torch.Tensor) else type(device_out).__name__
    shape = list(device_out.shape) if isinstance(device_out, torch.Tensor) else []
    return OutputVerdict(name, shape, math.nan, math.nan, math.inf, math.inf, {t: n for t in THRESHOLDS}, False,
                         reason=reason)


def judge_output(device_out: Any, ref_out: Any, same_dtype_out: Any = None, depth: int = 1) -> OutputVerdict:
    """Judge one output: ``ref_out`` is the fp64 CPU reference, ``same_dtype_out`` the CPU run at
    the device's dtype (the noise measurement; None when CPU could not run it)."""
    if not isinstance(device_out, torch.Tensor):
        return _judge_scalar(device_out, ref_out)
    if not isinstance(ref_out, torch.Tensor):
        return _failed(device_out, f"reference returned {type(ref_out).__name__}")
    if tuple(device_out.shape) != tuple(ref_out.shape):
        return _failed(device_out, f"shape {list(device_out.shape)} != reference {list(ref_out.shape)}")
    same = same_dtype_out if isinstance(same_dtype_out, torch.Tensor) else None
    level = noise.measure(ref_out, same, device_out.dtype, depth)
    v = noise.judge(device_out, ref_out, level, same)
    r = noise.wide(ref_out)
    lo, hi = _finite_range(r)
    counts = {t: 0 for t in THRESHOLDS}
    if device_out.numel():
        d = noise.wide(device_out)
        fin = torch.isfinite(d) & torch.isfinite(r)
        # mixed error |d - r| / max(|r|, 1): absolute below 1, relative above; mismatched
        # non-finite values count as beyond every threshold
        mixed = torch.where(fin, (d - r).abs() / r.abs().clamp(min=1.0), torch.full((), math.inf, dtype=torch.float64))
        mixed = torch.where(~fin & ((d == r) | (torch.isnan(d) & torch.isnan(r))), torch.zeros((), dtype=torch.float64),
                            mixed)
        counts = {t: int((mixed > t).sum()) for t in THRESHOLDS}
    if not noise.is_inexact(device_out.dtype):
        counts = {t: v.bad for t in THRESHOLDS}
    return OutputVerdict(dtype_name(device_out.dtype), list(device_out.shape), lo, hi, v.max_abs_err, v.max_rel_err,
                         counts, v.ok, level.cpu_max_abs_err, level.level, v.err_vs_noise, v.max_ulp_err, v.reason)


def _judge_scalar(d: Any, r: Any) -> OutputVerdict:
    """A Python number returned by an op: a float is a double computed from a tensor, judged at
    fp32's unmeasured level; anything else must be equal."""
    name = type(d).__name__
    if isinstance(d, (int, float)) and isinstance(r, (int, float)) and not isinstance(d, bool):
        err = abs(float(d) - float(r))
        rel = err / abs(float(r)) if r else (0.0 if err == 0 else math.inf)
        level = noise.assumed(torch.float32)
        ok = err <= level.budget * max(abs(float(r)), 1.0) or (math.isnan(float(d)) and math.isnan(float(r)))
        return OutputVerdict(name, [], float(r), float(r), err, rel, {t: int(err > t) for t in THRESHOLDS}, ok,
                             noise_level=level.level, reason="" if ok else f"{d!r} != reference {r!r}")
    ok = d == r
    return OutputVerdict(name, [], math.nan, math.nan, 0.0 if ok else math.inf, 0.0 if ok else math.inf,
                         {t: 0 if ok else 1 for t in THRESHOLDS}, bool(ok), reason="" if ok else f"{d!r} != {r!r}")


def combine_verdicts(parts: list[OutputVerdict]) -> OutputVerdict:
    """One row for a test with several outputs: worst errors, summed counts, pass if all pass."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return OutputVerdict("none", [], math.nan, math.nan, 0.0, 0.0, {t: 0 for t in THRESHOLDS}, True)

    def worst(name: str) -> float:
        vals = [getattr(p, name) for p in parts if not math.isnan(getattr(p, name))]
        return max(vals, default=math.nan)

    lo = min((p.min_val for p in parts if not math.isnan(p.min_val)), default=math.nan)
    hi = max((p.max_val for p in parts if not math.isnan(p.max_val)), default=math.nan)
    return OutputVerdict(
        dtype=",".join(dict.fromkeys(p.dtype for p in parts)),
        shape=parts[0].shape,
        min_val=lo, max_val=hi,
        max_abs_err=worst("max_abs_err"),
        max_rel_err=worst("max_rel_err"),
        counts={t: sum(p.counts.get(t, 0) for p in parts) for t in THRESHOLDS},
        is_pass=all(p.is_pass for p in parts),
        cpu_max_abs_err=worst("cpu_max_abs_err"),
        noise_level=worst("noise_level"),
        err_vs_noise=worst("err_vs_noise"),
        max_ulp_err=worst("max_ulp_err"),
        reason="; ".join(f"output {i}: {p.reason}" for i, p in enumerate(parts) if p.reason),
    )
