"""A sample of every tensor: the same few elements, chosen from the shape alone, on both runs.

Statistics say whether a tensor's range moved; they are blind to a bug that leaves the range
alone (a dropped mask, a swapped head, a wrong scale on part of the elements). A sample is
elementwise evidence on every record, even one whose tensors were not saved.

Why the positions come from the shape and a fixed seed, never from the values: two runs of the
same model (CPU and GPU, fp32 and bf16) then sample the same logical elements and can be
compared element by element; and tensors of one shape (the inputs and output of a pointwise op)
are sampled at the same positions, so an op's output can be recomputed from its inputs' samples.
Positions are logical row-major indices, so a channels-last or transposed layout samples the
same elements as a contiguous one.

What a sample of k elements can see: a bug that changes a fraction f of a tensor's elements is
caught with probability 1 - (1 - f)^k (k = 32: f = 10 % -> 97 %, f = 5 % -> 81 %, f = 1 % -> 28 %);
a bug on a single element of a large tensor is seen by the statistics or by the consumers it
feeds, rarely by the sample.

The generator is splitmix64 over (seed, axis, size, draw), spelled out here so that every
platform, numpy version and a future C or Triton gatherer draw the same positions:
docs/format.md fixes it. A dump says which draw it used (header ``sample_positions``); samples of
another draw are not read.
"""
from __future__ import annotations

import functools
import struct

import numpy as np
import torch

from .model import SAMPLE_SIZE  # noqa: E402 - 32 elements per tensor; a tensor with fewer is sampled whole
SEED = 0x5EED_A11_E1E  # fixed: part of the format (docs/format.md, "Samples")

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


SCHEME = "per-axis"  # the header's SCHEME_KEY: how positions are drawn (docs/format.md, "Samples")
SCHEME_KEY = "sample_positions"


def _permutation(state: int, k: int) -> list[int]:
    """0..k-1 shuffled (Fisher-Yates) by the splitmix64 stream from ``state``."""
    out = list(range(k))
    for i in range(k - 1, 0, -1):
        state = _splitmix64(state)
        j = state % (i + 1)
        out[i], out[j] = out[j], out[i]
    return out


@functools.lru_cache(maxsize=4096)
def axis_draws(axis: int, size: int, k: int = SAMPLE_SIZE) -> tuple[int, ...]:
    """Draw j's coordinate on an axis of ``size``, ``axis`` counted from the last (0 = the last):
    one coordinate in each of k strata of the axis, the strata in an order shuffled by (axis,
    size), so that two axes are not drawn along a diagonal. An axis of size >= k gets k distinct
    coordinates; one of size 1 always 0 (the element a broadcast reads)."""
    if size == 1:
        return (0,) * k
    state = _splitmix64(SEED ^ _splitmix64((axis << 48) ^ size))
    order = _permutation(state, k)
    draws = []
    for j in range(k):
        state = _splitmix64(state + j)
        draws.append((order[j] * size + state % size) // k)
    return tuple(draws)


@functools.lru_cache(maxsize=4096)
def positions(shape: tuple[int, ...], k: int = SAMPLE_SIZE) -> tuple[int, ...]:
    """The logical (row-major) indices sampled from a tensor of ``shape``, in draw order: all of
    them when it has at most ``k`` elements, else k draws, each coordinate from ``axis_draws``
    of its axis (counted from the last). Axes are aligned as broadcasting aligns them, so a
    broadcast input's j-th draw is the element the output's j-th draw reads: an elementwise op's
    sampled output is recomputed from its inputs' samples, whatever their shapes (a norm's
    ``x * rsqrt(var)``, a bias, a mask). Two draws may meet on one element of a small tensor."""
    numel = 1
    for s in shape:
        numel *= int(s)
    if numel <= k:
        return tuple(range(numel))
    flat = [0] * k
    stride = 1
    for axis, size in enumerate(reversed(shape)):
        size = int(size)
        if size > 1:
            for j, c in enumerate(axis_draws(axis, size, k)):
                flat[j] += c * stride
        stride *= size
    return tuple(flat)


def usable(header: dict) -> bool:
    """Whether a dump's samples were drawn as this xray draws them (else they are left out when
    it is read: comparing samples drawn at other positions would compare other elements)."""
    return header.get(SCHEME_KEY) == SCHEME


@functools.lru_cache(maxsize=4096)
def index(shape: tuple[int, ...], device: torch.device, k: int = SAMPLE_SIZE) -> torch.Tensor:
    """A shape's sample positions as an index tensor on ``device`` (made once per shape and device;
    never an inference tensor, so a gather into a buffer row works outside inference_mode)."""
    with torch.inference_mode(False):
        return torch.tensor(positions(shape, k), dtype=torch.int64, device=device)


def storage_offsets(shape: tuple[int, ...], stride: tuple[int, ...], offset: int = 0,
                    k: int = SAMPLE_SIZE) -> np.ndarray:
    """Where the sampled elements of a strided tensor lie in its storage (in elements)."""
    shape = tuple(shape)
    flat = np.asarray(positions(shape, k), dtype=np.int64)
    out = np.full(len(flat), offset, dtype=np.int64)
    if shape:
        for c, st in zip(np.unravel_index(flat, shape), stride):
            out += c * st
    return out


@functools.lru_cache(maxsize=4096)
def offsets_bytes(shape: tuple[int, ...], stride: tuple[int, ...]) -> bytes:
    """``storage_offsets`` from the data pointer (offset 0), as the int64 bytes the C gather reads
    (xray/dump/_moments.c, ``gather``): the table each (shape, stride) builds once."""
    return storage_offsets(tuple(shape), tuple(stride)).tobytes()


def as_floats(raw: bytes | None) -> tuple[float, ...] | None:
    """A sample's float64 bytes (how the recorder carries it) as the tuple ``TensorMeta.sample`` holds."""
    if not raw:
        return None
    return struct.unpack(f"{len(raw) // 8}d", raw)


def as_bytes(values: tuple[float, ...] | None) -> bytes | None:
    """``as_floats`` backwards."""
    if not values:
        return None
    return struct.pack(f"{len(values)}d", *values)


def take(t: torch.Tensor, k: int = SAMPLE_SIZE) -> np.ndarray:
    """The sampled elements of ``t`` as float64 (complex: real parts; bool: 0/1), in the order of
    ``positions``. One gather (``torch.take`` reads any layout in logical order) of at most ``k``
    elements on ``t``'s device; ``t`` is never modified. Call with dispatch modes disabled."""
    shape = tuple(t.shape)
    if t.numel() == 0:
        return np.zeros(0, dtype=np.float64)
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())[..., 0]
    picked = torch.take(t, index(shape, t.device, k))
    return picked.to(device="cpu", dtype=torch.float64).numpy()
