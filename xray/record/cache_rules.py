"""What an op call tells the recorder's statistics cache, the same for both recording paths.

The cache keys a tensor's statistics by its version counter, and three facts of a call reach it
around that counter: a write is counted only after the kernel returns (so written arguments are
forgotten), an op that keeps its input's values can hand those statistics on, and a view's
outputs share their base's counter only once the call has returned.

Which of them applies to an op is decided once per op (``rows.op_facts``) and read from there by
the recorder's C path (xray/record/_fastpath.c), which still carries their bodies for the common
call (an entry stored under a stamp, the same-dtype-and-size test): tests/test_record_rows.py
compares the two.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from ..dump.stats import StatsCache


def forget_written(cache: StatsCache, info, bound: dict[str, Any]) -> None:
    """Forget every tensor the call may have written (``bound``: its arguments by name). c10d
    schemas declare no writes (allgather_ fills its Tensor[][] all the same) and collectives do
    not bump version counters: any tensor argument of one may hold new values."""
    if info.collective:
        cache.forget_all(list(bound.values()))
    for name in info.mutates:
        cache.forget_all(bound.get(name))


def same_values(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether ``dst``, the result of an op that keeps its input's values
    (``info.stats_preserving``), provably holds ``src``'s elements, so that ``src``'s statistics
    describe it: the same dtype and as many elements, in the same memory (a view: these ops never
    move the offset). A copy (a clone, a contiguous copy, a cast to its own dtype) is a kernel
    that can be wrong: it gets statistics of its own, which compare holds against its input's
    within the run (compare.moved_values, sample_verdicts.moved_and_changed), so a bug in a few
    of its elements shows whether or not its sample draws one."""
    return src.dtype == dst.dtype and src.numel() == dst.numel() and src.data_ptr() == dst.data_ptr()


def reuse_input_stats(cache: StatsCache, info, args: tuple, out: Any, known: Any) -> None:
    """The first output holds the first input's values (``info.stats_preserving``, ``same_values``):
    cache the statistics the input was described with (``known``; None: ask the cache, which
    reduces a parameter again, since parameters are never cached) for it."""
    src = args[0] if args else None
    dst = out[0] if info.returns > 1 else out
    if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and same_values(src, dst):
        cache.put(dst, cache.resample(cache.get(src) if known is None else known, dst))


def cache_view_outputs(cache: StatsCache, args: tuple, described: Iterable[tuple[torch.Tensor, Any]]) -> None:
    """A view's outputs take their base's version counter once the call returns: cache their
    statistics (``described``: (output, statistics) pairs) under that stamp, or the next op
    reading them reduces them again."""
    base = args[0] if args else None
    version = cache.stamp(base) if isinstance(base, torch.Tensor) else None
    if version is not None:
        for t, stats in described:
            cache.put(t, stats, version)
