"""Summary rows of a dump and their two renderings: a tabulate table and a CSV pandas reads.

Rows are produced lazily from the dump's index (module dumps) or records (trace dumps); only the
rendered strings are kept, never tensor data, so memory grows with the number of tensors, not
with their size.
"""
from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from tabulate import tabulate

from ..dump.model import TensorMeta
from ..dump.summary_csv import CSV_COLUMNS, stat_cell

#: The table's columns: the CSV's without the non-finite counts and where the data lives.
SUMMARY_COLUMNS = CSV_COLUMNS[:10]


@dataclass
class SummaryRow:
    step: int | None
    rank: int | None
    name: str  # module dumps: the full tensor name; trace dumps: <record name>.<argument>
    direction: str
    meta: TensorMeta

    def cells(self, index: int, csv_extra: bool) -> list[Any]:
        s = self.meta.stats
        stat = [None] * 4 if s is None else [s.min, s.max, s.mean, s.std]
        name = self.name
        if not csv_extra and s is not None and not s.finite:  # the table has no count columns
            name += f" [nan={s.nan} +inf={s.posinf} -inf={s.neginf}]"
        row = [index, _opt(self.step), _opt(self.rank), name, self.meta.dtype,
               "x".join(str(d) for d in self.meta.shape) or "scalar", *stat]
        if csv_extra:
            row += [s.nan if s else None, s.posinf if s else None, s.neginf if s else None,
                    self.meta.numel, self.direction, self.meta.data or ""]
        return row


def _opt(v: Any) -> Any:
    return "" if v is None else v


def dump_rows(dump, step: int | None = None) -> Iterator[SummaryRow]:
    """Every tensor of a module dump (lazily, from its index; one ``step`` or all) or of a trace
    dump's records."""
    rank = dump.header.get("global_rank", dump.header.get("rank"))
    if hasattr(dump, "rows"):  # ModuleDump
        yield from module_rows(dump.rows(step), rank)
        return
    for rec in dump.records:
        for arg, meta in rec.input_tensors():
            yield SummaryRow(rec.step, rank, f"{rec.name}.{arg}", rec.direction, meta)
        for arg, meta in rec.output_tensors():
            yield SummaryRow(rec.step, rank, f"{rec.name}.{arg}", rec.direction, meta)


def module_rows(rows: Iterable, rank: int | None) -> Iterator[SummaryRow]:
    """Summary rows of a module dump's TensorRows."""
    for r in rows:
        yield SummaryRow(r.step, rank, r.name, r.direction, r.meta)


def filter_rows(rows: Iterable[SummaryRow], steps: frozenset[int] | None = None,
                ranks: frozenset[int] | None = None, match: str | None = None) -> Iterator[SummaryRow]:
    """Keep rows whose step and rank are selected (None: all) and whose name matches the regex."""
    pattern = re.compile(match) if match else None
    for r in rows:
        if steps is not None and r.step not in steps:
            continue
        if ranks is not None and r.rank not in ranks:
            continue
        if pattern is not None and not pattern.search(r.name):
            continue
        yield r


def render_table(rows: Iterable[SummaryRow]) -> str:
    body = [r.cells(i, csv_extra=False) for i, r in enumerate(rows)]
    return tabulate(body, headers=SUMMARY_COLUMNS, tablefmt="simple", floatfmt=".6g", disable_numparse=False)


def write_csv(rows: Iterable[SummaryRow], out: IO[str], *, header: bool = True, start: int = 0) -> int:
    w = csv.writer(out)
    if header:
        w.writerow(CSV_COLUMNS)
    n = 0
    for i, r in enumerate(rows, start):
        cells = r.cells(i, csv_extra=True)
        cells[6:10] = [stat_cell(v) for v in cells[6:10]]
        w.writerow(["" if v is None else v for v in cells])
        n += 1
    return n


def write_summary_csv(dump, path: str | os.PathLike) -> Path:
    """The ``_summary.csv`` beside a module dump, written under a temporary name then renamed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        write_csv(dump_rows(dump), f)
    os.replace(tmp, path)
    return path
