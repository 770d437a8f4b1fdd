"""One fused multi-tensor statistics kernel (Triton) for ``DeferredStats`` batches (issue 30).

The ``_launch_row`` fallback reads each tensor about eight times and launches about fifteen
kernels per tensor; this reads each byte once and launches two kernels per batch, whatever the
batch holds:

1. ``_partials``: one program per CHUNK elements of any tensor of the batch (a program finds its
   tensor in the batch's table). It loads BLOCK elements at a time, reduces them in fp32 (finite
   count, sum, min, max, +Inf and -Inf counts, and the squares centred on the block's own mean,
   so no E[x^2] - mean^2 cancellation) and merges the blocks with Chan's parallel formula in
   fp64. A block whose fp32 sums overflow (|x| near fp32's limit) is summed again in fp64 from
   the registers it is already in.
2. ``_combine``: one program per tensor merges its programs' partials (Chan again, fp64) and
   writes the tensor's row of the ``DeferredStats`` buffer: min, max, sum, centred sum of
   squares, finite count, +Inf count, -Inf count (``stats._launch_row``'s row, same meaning).

Taken: float32, bfloat16 and float16 tensors, plain or neg-bit-free, whose elements fill their
memory span exactly (contiguous or any permutation of it: transposes, channels_last). The
statistics do not depend on element order, so such a tensor is read as one flat run. Everything
else (float64, integers, slices with gaps) goes to the fallback, in the same batch.

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
KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_COLUMNS = 5  # ptr, numel, kind, first program, row pointer


@triton.jit
def _partials(meta, partials, total_programs, NT: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr):
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
    lo = tl.full((), float("inf"), tl.float32)
    hi = tl.full((), float("-inf"), tl.float32)
    posinf = tl.zeros((), dtype=tl.int64)
    neginf = tl.zeros((), dtype=tl.int64)
    for i in range(ITERS):
        offsets = start + i * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        if kind == 0:
            x = tl.load(address.to(tl.pointer_type(tl.float32)) + offsets, mask=inside, other=0.0)
        elif kind == 1:
            x = tl.load(address.to(tl.pointer_type(tl.bfloat16)) + offsets, mask=inside, other=0.0).to(tl.float32)
        else:
            x = tl.load(address.to(tl.pointer_type(tl.float16)) + offsets, mask=inside, other=0.0).to(tl.float32)
        big = tl.abs(x) == float("inf")
        finite = inside & (x == x) & (~big)
        posinf += tl.sum((inside & big & (x > 0)).to(tl.int64), axis=0)
        neginf += tl.sum((inside & big & (x < 0)).to(tl.int64), axis=0)
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
        lo = tl.minimum(lo, tl.min(tl.where(finite, x, float("inf")), axis=0))
        hi = tl.maximum(hi, tl.max(tl.where(finite, x, float("-inf")), axis=0))
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
    tl.store(row + 3 * total_programs, lo.to(tl.float64))
    tl.store(row + 4 * total_programs, hi.to(tl.float64))
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
    """The fused kernel reads ``x``: a taken dtype, no neg bit, elements filling their span exactly."""
    return (x.dtype in KINDS and type(x) in (torch.Tensor, torch.nn.Parameter) and not x.is_neg()
            and row.is_contiguous() and _dense(x))


def _dense(x: torch.Tensor) -> bool:
    """Non-overlapping and dense: some order of the dims makes the strides those of a contiguous tensor."""
    if x.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def fused_rows(items: list[tuple[torch.Tensor, torch.Tensor]],
               fallback: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], None]) -> None:
    """Write each (tensor, row) pair's statistics row: the taken tensors by the two fused
    launches (per MAX_TENSORS tensors), the rest by ``fallback``."""
    taken = [(x, row) for x, row in items if takes(x, row)]
    rest = [(x, row) for x, row in items if not takes(x, row)] if len(taken) < len(items) else []
    for i in range(0, len(taken), MAX_TENSORS):
        _launch(taken[i:i + MAX_TENSORS])
    if rest:
        fallback(rest)


def _launch(items: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    device = items[0][0].device
    # + the end sentinel of the last tensor; at least 64, so a run compiles a few widths only
    width = max(64, triton.next_power_of_2(len(items) + 1))
    table = [[0] * width for _ in range(_COLUMNS)]
    programs = 0
    for t, (x, row) in enumerate(items):
        n = x.numel()
        table[0][t], table[1][t], table[2][t] = x.data_ptr(), n, KINDS[x.dtype]
        table[3][t], table[4][t] = programs, row.data_ptr()
        programs += triton.cdiv(n, CHUNK)
    for t in range(len(items), width):  # past the last tensor: never a program's tensor
        table[3][t] = programs if t == len(items) else 2 ** 62
    meta = torch.tensor(table, dtype=torch.int64)
    if device.type != "cpu":  # one non-blocking upload; the pinned block is not reused before it lands
        meta = meta.pin_memory().to(device, non_blocking=True)
    partials = torch.empty((7, max(programs, 1)), dtype=torch.float64, device=device)
    if programs:
        _partials[(programs,)](meta, partials, programs, NT=width, BLOCK=BLOCK, ITERS=ITERS)
    _combine[(len(items),)](meta, partials, programs, NT=width, PB=PARTIAL_BLOCK)
