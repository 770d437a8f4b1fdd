"""The columnar index on disk (trace format v3): ``index.h5``, and the journal's chunk files.

One HDF5 file holds four byte datasets: ``records`` and ``tensors``, each the columns of
``xray.dump.columns`` back to back (column after column, in the dtype's field order, each one
contiguous: reading a table is one copy, and each column is a view of it), and the string table
(``strings``: UTF-8 bytes, ``string_ends``: the end offset of each string). Four datasets, not
one per column: a file costs ~1 ms to write whatever its size, which matters at every flush.
``load_dump`` opens the file once, reads the tables whole (``IndexFile.columns``) and checks them
(``Columns.validate``). A journal chunk has the same datasets for the records of one flush, only
the strings new since the chunk before, and an ``updates`` table (de-duplicated records whose
count grew). Both may hold a ``folds`` table: the calls de-dup folded, one row each
(``columns.FOLD_DTYPE``), the tensor rows' samples (``sample_n``, ``sample``, attribute
``sample_size``) and self-checks (``check``: CHECK_SIZE float64 a row, NaN where none): optional,
a dump without them reads as before.

Files are built in memory and written with plain file I/O under a temporary name, then renamed:
a file on disk is always whole, and a full disk raises OSError instead of crashing HDF5. A
writer's final index, which can be gigabytes, is written from its journal chunks a batch at a
time instead (``write_index_parts``), to the same layout.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import h5py
import numpy as np

from .columns import (FOLD_DTYPE, RECORD_DTYPE, TENSOR_DTYPE, UPDATE_DTYPE, Columns, ColumnsError, StringTable, Table,
                      concat)
from .model import CHECK_SIZE, SAMPLE_SIZE
from .errors import DumpFormatError
from .tensorio import file_inside, open_dataset

LAYOUT = "xray-trace-index"  # the file's ``layout`` attribute
LAYOUT_VERSION = 1


def write_file(path: Path, records: Table, tensors: Table, blob: np.ndarray, ends: np.ndarray,
               attrs: dict, updates: np.ndarray | None = None, folds: np.ndarray | None = None,
               samples: tuple[np.ndarray, np.ndarray] | None = None, checks: np.ndarray | None = None) -> None:
    """Write one index or chunk file atomically (tmp + rename); OSError on failure, no file left.
    ``samples``: the tensor rows' (sample_n, sample) columns, where the records have them;
    ``checks``: their self-check column, where any has one."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.attrs["layout"] = LAYOUT
        f.attrs["layout_version"] = LAYOUT_VERSION
        for k, v in attrs.items():
            f.attrs[k] = v
        for name, table in (("records", records), ("tensors", tensors)):
            f.create_dataset(name, data=pack(table))
            f[name].attrs["rows"] = len(table)
        f.create_dataset("strings", data=blob)
        f.create_dataset("string_ends", data=ends)
        if updates is not None:
            f.create_dataset("updates", data=updates)
        if folds is not None and len(folds):
            f.create_dataset("folds", data=folds)
        if samples is not None:
            f.attrs["sample_size"] = SAMPLE_SIZE
            f.create_dataset("sample_n", data=np.ascontiguousarray(samples[0], dtype=np.uint8))
            f.create_dataset("sample", data=np.ascontiguousarray(samples[1], dtype="<f8").reshape(-1))
        if checks is not None:
            f.create_dataset("check", data=np.ascontiguousarray(checks, dtype="<f8").reshape(-1))
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(buffer.getbuffer())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _padded(nbytes: int) -> int:
    return -(-nbytes // 8) * 8  # every column starts 8-byte aligned: no unaligned int64 views


def table_bytes(dtype: np.dtype, rows: int) -> int:
    return sum(_padded(rows * dtype[c].itemsize) for c in dtype.names)


def pack(table: Table) -> np.ndarray:
    """The table's columns back to back as bytes, each padded to a multiple of 8."""
    out = np.zeros(table_bytes(table.dtype, len(table)), np.uint8)
    at = 0
    for c in table.dtype.names:
        raw = np.ascontiguousarray(table[c], dtype=table.dtype[c]).view(np.uint8)
        out[at:at + len(raw)] = raw
        at += _padded(len(raw))
    return out


def unpack(blob: np.ndarray, dtype: np.dtype, rows: int) -> Table:
    """Views of each column inside ``blob`` (no copy): column after column, in field order."""
    columns, at = {}, 0
    for c in dtype.names:
        size = rows * dtype[c].itemsize
        columns[c] = blob[at:at + size].view(dtype[c])
        at += _padded(size)
    return Table(dtype, columns)


@dataclass(frozen=True)
class IndexSize:
    """What an index will hold, known before its rows are read (``write_index_parts``)."""

    records: int
    tensors: int
    folds: int
    samples: bool  # any part has samples: the others' rows get none (sample_n 0)
    checks: bool = False  # any part has self-checks: the others' rows get none (NaN)


BATCH_ROWS = 1 << 16  # rows (records, tensors, folds) gathered before a write: under 26 MB with samples


def write_index(path: Path, columns: Columns) -> None:
    """Write ``columns`` as an index file (``write_index_parts`` of one part)."""
    write_index_parts(path, [columns], columns.strings,
                      IndexSize(len(columns.records), len(columns.tensors), len(columns.folds),
                                columns.sample_n is not None, columns.check is not None))


def write_index_parts(path: Path, parts: Iterable[Columns], strings: StringTable, size: IndexSize) -> None:
    """Write an index whose rows arrive as ``parts`` (Columns sharing ``strings``, in order),
    holding a batch of them at a time: a writer's final index comes from its journal chunks, so
    that a recording of any length closes in memory bounded by its flush size. Atomic (tmp +
    rename); OSError on failure.

    Why not an image in memory as ``write_file``: the index can be gigabytes. HDF5 writes here
    through a Python file object (h5py's fileobj driver), so a full disk raises OSError there
    instead of failing inside HDF5's own I/O."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w+b") as out:
            sink = _Sink(out)
            try:
                _write_parts(sink, path, parts, strings, size)
            except Exception as e:
                if sink.error is not None:  # HDF5 says "driver write request failed": say why
                    raise sink.error from e
                raise
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class _Sink:
    """The index file as h5py's fileobj driver writes it, keeping the first error of a write
    (a full disk), which HDF5 reports only as a failed driver request."""

    def __init__(self, file) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name: str):  # seek, tell, truncate, readinto, flush
        return getattr(self.file, name)


def _write_parts(out: _Sink, path: Path, parts: Iterable[Columns], strings: StringTable, size: IndexSize) -> None:
    """The index file's datasets, the parts' rows written into them batch by batch."""
    with h5py.File(out, "w") as f:
        f.attrs["layout"] = LAYOUT
        f.attrs["layout_version"] = LAYOUT_VERSION
        f.attrs["records"] = size.records
        sinks = {}
        for name, dtype, rows in (("records", RECORD_DTYPE, size.records), ("tensors", TENSOR_DTYPE, size.tensors)):
            sinks[name] = f.create_dataset(name, shape=(table_bytes(dtype, rows),), dtype=np.uint8)
            sinks[name].attrs["rows"] = rows
        blob, ends = strings.to_arrays()
        f.create_dataset("strings", data=blob)
        f.create_dataset("string_ends", data=ends)
        del blob, ends
        folds = f.create_dataset("folds", shape=(size.folds,), dtype=FOLD_DTYPE) if size.folds else None
        if size.samples:
            f.attrs["sample_size"] = SAMPLE_SIZE
            sample_n = f.create_dataset("sample_n", shape=(size.tensors,), dtype=np.uint8)
            sample = f.create_dataset("sample", shape=(size.tensors * SAMPLE_SIZE,), dtype="<f8")
        if size.checks:
            check = f.create_dataset("check", shape=(size.tensors * CHECK_SIZE,), dtype="<f8", fillvalue=np.nan)
        at = {"records": 0, "tensors": 0, "folds": 0}
        for batch in _batches(parts, strings):
            _put_rows(sinks["records"], batch.records, at["records"], size.records)
            _put_rows(sinks["tensors"], batch.tensors, at["tensors"], size.tensors)
            if len(batch.folds):
                folds[at["folds"]:at["folds"] + len(batch.folds)] = batch.folds
            if size.samples and batch.sample_n is not None:
                first, n = at["tensors"], len(batch.tensors)
                sample_n[first:first + n] = batch.sample_n
                sample[first * SAMPLE_SIZE:(first + n) * SAMPLE_SIZE] = batch.sample.reshape(-1)
            if size.checks and batch.check is not None:
                first, n = at["tensors"], len(batch.tensors)
                check[first * CHECK_SIZE:(first + n) * CHECK_SIZE] = batch.check.reshape(-1)
            for name, table in (("records", batch.records), ("tensors", batch.tensors), ("folds", batch.folds)):
                at[name] += len(table)
        if (at["records"], at["tensors"], at["folds"]) != (size.records, size.tensors, size.folds):
            raise ValueError(f"{path.name}: the parts held {at}, not {size}")


def _batches(parts: Iterable[Columns], strings: StringTable) -> Iterator[Columns]:
    """``parts`` joined into batches of about ``BATCH_ROWS`` rows (fewer, larger writes)."""
    batch: list[Columns] = []
    rows = 0
    for part in parts:
        batch.append(part)
        rows += len(part.records) + len(part.tensors) + len(part.folds)
        if rows >= BATCH_ROWS:
            yield concat(batch, strings)
            batch, rows = [], 0
    if batch:
        yield concat(batch, strings)


def _put_rows(sink: h5py.Dataset, table: Table, first: int, rows: int) -> None:
    """Rows ``first:first + len(table)`` of a packed table of ``rows`` rows (``pack``'s layout:
    column after column, each padded to 8 bytes, so a column's slice lies at a known offset)."""
    at = 0
    for c in table.dtype.names:
        width = table.dtype[c].itemsize
        if len(table):
            raw = np.ascontiguousarray(table[c], dtype=table.dtype[c]).view(np.uint8)
            sink[at + first * width:at + (first + len(table)) * width] = raw
        at += _padded(rows * width)


class IndexFile:
    """An open index or chunk file; tables are read on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            real = file_inside(path.parent, path.name)  # never a symlink out of the dump, a FIFO...
        except DumpFormatError as e:
            raise ColumnsError(str(e).replace(f"{path}: ", "")) from None
        try:
            self.file = h5py.File(real, "r")
        except OSError as e:
            raise ColumnsError(f"not a readable HDF5 file ({e})") from None
        if self.file.attrs.get("layout") != LAYOUT:
            self.file.close()
            raise ColumnsError(f"not an xray trace index (layout={self.file.attrs.get('layout')!r})")
        version = self.file.attrs.get("layout_version")
        if not isinstance(version, (int, np.integer)) or not 1 <= version <= LAYOUT_VERSION:
            self.file.close()
            raise ColumnsError(f"index layout version {version!r} is newer than this xray reads; upgrade xray")

    def array(self, name: str, dtype: np.dtype, expect: int | None = None) -> np.ndarray:
        """One 1-D dataset of exactly ``dtype`` (links, external storage, filters and sizes the
        file cannot hold refused: ``open_dataset``), of ``expect`` values when that is known."""
        try:
            ds = open_dataset(self.file, name)
        except (KeyError, ValueError) as e:
            raise ColumnsError(f"no {name!r} column ({e})") from None
        if ds.dtype != dtype or ds.ndim != 1:
            raise ColumnsError(f"column {name!r} is {ds.dtype} of {ds.ndim} dimensions (expected 1-D {dtype})")
        if expect is not None and ds.shape[0] != expect:
            raise ColumnsError(f"column {name!r} holds {ds.shape[0]} values, its header says {expect}")
        try:
            return ds[()]
        except (OSError, ValueError) as e:
            raise ColumnsError(f"column {name!r} is unreadable ({e})") from None

    def table(self, name: str, dtype: np.dtype) -> Table:
        try:
            rows = self.file[name].attrs.get("rows") if name in self.file else None
        except (OSError, RuntimeError, KeyError) as e:
            raise ColumnsError(f"table {name!r} is unreadable ({e})") from None
        if not isinstance(rows, (int, np.integer)) or rows < 0:
            raise ColumnsError(f"table {name!r}: its rows attribute is {rows!r}")
        blob = self.array(name, np.dtype(np.uint8), expect=table_bytes(dtype, int(rows)))
        return unpack(blob, dtype, int(rows))

    def columns(self) -> Columns:
        """The records and tensors tables and the string table, read whole (not yet validated)."""
        columns = Columns(self.table("records", RECORD_DTYPE), self.table("tensors", TENSOR_DTYPE), self.strings())
        if "folds" in self.file:  # optional: a table that cannot be read is left out, the records open
            try:
                columns.folds = self.array("folds", FOLD_DTYPE)
            except ColumnsError as e:
                columns.folds_problem = str(e)
        if "sample_n" in self.file or "sample" in self.file or "sample_size" in self.file.attrs:
            # optional, but never half there or of another shape: the whole index is refused
            size = self.file.attrs.get("sample_size")
            if not isinstance(size, (int, np.integer)) or size != SAMPLE_SIZE:
                raise ColumnsError(f"sample_size is {size!r}, this xray reads {SAMPLE_SIZE}")
            rows = len(columns.tensors)
            columns.sample_n = self.array("sample_n", np.dtype(np.uint8), expect=rows)
            columns.sample = self.array("sample", np.dtype("<f8"), expect=rows * SAMPLE_SIZE).reshape(rows, SAMPLE_SIZE)
        if "check" in self.file:  # optional, but never of another shape: the whole index is refused
            rows = len(columns.tensors)
            columns.check = self.array("check", np.dtype("<f8"), expect=rows * CHECK_SIZE).reshape(rows, CHECK_SIZE)
        return columns

    def strings(self) -> StringTable:
        return StringTable.from_arrays(self.array("strings", np.dtype(np.uint8)),
                                       self.array("string_ends", np.dtype("<i8")))

    def updates(self) -> np.ndarray:
        """A journal chunk's changed de-dup counts (none when absent), read like any column."""
        return self.array("updates", UPDATE_DTYPE) if "updates" in self.file else np.zeros(0, UPDATE_DTYPE)

    def attr(self, name: str, default=None):
        return self.file.attrs.get(name, default)

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "IndexFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
