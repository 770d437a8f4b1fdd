"""The ``_summary.csv`` beside a module dump (docs/format.md, section 2): its columns and cells.

The debugger appends each step's rows as it captures them, and xray-summary writes the same
file from a dump; both spell the cells here, so the two cannot drift apart.
"""
from __future__ import annotations

import io
import os
from operator import itemgetter

from . import csv_cells
from .csv_cells import risky

#: One row per tensor: where it is, its data-range statistics, non-finite counts and data path.
CSV_COLUMNS = ("Index", "Step", "Rank", "Module", "Dtype", "Shape", "Min", "Max", "Mean", "Std",
               "NaN", "PosInf", "NegInf", "Numel", "Direction", "Data")


def _opt(v):
    return "" if v is None else v


def stat_cell(v: float | None) -> str:
    """A statistic as the CSV writes it: 9 significant digits, which round-trip every float32
    value exactly. ``None`` or NaN ("no finite element") is an empty cell; the .h5 index keeps
    the exact float64 values."""
    return "" if v is None or v != v else _STAT_FORMAT % v


_STAT_FORMAT = "%.9g"
_NUMBERS_FORMAT = ",".join([_STAT_FORMAT] * 4 + ["%d"] * 4)  # min, max, mean, std, nan, posinf, neginf, numel


def _needs_quoting(text: str) -> bool:
    """Whether csv (QUOTE_MINIMAL) would quote a cell of ``text``, or xray.dump.csv_cells change it
    (a formula, a control or bidi character: "\n" and "\r" are controls): then the row goes
    through the csv writer."""
    return '"' in text or "," in text or not text.isprintable() or risky(text)


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
    return ",".join((*[stat_cell(v) for v in numbers[:4]], *map(str, numbers[4:])))


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
    if _needs_quoting("".join(map(itemgetter(0), rows)) + "".join(map(itemgetter(3), rows))) or any(
            risky(r[0]) or risky(r[3]) for r in rows):
        buffer = io.StringIO()
        writer = csv_cells.Writer(buffer)
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
