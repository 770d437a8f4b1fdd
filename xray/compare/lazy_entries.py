"""Entries of an EntryTable that build their Record on first access.

Why: attribution (causality.py) and the random-op check read Entries of a few records only;
an Entry per record would build the million Records the columnar compare avoids.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from ..dump.columns import DIRECTIONS, KINDS
from .entries import Entry
from .entry_table import EntryTable


class ColumnEntry(Entry):
    """An Entry whose Record (and tensor lists) is built on first access; kind, op, path, name
    and direction come from the table."""

    def __init__(self, table: EntryTable, pos: int) -> None:  # not Entry's: that one takes a built Record
        self.table, self.pos = table, pos
        self.path = table.path_text[pos]

    @cached_property
    def record(self):
        return self.table.columns.record(int(self.table.row[self.pos]))

    @cached_property
    def outputs(self):
        return list(self.record.output_tensors())

    @cached_property
    def inputs(self):
        return list(self.record.input_tensors())

    @property
    def kind(self) -> str:
        return KINDS[self.table.kind[self.pos]]

    @property
    def op(self) -> str:
        return self.table.op_text[self.pos]

    @property
    def name(self) -> str:
        return self.table.names[self.pos]

    @property
    def direction(self) -> str:
        return DIRECTIONS[self.table.direction[self.pos]]

    def __repr__(self) -> str:
        return f"ColumnEntry({self.pos}, {self.name})"


class LazyEntries(Sequence):
    """A table's entries by position, each built (and kept) when first read."""

    def __init__(self, table: EntryTable) -> None:
        self.table = table
        self._built: dict[int, ColumnEntry] = {}

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, pos: int) -> ColumnEntry:
        if not isinstance(pos, int):
            raise TypeError("LazyEntries are read by position")
        e = self._built.get(pos)
        if e is None:
            if not 0 <= pos < len(self.table):
                raise IndexError(pos)
            e = self._built[pos] = ColumnEntry(self.table, pos)
        return e
