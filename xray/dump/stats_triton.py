"""One fused multi-tensor statistics kernel (Triton) for ``DeferredStats`` batches (issue 30).

The ``_launch_row`` fallback reads each tensor about eight times and launches about fifteen
kernels per tensor; this reads each byte once and launches two kernels per batch, whatever the
batch holds:

1. ``_partials``: one program per CHUNK elements of any tensor of the batch (a program finds its
   tensor in the batch's table). It loads BLOCK elements at a time, reduces them in fp32 (fp64
   for wide kinds: finite count, sum, min, max, +Inf and -Inf counts, and the squares centred on
   the block's own mean, so no E[x^2] - mean^2 cancellation) and merges the blocks with Chan's parallel formula in
   fp64. A block whose fp32 sums overflow (|x| near fp32's limit) is summed again in fp64 from
   the registers it is already in.
2. ``_combine``: one program per tensor merges its programs' partials (Chan again, fp64) and
   writes the tensor's row of the ``DeferredStats`` buffer: min, max, sum, centred sum of
   squares, finite count, +Inf count, -Inf count (``stats._launch_row``'s row, same meaning).

Taken: float32, bfloat16 and float16 tensors (reduced in fp32 registers, merged in fp64),
float64, integer and bool tensors (in fp64 throughout, as the fallback's ``_as_real`` reads
them), plain or neg-bit-free, in any layout whose dims coalesce to at most ``MAX_DIMS``: the
statistics do not depend on element order, so a contiguous tensor, a transpose or channels_last
is read as one flat run, and a slice with gaps by index arithmetic over its few dims. Everything
else (complex, more dims, overlapping strides) goes to the fallback, in the same batch.

The batch's table (data pointer, numel, dtype, first program, row pointer per tensor) is built
on the host and uploaded from pinned memory without blocking: no host synchronisation.
With ``TRITON_INTERPRET=1`` set before triton is imported, the kernels run on CPU tensors
(tests/test_stats_triton.py).
"""
from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

# Under the interpreter only if triton itself was imported with TRITON_INTERPRET=1: its library
# functions (tl.cdiv, ...) are decorated then, and compiled ones cannot run inside an interpreted kernel.
INTERPRETED = type(tl.standard.cdiv).__name__ == "InterpretedFunction"
# Elements per sub-block and sub-blocks per program. On a GPU, 1024 x 8 keeps a program busy for
# a few microseconds; under the interpreter a program costs ~10 ms of Python whatever its size,
# so fewer, larger blocks (still two per program, so the merge runs).
BLOCK, ITERS = (8192, 2) if INTERPRETED else (1024, 8)
CHUNK = BLOCK * ITERS
PARTIAL_BLOCK = 256  # partials merged per step by _combine
MAX_TENSORS = 1024  # tensors per launch (the table is searched as one vector of this length at most)
# 0-2 reduced in fp32 registers; 3 and up in fp64 (bool read as uint8)
KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3, torch.int64: 4, torch.int32: 5,
         torch.int16: 6, torch.int8: 7, torch.uint8: 8, torch.bool: 8}
MAX_DIMS = 4  # coalesced dims of a strided tensor; more go to the fallback
# ptr, numel, kind, first program, row pointer, dense flag, MAX_DIMS sizes, MAX_DIMS strides
_COLUMNS = 6 + 2 * MAX_DIMS


@triton.jit
def _offsets(meta, t, linear, NT: tl.constexpr, DIMS: tl.constexpr):
    """Element offsets (from the data pointer) of the ``linear`` indices of tensor ``t``: a dense
    run maps one to one; else its DIMS coalesced dims (sizes, then strides, outermost first)."""
    if tl.load(meta + 5 * NT + t) == 1:
        out = linear
    else:
        at = linear
        out = tl.zeros_like(linear)
        for j in tl.static_range(0, DIMS - 1):  # innermost dim first
            size = tl.load(meta + (6 + DIMS - 1 - j) * NT + t)
            out += (at % size) * tl.load(meta + (6 + 2 * DIMS - 1 - j) * NT + t)
            at = at // size
        out += at * tl.load(meta + (6 + DIMS) * NT + t)
    return out


@triton.jit
def _load_narrow(address, kind, at, inside):
    """float32, bfloat16 or float16 elements, as float32."""
    if kind == 0:
        x = tl.load(address.to(tl.pointer_type(tl.float32)) + at, mask=inside, other=0.0)
    elif kind == 1:
        x = tl.load(address.to(tl.pointer_type(tl.bfloat16)) + at, mask=inside, other=0.0).to(tl.float32)
    else:
        x = tl.load(address.to(tl.pointer_type(tl.float16)) + at, mask=inside, other=0.0).to(tl.float32)
    return x


@triton.jit
def _load_wide(address, kind, at, inside):
    """float64 and integer (bool as uint8) elements, as float64: the fallback's ``_as_real``."""
    if kind == 3:
        x = tl.load(address.to(tl.pointer_type(tl.float64)) + at, mask=inside, other=0.0)
    elif kind == 4:
        x = tl.load(address.to(tl.pointer_type(tl.int64)) + at, mask=inside, other=0).to(tl.float64)
    elif kind == 5:
        x = tl.load(address.to(tl.pointer_type(tl.int32)) + at, mask=inside, other=0).to(tl.float64)
    elif kind == 6:
        x = tl.load(address.to(tl.pointer_type(tl.int16)) + at, mask=inside, other=0).to(tl.float64)
    elif kind == 7:
        x = tl.load(address.to(tl.pointer_type(tl.int8)) + at, mask=inside, other=0).to(tl.float64)
    else:
        x = tl.load(address.to(tl.pointer_type(tl.uint8)) + at, mask=inside, other=0).to(tl.float64)
    return x


@triton.jit
def _partials(meta, partials, total_programs, NT: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
              DIMS: tl.constexpr):
    pid = tl.program_id(0)
    firsts = tl.load(meta + 3 * NT + tl.arange(0, NT))
    t = tl.sum((firsts <= pid).to(tl.int32), axis=0) - 1  # the tensor this program reads
    address = tl.load(meta + t)
    n = tl.load(meta + NT + t)
    kind = tl.load(meta + 2 * NT + t)
    start = (pid - tl.load(meta + 3 * NT + t)).to(tl.int64) * (BLOCK * ITERS)
    count = tl.zeros((), dtype=tl.float64)
    mean = tl.zeros((), dtype=tl.float64)
    m2 = tl.zeros((), dtype=tl.float64)
    lo = tl.full((), float("inf"), tl.float64)
    hi = tl.full((), float("-inf"), tl.float64)
    posinf = tl.zeros((), dtype=tl.int64)
    neginf = tl.zeros((), dtype=tl.int64)
    for i in range(ITERS):
        linear = start + i * BLOCK + tl.arange(0, BLOCK)
        inside = linear < n
        at = _offsets(meta, t, linear, NT, DIMS)
        if kind < 3:  # reduced in fp32 registers, merged in fp64
            x = _load_narrow(address, kind, at, inside)
            big = tl.abs(x) == float("inf")
            finite = inside & (x == x) & (~big)
            block_pos = tl.sum((inside & big & (x > 0)).to(tl.int64), axis=0)
            block_neg = tl.sum((inside & big & (x < 0)).to(tl.int64), axis=0)
            kept = tl.where(finite, x, 0.0)
            c = tl.sum(finite.to(tl.int32), axis=0).to(tl.float64)
            s = tl.sum(kept, axis=0).to(tl.float64)
            block_mean = s / tl.maximum(c, 1.0)
            centred = tl.where(finite, x - block_mean.to(tl.float32), 0.0)
            q = tl.sum(centred * centred, axis=0).to(tl.float64)
            if (s - s != 0.0) | (q - q != 0.0):  # fp32 overflow near fp32's limit: again in fp64
                wide = kept.to(tl.float64)
                s = tl.sum(wide, axis=0)
                block_mean = s / tl.maximum(c, 1.0)
                deviation = tl.where(finite, wide - block_mean, 0.0)
                q = tl.sum(deviation * deviation, axis=0)
            block_lo = tl.min(tl.where(finite, x, float("inf")), axis=0).to(tl.float64)
            block_hi = tl.max(tl.where(finite, x, float("-inf")), axis=0).to(tl.float64)
        else:  # float64 and integers: fp64 throughout, as the fallback reduces them
            # (names of their own: a name set in both branches must have one type in both)
            w = _load_wide(address, kind, at, inside)
            w_big = tl.abs(w) == float("inf")
            w_finite = inside & (w == w) & (~w_big)
            block_pos = tl.sum((inside & w_big & (w > 0)).to(tl.int64), axis=0)
            block_neg = tl.sum((inside & w_big & (w < 0)).to(tl.int64), axis=0)
            c = tl.sum(w_finite.to(tl.int32), axis=0).to(tl.float64)
            s = tl.sum(tl.where(w_finite, w, 0.0), axis=0)
            block_mean = s / tl.maximum(c, 1.0)
            w_deviation = tl.where(w_finite, w - block_mean, 0.0)
            q = tl.sum(w_deviation * w_deviation, axis=0)
            block_lo = tl.min(tl.where(w_finite, w, float("inf")), axis=0)
            block_hi = tl.max(tl.where(w_finite, w, float("-inf")), axis=0)
        posinf += block_pos
        neginf += block_neg
        lo = tl.minimum(lo, block_lo)
        hi = tl.maximum(hi, block_hi)
        merged = count + c
        delta = block_mean - mean
        share = c / tl.maximum(merged, 1.0)
        mean += delta * share
        m2 += q + delta * delta * count * share
        count = merged
    row = partials + pid
    tl.store(row, count)
    tl.store(row + total_programs, mean)
    tl.store(row + 2 * total_programs, m2)
    tl.store(row + 3 * total_programs, lo)
    tl.store(row + 4 * total_programs, hi)
    tl.store(row + 5 * total_programs, posinf.to(tl.float64))
    tl.store(row + 6 * total_programs, neginf.to(tl.float64))


@triton.jit
def _combine(meta, partials, total_programs, NT: tl.constexpr, PB: tl.constexpr):
    t = tl.program_id(0)
    first = tl.load(meta + 3 * NT + t)
    end = tl.load(meta + 3 * NT + t + 1)
    out = tl.load(meta + 4 * NT + t).to(tl.pointer_type(tl.float64))
    count = tl.zeros((), dtype=tl.float64)
    total = tl.zeros((), dtype=tl.float64)
    lo = tl.full((), float("inf"), tl.float64)
    hi = tl.full((), float("-inf"), tl.float64)
    posinf = tl.zeros((), dtype=tl.float64)
    neginf = tl.zeros((), dtype=tl.float64)
    for b in range(first, end, PB):
        at = b + tl.arange(0, PB)
        inside = at < end
        c = tl.load(partials + at, mask=inside, other=0.0)
        count += tl.sum(c, axis=0)
        total += tl.sum(c * tl.load(partials + total_programs + at, mask=inside, other=0.0), axis=0)
        block_lo = tl.load(partials + 3 * total_programs + at, mask=inside, other=float("inf"))
        block_hi = tl.load(partials + 4 * total_programs + at, mask=inside, other=float("-inf"))
        lo = tl.minimum(lo, tl.min(block_lo, axis=0))
        hi = tl.maximum(hi, tl.max(block_hi, axis=0))
        posinf += tl.sum(tl.load(partials + 5 * total_programs + at, mask=inside, other=0.0), axis=0)
        neginf += tl.sum(tl.load(partials + 6 * total_programs + at, mask=inside, other=0.0), axis=0)
    mean = total / tl.maximum(count, 1.0)
    m2 = tl.zeros((), dtype=tl.float64)
    for b in range(first, end, PB):  # the partials again (a few per tensor), centred on the mean
        at = b + tl.arange(0, PB)
        inside = at < end
        c = tl.load(partials + at, mask=inside, other=0.0)
        delta = tl.load(partials + total_programs + at, mask=inside, other=0.0) - mean
        m2 += tl.sum(tl.load(partials + 2 * total_programs + at, mask=inside, other=0.0) + c * delta * delta, axis=0)
    tl.store(out, lo)
    tl.store(out + 1, hi)
    tl.store(out + 2, total)
    tl.store(out + 3, m2)
    tl.store(out + 4, count)
    tl.store(out + 5, posinf)
    tl.store(out + 6, neginf)


def takes(x: torch.Tensor, row: torch.Tensor) -> bool:
    """The fused kernel reads ``x``: a taken dtype, no neg bit, at most MAX_DIMS dims once
    coalesced (any view without overlapping elements that torch's strides can express)."""
    return (x.dtype in KINDS and type(x) in (torch.Tensor, torch.nn.Parameter) and not x.is_neg()
            and row.is_contiguous() and layout(x) is not None)


def layout(x: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(sizes, strides) of ``x`` over at most MAX_DIMS dims, outermost first, or None. The
    statistics do not depend on element order, so size-1 dims go, the rest are sorted by stride
    and merged wherever one dim continues another: a contiguous tensor, a transpose or
    channels_last become one run of stride 1; a slice with gaps keeps a dim per gap. A stride of
    0 (an expand: the caller reduces its stored elements) or dims that overlap are refused."""
    dims = sorted(((st, sz) for sz, st in zip(x.shape, x.stride()) if sz != 1), reverse=True)
    merged: list[list[int]] = []
    for stride, size in reversed(dims):  # innermost first
        if stride == 0:
            return None
        if merged and stride == merged[-1][0] * merged[-1][1]:
            merged[-1][1] *= size
        elif merged and stride < merged[-1][0] * merged[-1][1]:
            return None  # overlapping elements
        else:
            merged.append([stride, size])
    if not merged:
        return (1,), (1,)
    if len(merged) > MAX_DIMS:
        return None
    merged.reverse()
    return tuple(sz for _, sz in merged), tuple(st for st, _ in merged)


def fused_rows(items: list[tuple[torch.Tensor, torch.Tensor]],
               fallback: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], None]) -> None:
    """Write each (tensor, row) pair's statistics row: the taken tensors by the two fused
    launches (per MAX_TENSORS tensors), the rest by ``fallback``."""
    taken, rest = [], []
    for x, row in items:
        shape = layout(x) if (x.dtype in KINDS and type(x) in (torch.Tensor, torch.nn.Parameter)
                              and not x.is_neg() and row.is_contiguous()) else None
        (rest if shape is None else taken).append((x, row, shape))
    for i in range(0, len(taken), MAX_TENSORS):
        _launch(taken[i:i + MAX_TENSORS])
    if rest:
        fallback([(x, row) for x, row, _ in rest])


def _launch(items: list[tuple[torch.Tensor, torch.Tensor, tuple]]) -> None:
    device = items[0][0].device
    # + the end sentinel of the last tensor; at least 64, so a run compiles a few widths only
    width = max(64, triton.next_power_of_2(len(items) + 1))
    table = [[0] * width for _ in range(_COLUMNS)]
    programs = 0
    for t, (x, row, (sizes, strides)) in enumerate(items):
        n = x.numel()
        table[0][t], table[1][t], table[2][t] = x.data_ptr(), n, KINDS[x.dtype]
        table[3][t], table[4][t] = programs, row.data_ptr()
        table[5][t] = 1 if strides == (1,) else 0  # one dense run: no index arithmetic
        pad = MAX_DIMS - len(sizes)
        for d in range(MAX_DIMS):
            table[6 + d][t] = sizes[d - pad] if d >= pad else 1
            table[6 + MAX_DIMS + d][t] = strides[d - pad] if d >= pad else 0
        programs += triton.cdiv(n, CHUNK)
    for t in range(len(items), width):  # past the last tensor: never a program's tensor
        table[3][t] = programs if t == len(items) else 2 ** 62
    meta = torch.tensor(table, dtype=torch.int64)
    if device.type != "cpu":  # one non-blocking upload; the pinned block is not reused before it lands
        meta = meta.pin_memory().to(device, non_blocking=True)
    partials = torch.empty((7, max(programs, 1)), dtype=torch.float64, device=device)
    if programs:
        _partials[(programs,)](meta, partials, programs, NT=width, BLOCK=BLOCK, ITERS=ITERS, DIMS=MAX_DIMS)
    _combine[(len(items),)](meta, partials, programs, NT=width, PB=PARTIAL_BLOCK)
