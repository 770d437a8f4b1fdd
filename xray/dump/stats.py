"""Tensor statistics: min, max, mean, std over finite elements plus NaN/Inf counts.

Must be called with every dispatch mode disabled (the tracer does that); it never mutates its
input, so recording cannot change the model's numbers.
"""
from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .model import Stats

_FLOATING_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _as_real(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return torch.view_as_real(t.resolve_conj())
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.dtype in _FLOATING_UPCAST:
        return t.to(_FLOATING_UPCAST[t.dtype])
    if not t.is_floating_point():
        return t.to(torch.float64)
    if t.dtype not in (torch.float32, torch.float64):  # float8 and friends
        return t.to(torch.float32)
    return t


def tensor_stats(t: torch.Tensor) -> Stats:
    """Statistics of ``t``; cheap fast path when every element is finite (the common case)."""
    n = t.numel()
    if n == 0 or t.is_meta or t.layout != torch.strided:
        return Stats(None, None, None, None, numel=n)
    x = _as_real(t.detach())
    if x.dtype == torch.uint8:
        x = x.to(torch.float32)
    mn, mx = torch.aminmax(x)
    lo, hi = float(mn), float(mx)
    if _finite(lo) and _finite(hi):
        mean, std = _mean_std(x)
        return Stats(lo, hi, mean, std, numel=n)
    # Slow path: some element is NaN or +-Inf. Count them and take the rest's statistics.
    nan = int(torch.isnan(x).sum())
    posinf = int(torch.isposinf(x).sum())
    neginf = int(torch.isneginf(x).sum())
    finite = x[torch.isfinite(x)]
    if finite.numel() == 0:
        return Stats(None, None, None, None, nan=nan, posinf=posinf, neginf=neginf, numel=n)
    mn, mx = torch.aminmax(finite)
    mean, std = _mean_std(finite)
    return Stats(float(mn), float(mx), mean, std, nan=nan, posinf=posinf, neginf=neginf, numel=n)


def _mean_std(x: torch.Tensor) -> tuple[float, float]:
    """Population mean and std. Fast path: one sum and one dot product (BLAS, no temporary),
    var = E[x^2] - mean^2. That formula loses digits when |mean| >> std, so when the variance
    is under 1e-3 of mean^2 we recompute with the exact two-pass formula. (torch.std_mean's
    Welford kernel is 5-20x slower on CPU and dominated dump time.)"""
    n = x.numel()
    flat = x.reshape(-1)
    total, squares = torch.stack([flat.sum(), torch.dot(flat, flat)]).tolist()
    mean = total / n
    var = squares / n - mean * mean
    if var > 1e-3 * mean * mean:
        return mean, var ** 0.5
    m = flat.mean()
    return float(m), float(torch.linalg.vector_norm(flat - m)) / n ** 0.5


def _finite(x: float) -> bool:
    return x - x == 0.0  # False for NaN and +-Inf, faster than math.isfinite on hot paths


class StatsCache:
    """Statistics per tensor object and version counter, so each value is reduced once: an op's
    output is the next op's input, q/k/v share one input, parameters persist across steps.

    Caveat: the version counter is bumped by the autograd layer *after* an in-place kernel
    returns, so a dispatch-level caller must ``forget`` a tensor it saw being mutated.
    """

    def __init__(self) -> None:
        self._cache: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def get(self, t: torch.Tensor) -> Stats:
        try:
            version = t._version
        except RuntimeError:  # inference tensors have no version counter: never cached
            return tensor_stats(t)
        hit = self._cache.get(t)
        if hit is not None and hit[0] == version:
            return hit[1]
        s = tensor_stats(t)
        self._cache[t] = (version, s)
        return s

    def put(self, t: torch.Tensor, s: Stats) -> None:
        try:
            self._cache[t] = (t._version, s)
        except RuntimeError:
            pass

    def forget(self, t: torch.Tensor) -> None:
        self._cache.pop(t, None)
