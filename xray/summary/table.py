"""Summary rows of a dump and their two renderings: a tabulate table and a CSV pandas reads.

Rows are produced lazily from the dump's index (module dumps) or records (trace dumps); only the
rendered strings are kept, never tensor data, so memory grows with the number of tensors, not
with their size.
"""
from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from tabulate import tabulate

from ..dump.model import TensorMeta

#: The table's columns (issue 3); the CSV adds the non-finite counts and where the data lives.
COLUMNS = ("Index", "Step", "Rank", "Module", "Dtype", "Shape", "Min", "Max", "Mean", "Std")
CSV_COLUMNS = COLUMNS + ("NaN", "PosInf", "NegInf", "Numel", "Direction", "Data")


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
    return tabulate(body, headers=COLUMNS, tablefmt="simple", floatfmt=".6g", disable_numparse=False)


def write_csv(rows: Iterable[SummaryRow], out: IO[str], *, header: bool = True, start: int = 0) -> int:
    w = csv.writer(out)
    if header:
        w.writerow(CSV_COLUMNS)
    n = 0
    for i, r in enumerate(rows, start):
        cells = r.cells(i, csv_extra=True)
        cells[6:10] = [_stat_cell(v) for v in cells[6:10]]
        w.writerow(["" if v is None else v for v in cells])
        n += 1
    return n


def _stat_cell(v: float | None) -> str:
    """A statistic as the CSV writes it: 9 significant digits, which round-trip every float32
    value exactly ("%.9g" costs a third of repr's shortest round-trip form, and the debugger
    writes four per tensor per step). ``None`` or NaN ("no finite element") is an empty cell;
    the .h5 index keeps the exact float64 values."""
    return "" if v is None or v != v else _STAT_FORMAT % v


_STAT_FORMAT = "%.9g"
_NUMBERS_FORMAT = ",".join([_STAT_FORMAT] * 4 + ["%d"] * 4)  # min, max, mean, std, nan, posinf, neginf, numel


def _needs_quoting(text: str) -> bool:
    """Whether csv (QUOTE_MINIMAL) would quote a cell of ``text``: four substring scans in C, a
    fraction of a regex search over the same text."""
    return '"' in text or "," in text or "\n" in text or "\r" in text


def csv_head_cells(dtype: str, shape: str) -> str:
    """The Dtype and Shape cells of a CSV row, joined; ``shape`` as the module index spells it
    ("[2, 128, 256]")."""
    return f"{dtype},{_dims(shape)}"


def csv_number_cells(numbers: tuple) -> str:
    """The Min..Numel cells of a CSV row, joined, from (min, max, mean, std, nan, posinf,
    neginf, numel) with NaN for "no finite element". The debugger formats them once per tensor
    version and re-uses the text in every row naming that version, in every step (parameters)."""
    lo, hi, mean, std = numbers[:4]
    if lo == lo and hi == hi and mean == mean and std == std:  # no NaN: one format call
        return _NUMBERS_FORMAT % numbers
    return ",".join((*[_stat_cell(v) for v in numbers[:4]], *map(str, numbers[4:])))


def append_index_csv(rows: list[tuple[str, str, str, str]], step: int, rank: int | None,
                     path: str | os.PathLike, start: int) -> int:
    """Append one step's rows to a ``_summary.csv`` (creating it with its header when ``start``
    is 0); returns the next row index. Each row is (name, the Dtype..Numel cells text, direction,
    data path): the cells of SummaryRow.cells, built by the debugger without a read-back (tests
    check the result equals ``xray-summary --csv``). When no name or data path needs quoting
    (nearly always: one scan over the batch decides) each line is one f-string, as csv.writer
    would write it; otherwise every row goes through csv.writer."""
    rank_cell = _opt(rank)
    lines = []
    if start == 0:
        lines.append(",".join(CSV_COLUMNS) + "\r\n")
    if _needs_quoting("".join(map(itemgetter(0), rows)) + "".join(map(itemgetter(3), rows))):
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        for n, (name, cells, direction, data) in enumerate(rows, start):
            writer.writerow((n, step, rank_cell, name, *cells.split(","), direction, data))
        lines.append(buffer.getvalue())
    else:
        head = f",{step},{rank_cell},"
        lines += [f"{n}{head}{name},{cells},{direction},{data}\r\n"
                  for n, (name, cells, direction, data) in enumerate(rows, start)]
    with open(path, "w" if start == 0 else "a", newline="", encoding="utf-8") as f:
        f.write("".join(lines))
    return start + len(rows)


def _dims(shape: str) -> str:
    """The index's shape cell ("[2, 128, 256]") as the summary writes it ("2x128x256")."""
    return (shape[1:-1].replace(", ", "x") if shape.startswith("[") else shape) or "scalar"


def write_summary_csv(dump, path: str | os.PathLike) -> Path:
    """The ``_summary.csv`` beside a module dump, written under a temporary name then renamed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        write_csv(dump_rows(dump), f)
    os.replace(tmp, path)
    return path
