"""Metrics of one bench/target tensor pair, computed chunk by chunk so memory stays bounded.

Three small pure steps: ``chunk_partial`` turns two aligned 1-D chunks into partial sums,
``merge`` adds partials, ``finish`` turns the total into the reported metrics. Chunks are compared
in float32 (float64 for float64 and integer data, which float32 cannot hold exactly); sums are
accumulated across chunks in Python floats (double precision).

Finite-safe for any finite input: when float32 squares overflow (T5's ``finfo.min`` masks, a run
diverging to 1e20), the chunk is redone in float64 scaled by its largest magnitude, and the sums
carry that scale, so nothing overflows and nothing recurses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from .rules import Tolerance

# Denominator floor of MaxRelErr: a relative error against an exact zero is meaningless, and
# clamping at a tiny value keeps it finite while still flagging it as huge.
REL_EPS = 1e-12

_SUMS = ("sse", "aa", "bb", "ab")


@dataclass
class Partial:
    """Additive sums over the elements seen so far; the four sums are in units of ``scale**2``."""

    numel: int = 0
    scale: float = 1.0
    sse: float = 0.0  # sum of squared errors over positions finite on both sides
    aa: float = 0.0
    bb: float = 0.0
    ab: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ratio: float = 0.0  # worst |t - b| / (floor + rtol * |b|) where some element is not close, else 0
    not_close: int = 0  # elements outside floor + rtol*|bench|, incl. NaN/Inf pattern mismatches
    nan_bench: int = 0
    nan_target: int = 0
    inf_bench: int = 0
    inf_target: int = 0
    nonfinite_mismatch: int = 0  # positions where only one side is NaN/Inf, or Infs differ in sign
    shared_nonfinite: int = 0  # positions with the same NaN/Inf on both sides


def merge(p: Partial, q: Partial) -> Partial:
    out = Partial(scale=max(p.scale, q.scale))
    rp, rq = (p.scale / out.scale) ** 2, (q.scale / out.scale) ** 2
    for f in fields(Partial):
        a, b = getattr(p, f.name), getattr(q, f.name)
        if f.name == "scale":
            continue
        if f.name in _SUMS:
            setattr(out, f.name, a * rp + b * rq)
        else:
            setattr(out, f.name, max(a, b) if f.name.startswith("max_") else a + b)
    return out


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 when either side needs it (float64, integers beyond 2**24), else float32."""
    for dt in dtypes:
        if dt == torch.float64 or dt == torch.complex128 or not (dt.is_floating_point or dt.is_complex):
            if dt != torch.bool:
                return torch.float64
    return torch.float32


def as_real(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Flatten a chunk into real numbers of ``dtype`` (complex: real and imaginary interleaved)."""
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    return t.reshape(-1).to(dtype)


class Workspace:
    """Reusable scratch buffers: a compare allocates them once, not three per chunk."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, list[torch.Tensor]] = {}

    def take(self, n: int, dtype: torch.dtype) -> list[torch.Tensor]:
        key = (dtype,)
        bufs = self._bufs.get(key)
        if bufs is None or bufs[0].numel() < n:
            bufs = self._bufs[key] = [torch.empty(n, dtype=dtype) for _ in range(3)]
        return [b[:n] for b in bufs]


def infinity_stand_in(bench_dtype: torch.dtype, target_dtype: torch.dtype) -> float | None:
    """The magnitude from which a finite value stands for infinity: the top binade of the wider
    of two float dtypes, where ``finfo.min`` as a mask's fill lives (-3.40e38 in float32, past
    bfloat16's -3.39e38, so a bf16 run holds it as -Inf, the correct rounding of that value; a
    score plus it stays -3.40e38 in float32 and is -Inf on a side that read -Inf). Only where that
    binade is out of computed values' reach (a range of at least float32's): float16's top binade
    (32768 to 65504) is reached by activations, and its overflow stays a NaN/Inf mismatch, as does
    any computed overflow into float16 (65504 is far below a float32 stand-in). None otherwise."""
    if not (bench_dtype.is_floating_point and target_dtype.is_floating_point):
        return None
    widest = max(torch.finfo(bench_dtype).max, torch.finfo(target_dtype).max)
    return widest / 2 if widest >= torch.finfo(torch.float32).max else None


def chunk_partial(bench: torch.Tensor, target: torch.Tensor, tol: Tolerance,
                  work: Workspace | None = None, floor: float | None = None,
                  stand_in: float | None = None) -> Partial:
    """Partial sums of two 1-D real chunks of equal length (the bench is the reference).

    ``floor`` is the absolute floor of an element (``tol.floor(scale)``); None uses ``tol.atol``.
    ``stand_in`` (``infinity_stand_in``): a finite value at least this large where the other side
    holds an Inf of its sign agrees with it.
    """
    atol = tol.atol if floor is None else floor
    if bench.numel() == 0:
        return Partial()
    fast = _sums(bench, target, tol.rtol, atol, work)
    if fast is not None:
        return fast
    fb, ft = torch.isfinite(bench), torch.isfinite(target)
    if bool(fb.all()) and bool(ft.all()):  # finite but overflowed in float32: scaled float64
        return _scaled_sums(bench, target, tol.rtol, atol)
    return _nonfinite_partial(bench, target, fb, ft, tol.rtol, atol, stand_in)


def _sums(bench: torch.Tensor, target: torch.Tensor, rtol: float, atol: float,
          work: Workspace | None) -> Partial | None:
    """The fast path in the chunk's own dtype; None when a sum is not finite."""
    n = bench.numel()
    d, w1, w2 = (work or Workspace()).take(n, bench.dtype)
    torch.sub(target, bench, out=d)
    sse = float(torch.dot(d, d))
    if not math.isfinite(sse):
        return None
    aa, bb, ab = float(torch.dot(bench, bench)), float(torch.dot(target, target)), float(torch.dot(bench, target))
    if not (math.isfinite(aa) and math.isfinite(bb) and math.isfinite(ab)):
        return None
    d.abs_()
    max_abs = float(d.max())
    torch.abs(bench, out=w1)
    torch.sub(d, w1, alpha=rtol, out=w2)  # > atol exactly where the element is not close
    not_close = max_ratio = 0
    if float(w2.max()) > atol:  # counting only when needed
        not_close = int((w2 > atol).sum())
        torch.add(w1.mul(rtol), atol, out=w2)
        max_ratio = float(torch.div(d, w2).max()) if atol > 0 or rtol > 0 else math.inf
        if math.isnan(max_ratio):
            max_ratio = math.inf
    torch.div(d, w1.clamp_min_(REL_EPS), out=w1)
    return Partial(numel=n, sse=sse, aa=aa, bb=bb, ab=ab, max_abs=max_abs, max_rel=float(w1.max()),
                   max_ratio=max_ratio, not_close=not_close)


def _scaled_sums(bench: torch.Tensor, target: torch.Tensor, rtol: float, atol: float) -> Partial:
    """All-finite chunks whose sums overflow: float64 divided by the largest magnitude."""
    b, t = bench.to(torch.float64), target.to(torch.float64)
    s = max(float(b.abs().max()), float(t.abs().max()))
    if s == 0.0:  # zeros on both sides (the finite part of a chunk that also holds NaN/Inf)
        return Partial(numel=b.numel())
    b, t = b / s, t / s
    d = (t - b).abs()
    absb = b.abs()
    a_s = atol / s
    excess = d - rtol * absb
    not_close = int((excess > a_s).sum())
    denom = rtol * absb + a_s
    ratio = torch.where(denom > 0, d / denom.clamp_min(1e-300), torch.where(d > 0, math.inf, 0.0))
    return Partial(numel=b.numel(), scale=s, sse=float(torch.dot(d, d)), aa=float(torch.dot(b, b)),
                   bb=float(torch.dot(t, t)), ab=float(torch.dot(b, t)), max_abs=float(d.max()) * s,
                   max_rel=float((d / absb.clamp_min(REL_EPS / s)).max()), max_ratio=float(ratio.max()),
                   not_close=not_close)


def _nonfinite_partial(bench: torch.Tensor, target: torch.Tensor, fb: torch.Tensor, ft: torch.Tensor,
                       rtol: float, atol: float, stand_in: float | None = None) -> Partial:
    both = fb & ft
    nan_b, nan_t = torch.isnan(bench), torch.isnan(target)
    # Equal non-finite values (NaN with NaN, +Inf with +Inf) agree: attention masks hold -inf.
    same_nonfinite = (~fb & ~ft) & ((nan_b & nan_t) | (bench == target))
    if stand_in is not None:  # -3.40e38 on one side, -Inf on the other: one mask value
        same_nonfinite |= ((fb & torch.isinf(target) & (bench.abs() >= stand_in))
                           | (ft & torch.isinf(bench) & (target.abs() >= stand_in))) & (bench.sign() == target.sign())
    mismatch = int((~both & ~same_nonfinite).sum())
    p = _scaled_sums(bench[both], target[both], rtol, atol) if bool(both.any()) else Partial()
    p.numel = bench.numel()
    p.not_close += mismatch
    p.nonfinite_mismatch = mismatch
    p.shared_nonfinite = int(same_nonfinite.sum())
    p.nan_bench, p.nan_target = int(nan_b.sum()), int(nan_t.sum())
    p.inf_bench, p.inf_target = int((~fb).sum()) - p.nan_bench, int((~ft).sum()) - p.nan_target
    return p


@dataclass
class PairMetrics:
    """What a row reports for a pair compared on its data."""

    cosine: float | None
    rmse: float
    rel_rmse: float | None  # rmse / rms(bench): the error relative to the tensor's own size
    max_abs_err: float
    max_rel_err: float
    isclose_pct: float
    gt_num: int
    numel: int
    nan_bench: int
    nan_target: int
    inf_bench: int
    inf_target: int
    nonfinite_mismatch: int
    bench_norm: float = 0.0  # L2 norms over the compared positions (a permutation keeps them)
    target_norm: float = 0.0
    max_ratio: float = 0.0  # worst element error in multiples of its floor


def finish(p: Partial) -> PairMetrics:
    compared = p.numel - p.nonfinite_mismatch - p.shared_nonfinite
    denom = math.sqrt(p.aa) * math.sqrt(p.bb)  # the scale cancels in cosine and rel_rmse
    if denom > 0:
        cosine = max(-1.0, min(1.0, p.ab / denom))
    else:  # a zero vector: cosine is 1 only when both are zero
        cosine = 1.0 if p.aa == p.bb == 0 else 0.0
    return PairMetrics(
        cosine=cosine if compared > 0 else None,
        rmse=math.sqrt(p.sse / compared) * p.scale if compared > 0 else 0.0,
        rel_rmse=(math.sqrt(p.sse / p.aa) if p.aa > 0 else (0.0 if p.sse == 0 else math.inf)) if compared > 0 else None,
        max_abs_err=p.max_abs, max_rel_err=p.max_rel,
        isclose_pct=100.0 * (p.numel - p.not_close) / p.numel if p.numel else 100.0,
        gt_num=p.not_close, numel=p.numel,
        nan_bench=p.nan_bench, nan_target=p.nan_target, inf_bench=p.inf_bench, inf_target=p.inf_target,
        nonfinite_mismatch=p.nonfinite_mismatch, bench_norm=math.sqrt(p.aa) * p.scale,
        target_norm=math.sqrt(p.bb) * p.scale, max_ratio=p.max_ratio)


def rmse_partial(ref: torch.Tensor, x: torch.Tensor) -> tuple[float, int]:
    """Sum of squared errors and count over positions finite on both sides (fp64-reference rule)."""
    both = torch.isfinite(ref) & torch.isfinite(x)
    d = (x - ref)[both]
    return float(torch.dot(d, d)), int(d.numel())


def stats_rms(stats) -> float | None:
    """RMS of a tensor from its recorded ``Stats`` (mean and population-ish std), or None."""
    if stats is None or stats.mean is None:
        return None
    return math.hypot(stats.mean, stats.std or 0.0)  # scaled inside: finite for 1e200, where mean ** 2 overflows


def normwise_error(x: torch.Tensor, ref: torch.Tensor, least_scale: float = 0.0) -> float:
    """max |x - ref| / max |ref| over positions finite on both sides, in float64; inf when the
    NaN/Inf patterns differ. The error measure of local (recomputed) and accumulated error.
    ``least_scale``: the scale is never below it (a dtype's smallest normal: below it rounding is
    absolute, gradual underflow's steps)."""
    x, ref = x.reshape(-1).to(torch.float64), ref.reshape(-1).to(torch.float64)
    fx, fr = torch.isfinite(x), torch.isfinite(ref)
    if bool(fr.all()):  # the common case: no mask to compare, no copy of the finite positions
        if not bool(fx.all()):
            return math.inf
    else:
        if not bool(torch.equal(fx, fr)):
            return math.inf
        if not bool(fr.any()):
            return 0.0
        x, ref = x[fr], ref[fr]
    s = max(float(ref.abs().max()), least_scale)
    if s == 0.0:
        return 0.0 if float(x.abs().max()) == 0.0 else math.inf
    return float(((x / s) - (ref / s)).abs().max())
