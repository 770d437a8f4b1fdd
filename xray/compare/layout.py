"""Layout-mismatch detector: does a permutation make a failing pair agree?

Two common bugs look like numerical failures: data written NHWC but read NCHW (or the shapes
themselves permuted), and a transposed last pair of dimensions. We try the permutations of the
bench tensor that produce the target's shape, both as a real permute and as "permuted memory
reinterpreted in the original shape", and report the first one under which every element is close.
"""
from __future__ import annotations

import itertools

import torch

from ..numerics.rules import Tolerance

MAX_NUMEL = 1 << 26  # whole tensors are loaded for this check; skip larger ones


def _candidates(ndim: int) -> list[tuple[int, ...]]:
    ident = tuple(range(ndim))
    if ndim < 2:
        return []
    if ndim <= 4:
        return [p for p in itertools.permutations(ident) if p != ident]
    swap_last = ident[:-2] + (ident[-1], ident[-2])
    to_last = (0,) + ident[2:] + (1,)  # NC... -> N...C
    to_first = (0, ndim - 1) + ident[1:-1]  # N...C -> NC...
    return list(dict.fromkeys([swap_last, to_last, to_first]))


def could_be_permuted(bench_norm: float, target_norm: float, numel: int, tol: Tolerance) -> bool:
    """A cheap necessary condition for find_layout, from norms the metrics pass already summed.
    If target == P(bench) within tolerance elementwise, then by the triangle inequality
    ``|‖t‖ - ‖b‖| <= ‖t - Pb‖ <= sqrt(n) * atol + rtol * ‖b‖`` (P keeps the norm). A pair that
    merely drifted (every element 5 % off) fails this and skips the dozens of full-tensor checks."""
    slack = numel ** 0.5 * tol.atol + tol.rtol * bench_norm
    return abs(target_norm - bench_norm) <= slack * (1 + 1e-6) + 1e-12 * max(bench_norm, target_norm)


def _close(a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> bool:
    return bool(torch.isclose(b, a, rtol=tol.rtol, atol=tol.atol, equal_nan=True).all())


def find_layout(bench: torch.Tensor, target: torch.Tensor, tol: Tolerance) -> str | None:
    """A description such as ``permute(0, 2, 3, 1)`` of the permutation that makes the pair
    agree, or None. ``reinterpreted`` means the permuted data was read back in the bench's shape.
    None for a pair that agrees element by element already (a failure by its norm or cosine, of
    values far below ``atol``: every permutation of them is close too)."""
    if bench.numel() != target.numel() or bench.numel() == 0 or bench.numel() > MAX_NUMEL:
        return None
    a, b = bench.double(), target.double()
    if a.shape == b.shape and _close(a, b, tol):
        return None  # already within tolerance element by element: no permutation explains its failure
    for p in _candidates(a.dim()):
        moved = a.permute(p)
        if tuple(moved.shape) == tuple(b.shape) and _close(moved, b, tol):
            return f"permute{p}"
    if a.shape == b.shape:
        for p in _candidates(a.dim()):
            # the target holds the memory of bench.permute(p) but labels it with the bench's shape
            if _close(a.permute(p).contiguous().reshape(b.shape), b, tol):
                return f"permute{p} reinterpreted as {tuple(b.shape)}"
    return None
