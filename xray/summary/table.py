"""Summary rows of a dump and their two renderings: a tabulate table and a CSV pandas reads.

Rows are produced lazily from the dump's index: a module dump's tables, a trace dump's tensor
columns (format v3; older trace dumps: their records). Only the rendered strings are kept, never
tensor data, so memory grows with the number of tensors, not with their size.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Iterator

import numpy as np
from tabulate import tabulate

from ..dump.column_scan import check_records, native_columns
from ..dump.columns import ABSENT_MAX, ABSENT_MEAN, ABSENT_MIN, ABSENT_STD, DIRECTIONS, KINDS, PARAM, Columns
from ..dump.model import TensorMeta, printable, record_name
from ..dump.reader import no_cyclic_gc
from ..dump import csv_cells
from ..dump.summary_csv import CSV_COLUMNS, _needs_quoting, csv_number_cells, stat_cell

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
        name = printable(self.name)  # a dump's module names reach a terminal and a CSV
        if not csv_extra and s is not None and not s.finite:  # the table has no count columns
            name += f" [nan={s.nan} +inf={s.posinf} -inf={s.neginf}]"
        row = [index, _opt(self.step), _opt(self.rank), name, self.meta.dtype, shape_cell(self.meta.shape), *stat]
        if csv_extra:
            row += [s.nan if s else None, s.posinf if s else None, s.neginf if s else None,
                    self.meta.numel, self.direction, self.meta.data or ""]
        return row


def _opt(v: Any) -> Any:
    return "" if v is None else v


def shape_cell(shape: Iterable[int]) -> str:
    """A tensor's shape as the summary spells it: "2x3", "scalar"."""
    return "x".join(str(d) for d in shape) or "scalar"


class ColumnRow:
    """A trace dump's summary row read from its tensor columns: what SummaryRow.cells gives for
    the same tensor, without building its Record and TensorMeta."""

    __slots__ = ("_tensor", "direction", "name", "rank", "step")

    def __init__(self, step: int | None, rank: int | None, name: str, direction: str, tensor: tuple) -> None:
        self.step, self.rank, self.name, self.direction = step, rank, name, direction
        self._tensor = tensor  # (dtype, shape cell, numel, [min, max, mean, std], (nan, +inf, -inf) | None, data)

    def cells(self, index: int, csv_extra: bool) -> list[Any]:
        dtype, shape, numel, stat, counts, data = self._tensor
        name = printable(self.name)
        if not csv_extra and counts is not None and any(counts):  # as SummaryRow: not Stats.finite
            name += f" [nan={counts[0]} +inf={counts[1]} -inf={counts[2]}]"
        row = [index, _opt(self.step), _opt(self.rank), name, dtype, shape, *stat]
        if csv_extra:
            row += [*(counts or (None, None, None)), numel, self.direction, data or ""]
        return row

    def csv_line(self, index: int) -> str | None:
        """The CSV line csv.writer would write for ``cells(index, True)``, spelled directly (a
        third of the cost), or None when a text needs quoting: then csv.writer writes it."""
        dtype, shape, numel, stat, counts, data = self._tensor
        data = data or ""
        if _needs_quoting(self.name) or _needs_quoting(data):
            return None
        if counts is None:
            numbers = f",,,,,,,{numel}"  # no statistics: four empty statistics, three empty counts
        elif None in stat:
            numbers = ",".join([*map(stat_cell, stat), *map(str, counts), str(numel)])
        else:
            numbers = csv_number_cells((*stat, *counts, numel))
        return (f"{index},{_opt(self.step)},{_opt(self.rank)},{self.name},{dtype},{shape},{numbers},"
                f"{self.direction},{data}\r\n")


def dump_rows(dump, step: int | None = None) -> Iterator[SummaryRow | ColumnRow]:
    """Every tensor of a module dump (lazily, from its index; one ``step`` or all) or of a trace
    dump (from its columns, or the records of an older dump)."""
    rank = dump.header.get("global_rank", dump.header.get("rank"))
    if hasattr(dump, "rows"):  # ModuleDump
        yield from module_rows(dump.rows(step), rank)
        return
    columns = native_columns(dump)
    if columns is not None:
        yield from column_rows(columns, rank)
        return
    yield from record_rows(dump.records, rank)


def record_rows(records: Iterable, rank: int | None) -> Iterator[SummaryRow]:
    """Summary rows of trace records: each record's input then output tensors."""
    for rec in records:
        for arg, meta in rec.input_tensors():
            yield SummaryRow(rec.step, rank, f"{rec.name}.{arg}", rec.direction, meta)
        for arg, meta in rec.output_tensors():
            yield SummaryRow(rec.step, rank, f"{rec.name}.{arg}", rec.direction, meta)


CHUNK = 1 << 16  # tensor rows converted to Python values at a time: bounded memory at any size


def column_rows(columns: Columns, rank: int | None) -> Iterator[ColumnRow]:
    """``record_rows`` of a columnar index, read from its tensor table a chunk at a time: the
    record's name, the tensor's argument name, dtype, shape and statistics, each distinct string
    decoded once. A record that could not be built is refused first, as the record path would."""
    check_records(columns)
    t, r = columns.tensors, columns.records
    text = columns.strings.get  # decodes each string once, then returns it from its own cache
    tensors: dict[tuple, tuple] = {}
    for start in range(0, len(t), CHUNK):
        chunk = t[start:start + CHUNK]
        chunk = chunk[chunk["role"] != PARAM]
        if not len(chunk):
            continue
        owners = chunk["record"]
        lo = int(owners[0])
        recs = r[lo:int(owners[-1]) + 1]
        with no_cyclic_gc():
            prefix = _record_names(recs, text)
            steps = [None if s < 0 else s for s in recs["step"].tolist()]
            directions = [DIRECTIONS[d] for d in recs["direction"].tolist()]
            stats = _stat_cells(chunk)
            keys = list(zip(chunk["dtype"].tolist(), chunk["shape"].tolist(), chunk["data"].tolist()))
        for owner, arg, key, stat, counts in zip(owners.tolist(), chunk["name"].tolist(), keys, *stats):
            i = owner - lo
            head = tensors.get(key)
            if head is None:
                head = tensors[key] = _tensor_head(columns, *key)
            yield ColumnRow(steps[i], rank, f"{prefix[i]}.{text(arg)}", directions[i],
                            (head[0], head[1], head[2], stat, counts, head[3]))
        if len(tensors) > CHUNK:  # saved-data references are distinct per tensor: keep the cache small
            tensors.clear()


def _record_names(recs, text: Callable[[int], str | None]) -> list[str]:
    """``Record.name`` of each row, from the columns (``text``: a string id's text, None for -1)."""
    return [record_name(KINDS[kind], text(module), text(op), seq, call_index, DIRECTIONS[direction])
            for seq, kind, direction, op, module, call_index in zip(
                recs["seq"].tolist(), recs["kind"].tolist(), recs["direction"].tolist(), recs["op"].tolist(),
                recs["module"].tolist(), recs["call_index"].tolist())]


def _tensor_head(columns: Columns, dtype: int, shape: int, data: int) -> tuple:
    """(dtype, shape cell, numel, data) of a tensor, as SummaryRow.cells spells them."""
    dims = columns.shape(shape)
    return columns.strings[dtype], shape_cell(dims), math.prod(dims), columns.strings.get(data)


def _stat_cells(chunk) -> tuple[list, list]:
    """Per tensor row: [min, max, mean, std] (None where absent or not recorded) and the
    (nan, +inf, -inf) counts (None without statistics), as Python values: whole columns
    converted at once, then the few rows without statistics or with absent ones patched."""
    stats = np.column_stack([chunk[k] for k in ("min", "max", "mean", "std")]).tolist()
    counts = list(zip(chunk["nan"].tolist(), chunk["posinf"].tolist(), chunk["neginf"].tolist()))
    has, absent = chunk["has_stats"], chunk["absent"]
    for i in np.flatnonzero((has == 0) | (absent != 0)).tolist():
        if not has[i]:
            stats[i], counts[i] = _NO_STATS, None
        else:
            a = int(absent[i])
            stats[i] = [None if a & bit else v for bit, v in zip(_ABSENT_BITS, stats[i])]
    return stats, counts


_NO_STATS = [None] * 4
_ABSENT_BITS = (ABSENT_MIN, ABSENT_MAX, ABSENT_MEAN, ABSENT_STD)  # min, max, mean, std


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
    fast = simple_table(body, SUMMARY_COLUMNS)
    if fast is not None:
        return fast
    return tabulate(body, headers=SUMMARY_COLUMNS, tablefmt="simple", floatfmt=".6g", disable_numparse=False)


# -- tabulate's "simple" table, for plain cells, at a tenth of its cost ----------------------------------

#: The tabulate release whose algorithm ``simple_table`` reproduces (tests compare the two).
TABULATE_EMULATED = "0.10."
# A string holding any other character cannot parse as a number (int, float, "1,000", "inf").
_NOT_NUMERIC = re.compile(r"[^0-9+\-.eE,_\s]")
_NUMERIC_WORDS = frozenset(("inf", "nan", "infinity"))


def simple_table(body: list[list[Any]], headers: Iterable[str]) -> str | None:
    """``tabulate(body, headers, tablefmt="simple", floatfmt=".6g")``, or None where this cannot
    promise the same text (another tabulate release, an empty body, a cell that is not None,
    int, float or printable ASCII): the caller runs tabulate then.

    Why: tabulate infers every cell's type by trial parsing (~80 us a cell row); a summary of a
    million tensors took minutes in it. Here a column's type and format follow tabulate's rules
    (the most generic type over the column, starting from bool; ints and floats right-aligned on
    their decimal point, the rest stripped and left-aligned; a header two wider than its text)
    with Python ints and floats typed at once and only strings that could be numbers parsed by
    tabulate's own ``_type``."""
    import tabulate as tabulate_module

    if not body or not tabulate_module.__version__.startswith(TABULATE_EMULATED):
        return None
    headers = list(headers)
    columns = []
    for values, header in zip(zip(*body), headers):
        column = _simple_column(values, header, tabulate_module)
        if column is None:
            return None
        columns.append(column)
    widths = [len(c[0]) for c, _ in columns]
    lines = ["  ".join(h for _, h in columns).rstrip(), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(cells).rstrip() for cells in zip(*(c for c, _ in columns))]
    return "\n".join(lines)


def _simple_column(values: tuple, header: str, tab) -> tuple[list[str], str] | None:
    """(padded cells, padded header) of one column as tabulate pads them, or None."""
    kinds: dict[Any, type] = {}
    types = set()
    for v in values:
        t = type(v)
        if t is str and v:
            got = kinds.get(v)
            if got is None:
                if not (v.isascii() and v.isprintable()):
                    return None
                got = kinds[v] = _string_type(v, tab)
            types.add(got)
        elif t is int or t is float or v is None or v == "":
            types.add(type(None) if v is None or v == "" else t)
        else:
            return None
    kind = bool
    for t in types:
        kind = tab._more_generic(kind, t)
    cells = [_simple_format(v, kind) for v in values]
    minwidth = len(header) + 2  # tabulate's MIN_PADDING beside a header
    if kind is int or kind is float:
        decimals = [_afterpoint(s, v, tab) for s, v in zip(cells, values)]
        most = max(decimals)
        cells = [s + (most - d) * " " for s, d in zip(cells, decimals)]
        width = max(minwidth, max(map(len, cells)))
        return [s.rjust(width) for s in cells], header.rjust(width)
    cells = [s.strip() for s in cells]
    width = max(minwidth, max(map(len, cells)))
    return [s.ljust(width) for s in cells], header.ljust(width)


def _string_type(v: str, tab) -> type:
    """tabulate's type of a non-empty printable ASCII string; most are plainly text."""
    if _NOT_NUMERIC.search(v) and v.strip().lstrip("+-").lower() not in _NUMERIC_WORDS and v not in ("True", "False"):
        return str
    return tab._type(v, False, True)


def _simple_format(v: Any, kind: type) -> str:
    """tabulate's ``_format`` of a None, int, float or plain string cell, missing value ""."""
    if v is None or v == "":
        return ""
    if kind is float:
        if type(v) is str:
            v = v.replace(",", "")  # thousands separators
        try:
            return format(float(v), ".6g")
        except ValueError:  # "True" in a column of floats
            return v
    return v if type(v) is str else str(v)


def _afterpoint(s: str, v: Any, tab) -> int:
    """tabulate's ``_afterpoint`` (characters after the decimal point, -1 for none) of a cell
    formatted from ``v``: worked out directly for ``str(int)`` and ``.6g`` texts."""
    if type(v) is str:
        return tab._afterpoint(s)
    if not s:
        return -1
    if "." in s:
        return len(s) - s.rfind(".") - 1
    if "e" in s:
        return len(s) - s.rfind("e") - 1
    return -1  # integral ("12345", "-0"), "inf", "nan"


def write_csv(rows: Iterable[SummaryRow], out: IO[str], *, header: bool = True, start: int = 0) -> int:
    w = csv_cells.Writer(out)
    if header:
        w.writerow(CSV_COLUMNS)
    n = 0
    for i, r in enumerate(rows, start):
        line = r.csv_line(i) if type(r) is ColumnRow else None
        if line is not None:
            out.write(line)
            n += 1
            continue
        cells = r.cells(i, csv_extra=True)
        cells[6:10] = [stat_cell(v) for v in cells[6:10]]
        w.writerow(["" if v is None else v for v in cells])
        n += 1
    return n
