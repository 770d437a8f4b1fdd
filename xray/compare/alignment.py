"""Align two EntryTables, and lay out the rows their entries make.

Why: ``align``'s anchors and gap scores taken from the arrays (at once when both dumps have the
same structure), and compare_loaded's row order computed as arrays before any row exists.
"""
from __future__ import annotations

import math

import numpy as np

from .align import Features, align_features, op_base
from ..numerics.kernel_families import primary_shapes
from .entry_table import MODULE, Codes, EntryTable, gather


def _same_structure(ta: EntryTable, tb: EntryTable) -> bool:
    """align()'s shortcut: equal anchor keys and ops, entry for entry."""
    if len(ta) != len(tb) or len(ta.out) != len(tb.out):
        return False
    return bool(np.array_equal(ta.group, tb.group) and np.array_equal(ta.path, tb.path)
                and np.array_equal(ta.op, tb.op) and np.array_equal(ta.n_out, tb.n_out)
                and np.array_equal(ta.ident(), tb.ident()) and np.array_equal(ta.out_shape, tb.out_shape))


def align_tables(ta: EntryTable, tb: EntryTable, codes: Codes) -> tuple[np.ndarray, np.ndarray, int]:
    """``align`` on two tables: the same anchors and gap scores, from the arrays. Returns the
    matched (bench, target) positions as two arrays, and the number of anchors."""
    if _same_structure(ta, tb):
        return np.arange(len(ta), dtype=np.int32), np.arange(len(tb), dtype=np.int32), len(ta)
    keys, feats = [], []
    perm_of = codes.lut("shape", lambda v: codes.code("perm", tuple(sorted(v))), np.int64)
    numel_of = codes.lut("shape", math.prod)
    for t in (ta, tb):
        ops = t.op_text.tolist()

        def primary(values: np.ndarray) -> list[tuple]:  # a kernel family's shared outputs only
            return [primary_shapes(o, v) for o, v in zip(ops, t.per_entry(values))]

        shapes = [codes.code("shapes", s) for s in t.per_entry(t.out_shape)]
        keys.append(list(zip(t.group.tolist(), t.path.tolist(), t.ident().tolist(), shapes)))
        feats.append(Features.of_arrays(
            group=t.group, op=t.op, path=t.path,
            shape=np.array([codes.code("shapes", s) for s in primary(t.out_shape)], dtype=np.int64),
            base=np.array([codes.code("base", op_base(o)) for o in ops], dtype=np.int64),
            perm=np.array([codes.code("perms", p) for p in primary(perm_of[t.out_shape])], dtype=np.int64),
            numel=np.array([codes.code("numels", n) for n in primary(numel_of[t.out_shape])], dtype=np.int64),
            dtype=np.array([codes.code("dtypes", d) for d in primary(t.out_dtype)], dtype=np.int64),
            module=t.kind == MODULE, paths=t.path_text.tolist(), ops=t.op_text.tolist()))
    alignment = align_features(feats[0], feats[1], keys[0], keys[1])
    pairs = np.array(alignment.pairs, dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0].astype(np.int32), pairs[:, 1].astype(np.int32), alignment.anchors


class RowPlan:
    """Which entries and outputs each row shows, in compare_loaded's order: before each matched
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
