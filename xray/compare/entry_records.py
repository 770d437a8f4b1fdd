"""Entries as objects, each building its Record (and tensor lists) on first access.

Why: attribution (causality.py) and the random-op check read the Records of a few entries only;
a Record per entry would cost a million of them (minutes, gigabytes) on a large dump.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from ..dump.columns import DIRECTIONS, KINDS
from .entry_table import EntryTable


class Entry:
    """One record that produced tensors, at position ``pos`` of its dump's EntryTable: kind, op,
    module path (wrapper prefixes stripped), name and direction from the table; its Record and
    (name, TensorMeta) lists of outputs and inputs built on first access."""

    def __init__(self, table: EntryTable, pos: int) -> None:
        self.table, self.pos = table, pos
        self.path = table.path_text[pos]

    @cached_property
    def record(self):
        return self.table.source.record(int(self.table.row[self.pos]))

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
        return f"Entry({self.pos}, {self.name})"


class Entries(Sequence):
    """A table's entries by position, each built (and kept) when first read."""

    def __init__(self, table: EntryTable) -> None:
        self.table = table
        self._built: dict[int, Entry] = {}

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, pos: int) -> Entry:
        if not isinstance(pos, int):
            raise TypeError("Entries are read by position")
        e = self._built.get(pos)
        if e is None:
            if not 0 <= pos < len(self.table):
                raise IndexError(pos)
            e = self._built[pos] = Entry(self.table, pos)
        return e
