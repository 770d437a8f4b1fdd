"""The rows two matched EntryTables make, laid out as arrays before any row exists.

Why: the row order (target-only entries before each matched pair, then bench-only ones, then the
pair's outputs) and each row's entries and outputs, as int32 arrays: a million rows cost a few MB.
"""
from __future__ import annotations

import numpy as np

from .entry_table import EntryTable, gather


class RowPlan:
    """Which entries and outputs each row shows, in row order: before each matched
    pair, the target-only entries that precede it, then the bench-only ones, then the pair's rows."""

    def __init__(self, ta: EntryTable, tb: EntryTable, pa: np.ndarray, pb: np.ndarray) -> None:
        self.pa, self.pb = pa, pb
        n_pair = np.maximum(ta.n_out[pa], tb.n_out[pb])
        only_a, only_b = _unmatched(len(ta), pa), _unmatched(len(tb), pb)
        if len(only_a) or len(only_b):
            # block keys: the pair a block precedes (or is) x 3 + its category; a stable sort keeps
            # unmatched entries in their order within a gap
            cat = np.concatenate([np.zeros(len(only_b), np.int32), np.ones(len(only_a), np.int32),
                                  np.full(len(pa), 2, np.int32)])
            pair = np.concatenate([np.searchsorted(pb, only_b, "right"), np.searchsorted(pa, only_a, "right"),
                                   np.arange(len(pa))]).astype(np.int32)
            order = np.argsort(pair.astype(np.int64) * 3 + cat, kind="stable")
            cat, pair = cat[order], pair[order]
            a = np.concatenate([np.full(len(only_b), -1, np.int32), only_a, pa])[order]
            b = np.concatenate([only_b, np.full(len(only_a), -1, np.int32), pb])[order]
            n = np.concatenate([tb.n_out[only_b], ta.n_out[only_a], n_pair])[order]
            del order
        else:  # every entry matched (the same model on both sides): blocks are the pairs
            cat, pair, a, b, n = np.full(len(pa), 2, np.int32), np.arange(len(pa), dtype=np.int32), pa, pb, n_pair
        block_start = np.cumsum(n, dtype=np.int64) - n  # first row of each block

        def rep(x: np.ndarray) -> np.ndarray:  # int32: a million rows hold 6 of these
            return np.repeat(x.astype(np.int32, copy=False), n)

        self.cat, self.pair, self.a, self.b = rep(cat), rep(pair), rep(a), rep(b)
        k = np.arange(len(self.cat), dtype=np.int32) - np.repeat(block_start.astype(np.int32), n)  # output index
        self.ao = np.where(k < gather(ta.n_out, self.a, 0), gather(ta.out_start, self.a, 0) + k, -1).astype(np.int32)
        self.bo = np.where(k < gather(tb.n_out, self.b, 0), gather(tb.out_start, self.b, 0) + k, -1).astype(np.int32)
        del k
        # where each pair's rows start, by pair index
        self.pair_start = np.zeros(len(pa), np.int64)
        self.pair_rows = n_pair
        is_pair = cat == 2
        self.pair_start[pair[is_pair]] = block_start[is_pair]

    def __len__(self) -> int:
        return len(self.cat)

    def trim(self) -> None:
        """Drop the row -> entry and output maps once rows are judged (attribution reads the
        pairs, their rows and the target entry of each row)."""
        self.a = self.ao = self.bo = None


def _unmatched(n: int, matched: np.ndarray) -> np.ndarray:
    """Positions in range(n) not in ``matched`` (int32)."""
    keep = np.ones(n, dtype=bool)
    keep[matched] = False
    return np.flatnonzero(keep).astype(np.int32)
