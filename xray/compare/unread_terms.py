"""Matched calls downstream of a term the target dropped, marked suspect before attribution.

A bench-only op that reads a value both runs computed (a matched record's output) which nothing
on the target reads is a step the target left out (``residual + h`` written ``h``). It has no
row of its own, and its consumers may pass: a BERT attention output dropped from its residual
sum moves the norm after it 0.7 %, inside bf16's passing band. So the matched calls that read
what it makes (through other bench-only ops) become warnings marked ``UNREAD_SUSPECT``;
attribution (``causality._Graph.unread_on_the_target``) fails them or passes them again.
Forward calls only, as every skipped-step rule; a target that folded calls (de-dup keeps a
folded call's first argument's producer only) cannot say that nothing read a value.
"""
from __future__ import annotations

import numpy as np

from ..dump.columns import DIRECTIONS, INPUT, KINDS, SRC_OP
from .entry_table import EntryTable

UNREAD_SUSPECT = "a bench-only op behind it reads a value the target computed and never read"
_OP, _FORWARD = KINDS.index("op"), DIRECTIONS.index("forward")


def _reads(t: EntryTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reader seq, producer seq, producer output) of every op-made tensor argument of a dump."""
    c = t.columns
    rows = np.flatnonzero((c.tensors["role"] == INPUT) & (c.tensors["src_kind"] == SRC_OP))
    return (c.records["seq"][c.tensors["record"][rows]], c.tensors["src_seq"][rows], c.tensors["src_index"][rows])


def downstream_of_unread(ta: EntryTable, tb: EntryTable, pa: np.ndarray, pb: np.ndarray) -> set[int]:
    """Bench seqs of the matched calls that read, straight or through other bench-only forward
    ops, a bench-only forward op reading a matched value whose target partner no target
    record reads. Array work over each dump's reads, so a dump whose structure matches costs
    one mask."""
    if not len(pa) or ta.columns is None or tb.columns is None or len(tb.columns.folds):
        return set()
    matched = np.zeros(len(ta), bool)
    matched[pa] = True
    bench_only = ta.seq[~matched & (ta.kind == _OP) & (ta.direction == _FORWARD)]
    if not len(bench_only):
        return set()
    reader, src, index = _reads(ta)
    order = np.argsort(ta.seq[pa])
    bench_matched, target_partner = ta.seq[pa][order], tb.seq[pb][order]
    edge = np.isin(reader, bench_only) & np.isin(src, bench_matched)
    if not edge.any():
        return set()
    partner = target_partner[np.searchsorted(bench_matched, src[edge])]
    _, t_src, t_index = _reads(tb)
    key = t_src.astype(np.int64) * 4096 + t_index  # (outputs past 4096 share a key: read, conservatively)
    unread = ~np.isin(partner.astype(np.int64) * 4096 + index[edge], key)
    frontier = np.unique(reader[edge][unread])
    found, seen = [], set()
    while len(frontier):
        seen.update(frontier.tolist())
        next_readers = np.unique(reader[np.isin(src, frontier)])
        found.append(next_readers[np.isin(next_readers, bench_matched)])
        frontier = next_readers[np.isin(next_readers, bench_only)]
        frontier = frontier[~np.isin(frontier, list(seen))]
    return set(np.concatenate(found).tolist()) if found else set()
