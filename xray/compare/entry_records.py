"""Entries as light objects; their Records (and tensor lists) built on demand and kept in a
bounded cache.

Why: attribution (causality.py) and the random-op check read the Records of the suspect entries
only, pass after pass; on a run that diverged early that is every entry. A Record costs ~2 KB,
so a million held at once cost gigabytes: the last ``CACHE`` read are kept, a miss builds again.
A miss on an entry attribution will read (``read_ahead``) builds the next ``BLOCK`` of them in
one gather from the columns, half the cost of one at a time. The first ``HOLD`` entries to read
are kept once built, the rest pass through the cache: a pass that sweeps more entries than a
cache holds would evict each before the next pass reads it again, so a run with up to ``HOLD``
suspect pairs builds each Record once, and a larger one builds again only the entries past them
(tools/bench_bigdump.py --failing).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dump.columns import DIRECTIONS, KINDS
from .entry_table import EntryTable

CACHE = 1024  # Records kept per side: the block being read, and a pass's look-backs to producers
HOLD = 16384  # the first this many entries to read, a side keeps (~45 MB): each is built once
BLOCK = 256  # entries built per miss on the entries attribution reads next


class Entry:
    """One record that produced tensors, at position ``pos`` of its dump's EntryTable: kind, op,
    module path (wrapper prefixes stripped), name and direction from the table; its Record and
    (name, TensorMeta) lists of outputs and inputs built when read (Entries' cache). Equal to
    any Entry of the same position: two reads of one entry may be two objects."""

    __slots__ = ("_entries", "pos")

    def __init__(self, entries: Entries, pos: int) -> None:
        self._entries, self.pos = entries, pos

    @property
    def path(self) -> str:
        return self._entries.table.path_text[self.pos]

    @property
    def table(self) -> EntryTable:
        return self._entries.table

    @property
    def record(self):
        return self._entries.built(self.pos).record

    @property
    def outputs(self) -> list:
        return self._entries.built(self.pos).outputs

    @property
    def inputs(self) -> list:
        return self._entries.built(self.pos).inputs

    @property
    def kind(self) -> str:
        return KINDS[self._entries.table.kind[self.pos]]

    @property
    def op(self) -> str:
        return self._entries.table.op_text[self.pos]

    @property
    def name(self) -> str:
        return self._entries.table.names[self.pos]

    @property
    def direction(self) -> str:
        return DIRECTIONS[self._entries.table.direction[self.pos]]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Entry) and other._entries is self._entries and other.pos == self.pos

    def __hash__(self) -> int:
        return hash((id(self._entries), self.pos))

    def __repr__(self) -> str:
        return f"Entry({self.pos}, {self.name})"


class _Built:
    """An entry's Record and its (name, TensorMeta) lists, made from that one Record."""

    __slots__ = ("record", "_outputs", "_inputs")

    def __init__(self, record: Any) -> None:
        self.record, self._outputs, self._inputs = record, None, None

    @property
    def outputs(self) -> list:
        if self._outputs is None:
            self._outputs = list(self.record.output_tensors())
        return self._outputs

    @property
    def inputs(self) -> list:
        if self._inputs is None:
            self._inputs = list(self.record.input_tensors())
        return self._inputs


class Entries(Sequence):
    """A table's entries by position (a new light Entry per read), their Records in a cache of
    the ``capacity`` last read, besides those of the first ``HOLD`` entries to read (kept)."""

    def __init__(self, table: EntryTable, capacity: int | None = None) -> None:
        self.table = table
        self.capacity = max(CACHE if capacity is None else capacity, 2 * BLOCK)
        self._cache: dict[int, _Built] = {}  # in order of last read: the first is evicted
        self._kept: dict[int, _Built] = {}  # the first HOLD entries to read, once built
        self._to_keep: set[int] = set()  # those entries' positions
        self._ahead = np.zeros(0, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, pos: int) -> Entry:
        if type(pos) is not int:
            if not isinstance(pos, (int, np.integer)):
                raise TypeError("Entries are read by position")
            pos = int(pos)
        if not 0 <= pos < len(self.table.row):
            raise IndexError(pos)
        return Entry(self, pos)

    def read_ahead(self, positions: np.ndarray) -> None:
        """The positions attribution will read, in the order it reads them (ascending): a miss on
        one of them builds it and the next ``BLOCK - 1`` in one gather. The first ``HOLD`` of
        them are kept once built (a few tens of MB); a run with more suspect entries builds the
        others again in each pass that reads them."""
        self._ahead = positions
        self._to_keep = set(positions[:max(HOLD, 0)].tolist())

    def built(self, pos: int) -> _Built:
        got = self._kept.get(pos)
        if got is not None:
            return got
        got = self._cache.pop(pos, None)
        if got is None:
            got = self._build(pos)
            if pos in self._to_keep:
                self._kept[pos] = got
                return got
        self._cache[pos] = got  # now the last read
        return got

    def _build(self, pos: int) -> _Built:
        ahead, cache = self._ahead, self._cache
        j = int(np.searchsorted(ahead, pos))
        block = [pos]
        if j < len(ahead) and ahead[j] == pos:
            block += [p for p in ahead[j + 1:j + BLOCK].tolist() if p not in cache and p not in self._kept]
        source, rows = self.table.source, self.table.row
        try:
            records = source.records_at(rows[block])
        except ValueError:  # ColumnsError too: a bad record is reported when it is read, not before
            block, records = [pos], [source.record(int(rows[pos]))]
        for p, record in zip(block[1:], records[1:]):
            (self._kept if p in self._to_keep else cache)[p] = _Built(record)
        while len(cache) >= self.capacity:
            del cache[next(iter(cache))]
        return _Built(records[0])
