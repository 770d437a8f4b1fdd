"""Matched calls downstream of a term the target dropped, marked suspect before attribution.

A bench-only op that reads a value both runs computed (a matched record's output) which nothing
on the target reads is a step the target left out (``residual + h`` written ``h``). It has no
row of its own, and its consumers may pass: a BERT attention output dropped from its residual
sum moves the norm after it 0.7 %, inside bf16's passing band. So the matched calls that read
what it makes (through other bench-only ops) become warnings marked ``UNREAD_SUSPECT``;
attribution (``causality._Graph.unread_on_the_target``) fails them or passes them again. Such
an op that no matched call reads from (a residual left out of the last layer's output: what
comes after pairs with nothing) is itself the row that fails.
Forward calls only, as every skipped-step rule; a target that folded calls (de-dup keeps a
folded call's first argument's producer only) cannot say that nothing read a value.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

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


@dataclass
class UnreadTerms:
    """``consumers``: bench seqs of the matched calls that read what such an op makes (through
    other bench-only ops); ``orphans``: such an op that no matched call reads from, by bench
    seq, with the target seq of the value it reads (the model's output the target left out:
    nothing after it pairs, so its own row carries the verdict)."""

    consumers: set[int] = field(default_factory=set)
    orphans: dict[int, int] = field(default_factory=dict)


def unread_terms(ta: EntryTable, tb: EntryTable, pa: np.ndarray, pb: np.ndarray, complete: bool) -> UnreadTerms:
    """The bench-only forward ops that read a matched value whose target partner no target
    record reads, and what reads them. ``complete``: the target's recording ran to its end
    (one that stopped holds no reader of what it made last); a value the target made after
    its last forward op record began is left out for the same reason (it may be the model's
    output), unless the op reading it is the bench's last step and combines it with another
    value both runs computed: the target ends where the bench goes on to form a sum, so one of
    the two terms is missing from what it returns. Array work over each dump's reads, so a
    dump whose structure matches costs one mask."""
    out = UnreadTerms()
    if not complete or not len(pa) or ta.columns is None or tb.columns is None or len(tb.columns.folds):
        return out
    matched = np.zeros(len(ta), bool)
    matched[pa] = True
    bench_only = ta.seq[~matched & (ta.kind == _OP) & (ta.direction == _FORWARD)]
    if not len(bench_only):
        return out
    reader, src, index = _reads(ta)
    order = np.argsort(ta.seq[pa])
    bench_matched, target_partner = ta.seq[pa][order], tb.seq[pb][order]
    edge = np.isin(reader, bench_only) & np.isin(src, bench_matched)
    if not edge.any():
        return out
    partner = target_partner[np.searchsorted(bench_matched, src[edge])]
    _, t_src, t_index = _reads(tb)
    key = t_src.astype(np.int64) * 4096 + t_index  # (outputs past 4096 share a key: read, conservatively)
    last = tb.seq[(tb.kind == _OP) & (tb.direction == _FORWARD)].max(initial=-1)
    unread = ~np.isin(partner.astype(np.int64) * 4096 + index[edge], key)
    terms = Counter(r for r, _ in set(zip(reader[edge].tolist(), src[edge].tolist())))  # matched values read
    for seed, value in dict(zip(reader[edge][unread].tolist(), partner[unread].tolist())).items():
        consumers = _matched_readers(seed, reader, src, bench_only, bench_matched)
        if value < last and consumers:
            out.consumers |= consumers
        elif not consumers and (value < last or terms[seed] > 1):
            out.orphans[seed] = value
    return out


def _matched_readers(seed: int, reader: np.ndarray, src: np.ndarray, bench_only: np.ndarray,
                     bench_matched: np.ndarray) -> set[int]:
    """Bench seqs of the matched calls that read what bench-only op ``seed`` makes, straight
    or through other bench-only ops."""
    frontier, seen, found = np.array([seed]), {seed}, set()
    while len(frontier):
        readers = np.unique(reader[np.isin(src, frontier)])
        found.update(readers[np.isin(readers, bench_matched)].tolist())
        frontier = readers[np.isin(readers, bench_only) & ~np.isin(readers, list(seen))]
        seen.update(frontier.tolist())
    return found
