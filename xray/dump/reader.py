"""Open a tracer dump: the columnar index of version 3 (records built on access), the JSON
records of versions 1 and 2, or, for a dump that was never finished, its journal."""
from __future__ import annotations

import gc
import json
import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import h5py
import torch

from .column_builder import columns_of
from .columns import Columns, ColumnsError, RecordSequence, Refusal, StringTable, concat
from .errors import DumpFormatError, RefusedRecordsWarning, TruncatedDumpWarning
from .index_file import IndexFile
from .model import ECHO, FORMAT_NAME, FORMAT_VERSION, MAX_NAME, Record, TensorMeta, parse_json
from .samples import usable as samples_usable
from .tensorio import check_dataset, file_inside, open_dataset, read_dataset
from .writer import INDEX, JOURNAL

__all__ = ["DumpFormatError", "RefusedRecordsWarning", "TraceDump", "TruncatedDumpWarning", "read_trace"]
# An index file's name, as dump.json gives it: a plain name in the dump folder, nothing else.
INDEX_NAME = re.compile(r"index-[A-Za-z0-9_.-]{1,200}\.h5")




def _drop_samples(records: list[Record] | None, columns: Columns | None) -> None:
    if columns is not None:
        columns.sample_n = columns.sample = None
    for r in records or ():
        for _, m in (*r.input_tensors(), *r.output_tensors()):
            if m.stats is not None:
                m.stats.sample = None


class TraceDump:
    """A recorded trace: ``.records`` in execution order, ``.columns`` (the same index as typed
    columns, for tools that scan every record), ``.header``, tensors on demand.

    A version-3 dump holds its index as columns and builds each Record when it is read
    (``records`` is a lazy sequence); older dumps hold Records, and get columns on first use."""

    def __init__(self, folder: Path, header: dict[str, Any], records: list[Record] | None, complete: bool,
                 summary: dict[str, Any] | None = None, columns: Columns | None = None,
                 refused: list[Refusal] | None = None) -> None:
        self.folder = folder
        self._refused = refused or []
        self.header = header
        if not samples_usable(header):  # drawn at other positions: comparing them compares other elements
            _drop_samples(records, columns)
        self._records = records
        self._columns = columns
        self.complete = complete
        self.summary = summary or {}
        self._files: dict[str, h5py.File] = {}

    @property
    def records(self) -> Sequence[Record]:
        if self._records is None:
            self._records = RecordSequence(self._columns)
        return self._records

    @property
    def refused(self) -> list:
        """The records the validator left out at load (``columns.Refusal``: row, seq, op, why)."""
        return self._refused or (self._columns.refused if self._columns is not None else [])

    @property
    def columns(self) -> Columns:
        if self._columns is None:
            self._columns = columns_of(self._records)
        return self._columns

    def select(self, **filters) -> Sequence[Record]:
        """The records that match ``Columns.select``'s filters (op, module, kind, direction,
        seq range), read from the columns."""
        return RecordSequence(self.columns, self.columns.select(**filters))

    @property
    def format(self) -> str:
        return FORMAT_NAME

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        state = "complete" if self.complete else "TRUNCATED"
        return f"TraceDump({str(self.folder)!r}, {len(self.records)} records, {state})"

    def has_data(self, meta: TensorMeta) -> bool:
        if meta.data is None:
            return False
        fname, _, path = meta.data.partition(":")
        f = self._file(fname)
        return f is not None and path in f

    def dataset(self, meta: TensorMeta | str) -> h5py.Dataset:
        """The HDF5 dataset behind ``meta`` (for chunked reads of large tensors)."""
        ref = meta if isinstance(meta, str) else meta.data
        if not ref:
            raise KeyError("this tensor's data was not saved (raise X_DUMP_NUM when dumping)")
        fname, _, path = ref.partition(":")
        f = self._file(fname)
        if f is None or path not in f:
            raise KeyError(f"{self.folder / fname}: no saved tensor {path!r} (truncated dump?)")
        ds = open_dataset(f, path)
        return ds if isinstance(meta, str) else check_dataset(ds, meta.shape, meta.dtype, f"{self.folder / fname}:{path}")

    def load_tensor(self, meta: TensorMeta | str) -> torch.Tensor:
        """The saved tensor for ``meta`` (or a ``file:path`` reference), on CPU."""
        return read_dataset(self.dataset(meta))

    def _file(self, fname: str) -> h5py.File | None:
        if "/" in fname or "\\" in fname or fname.startswith("."):
            raise DumpFormatError(f"{self.folder}: refusing tensor file reference {fname!r} outside the dump")
        if fname not in self._files:
            p = self.folder / fname
            if not p.exists() and not p.is_symlink():
                return None
            p = file_inside(self.folder, fname)  # a symlink out of the dump is refused, not followed
            try:
                self._files[fname] = h5py.File(p, "r")
            except OSError as e:
                raise DumpFormatError(f"{p}: corrupt tensor file ({e})") from e
        return self._files[fname]

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> "TraceDump":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_header(header: dict, where: Path) -> None:
    if not isinstance(header, dict):
        raise DumpFormatError(f"{where}: not an xray trace dump (no header object)")
    for key in ("config", "summary"):
        if header.get(key) is not None and not isinstance(header[key], dict):
            raise DumpFormatError(f"{where}: header {key!r} must be an object, got {type(header[key]).__name__}")
    if header.get("format") != FORMAT_NAME:
        raise DumpFormatError(f"{where}: not an xray trace dump (format={header.get('format')!r})")
    version = header.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise DumpFormatError(
            f"{where}: dump format version {version!r} is not supported by this xray "
            f"(reads versions 1..{FORMAT_VERSION}); upgrade xray or re-record the dump")


def _parse_records(raw: list, where: Path) -> tuple[list[Record], list[Refusal]]:
    """The JSON records that validate, and a Refusal for each one that does not (one record's
    damage never takes the rest of the dump with it)."""
    records, refused = [], []
    for i, r in enumerate(raw):
        try:
            records.append(Record.from_json(r))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            seq = r.get("seq") if isinstance(r, dict) else None
            op = r.get("op") if isinstance(r, dict) else None
            refused.append(Refusal(row=i, seq=seq if type(seq) is int else -1,
                                   op=op if isinstance(op, str) and len(op) <= MAX_NAME else None,
                                   reason=f"malformed ({str(e)[:2 * ECHO]})"))
    if refused:
        _warn(where, refused)
    return records, refused


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Suspend Python's cyclic collector while an index is built: it would walk the millions of
    fresh, acyclic objects (JSON trees, records) again and again, 2/3 of the open time at 1M
    records (tools/bench_bigdump.py); the same for tools turning column chunks into rows.
    Reference counting still frees everything. Never hold it across a yield."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def read_trace(folder: Path) -> TraceDump:
    with no_cyclic_gc():
        return _read_trace(folder)


def _read_trace(folder: Path) -> TraceDump:
    index, journal = folder / INDEX, folder / JOURNAL
    if index.exists() and not index.is_file():
        raise DumpFormatError(f"{index}: not a file")
    if index.exists():
        try:
            data = parse_json(index.read_text(encoding="utf-8"))
        except RecursionError:
            raise DumpFormatError(f"{index}: corrupt dump index (values nested too deep to be a dump)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if journal.exists():
                warnings.warn(f"{index} is corrupt ({e}); recovering records from {journal}",
                              TruncatedDumpWarning, stacklevel=3)
                return _read_journal(folder)
            raise DumpFormatError(f"{index}: corrupt dump index ({e})") from e
        _check_header(data, index)
        if data["format_version"] >= 3:
            return _read_columnar(folder, data, index)
        if not isinstance(data.get("records"), list):
            raise DumpFormatError(f"{index}: not an xray dump index (no 'records' list)")
        header = {k: v for k, v in data.items() if k not in ("records", "summary", "complete")}
        records, refused = _parse_records(data["records"], index)
        return TraceDump(folder, header, records, True, data.get("summary"), refused=refused)
    if journal.exists():
        return _read_journal(folder)
    raise DumpFormatError(f"{folder}: no {INDEX} or {JOURNAL} here; is this an xray dump folder?")


def _read_columnar(folder: Path, data: dict, index: Path) -> TraceDump:
    name = data.get("index")
    if not isinstance(name, str) or not INDEX_NAME.fullmatch(name):
        raise DumpFormatError(f"{index}: refusing index file reference {str(name)[:80]!r} (expected index-<id>.h5)")
    path = folder / name
    if not path.is_file():
        if (folder / JOURNAL).exists():
            warnings.warn(f"{path} is missing; recovering records from the journal", TruncatedDumpWarning, stacklevel=4)
            return _read_journal(folder)
        raise DumpFormatError(f"{path}: missing (the dump's index); was the folder copied only in part?")
    # The tables are read and checked now (~0.2 s at a million records): a damaged index is
    # refused by load_dump, not by whichever tool first reads it, and its error names the file.
    try:
        with IndexFile(path) as index_file:
            columns = index_file.columns()
    except ColumnsError as e:
        raise DumpFormatError(f"{path}: corrupt dump index ({e})") from None
    columns.where = str(path)
    columns.validate()
    _warn_refused(path, columns)
    header = {k: v for k, v in data.items() if k not in ("summary", "complete", "index")}
    summary = data.get("summary")
    return TraceDump(folder, header, None, True, summary if isinstance(summary, dict) else None, columns)


def _warn_refused(where: Path, columns: Columns) -> None:
    if columns.refused:
        _warn(where, columns.refused)


def _warn(where: Path, refused: list[Refusal]) -> None:
    """One warning for the records the validator left out, naming the first; `xray info` lists all."""
    more = f" and {len(refused) - 1} more" if len(refused) > 1 else ""
    warnings.warn(f"{where}: refused {len(refused)} record(s), the rest opened: {refused[0]}{more} "
                  "(xray info lists them)", RefusedRecordsWarning, stacklevel=5)


def _read_journal(folder: Path) -> TraceDump:
    journal = folder / JOURNAL
    header: dict | None = None
    by_seq: dict[int, dict] = {}
    order: list[int] = []
    bad = 0
    with open(journal, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                obj = parse_json(line)
            except (json.JSONDecodeError, RecursionError):
                bad += 1  # the last line may be cut mid-write by a kill
                continue
            if header is None:
                header = obj.get("header") if isinstance(obj, dict) else None
                if not isinstance(header, dict):
                    raise DumpFormatError(f"{journal}: first line is not a dump header")
                _check_header(header, journal)
                if header.get("format_version", 0) >= 3:
                    return _read_chunks(folder, header)
                continue
            if not isinstance(obj, dict):
                bad += 1
                continue
            if "update" in obj:
                if not all(type(obj.get(k)) is int for k in ("update", "count", "last_seq")):
                    bad += 1
                elif obj["update"] in by_seq:
                    by_seq[obj["update"]].update(count=obj["count"], last_seq=obj["last_seq"])
            elif type(obj.get("seq")) is int:
                if obj["seq"] not in by_seq:
                    order.append(obj["seq"])
                by_seq[obj["seq"]] = obj
            else:
                bad += 1
    if header is None:
        raise DumpFormatError(f"{journal}: empty journal; nothing was recorded")
    records, refused = _parse_records([by_seq[s] for s in order], journal)
    warnings.warn(
        f"{folder}: dump was not finalised (process killed before end_dump?); recovered "
        f"{len(records)} records from {JOURNAL}" + (f", skipped {bad} unreadable line(s)" if bad else ""),
        TruncatedDumpWarning, stacklevel=3)
    return TraceDump(folder, header, records, False, refused=refused)


def _read_chunks(folder: Path, header: dict) -> TraceDump:
    """A version-3 dump that was never finished: its journal chunks, in order, as one index.
    A chunk that cannot be read, or does not continue the one before, ends the recovery there."""
    chunks = sorted(folder.glob("journal-*.h5"), key=_chunk_number)
    strings = StringTable()
    parts: list[Columns] = []
    updates = []
    rows = tensors = 0
    problem = None
    for path in chunks:
        try:
            with IndexFile(path) as f:
                expect = {"first_row": rows, "first_tensor": tensors, "first_string": len(strings)}
                got = {k: f.attr(k) for k in expect}
                if got != expect:
                    raise ColumnsError(f"does not continue the chunk before it ({got} != {expect})")
                part = f.columns()
                new = part.strings.texts()
                ups = f.updates()
        except (ColumnsError, OSError) as e:
            problem = f"{path.name}: {e}"
            break
        strings.extend(new)
        parts.append(part)
        updates.append(ups)
        rows, tensors = rows + len(part.records), tensors + len(part.tensors)
    columns = concat(parts, strings)
    pos = {seq: row for row, seq in enumerate(columns.records["seq"].tolist())} if any(map(len, updates)) else {}
    for ups in updates:  # later chunks carry later counts
        if len(ups):
            for seq, count, last in ups.tolist():
                row = pos.get(seq)
                if row is not None and count >= 1 and last >= 0:
                    columns.records["count"][row], columns.records["last_seq"][row] = count, last
    columns.where = f"{folder / JOURNAL} and its chunks"
    try:
        columns.validate()
    except ColumnsError as e:
        raise DumpFormatError(str(e)) from None
    _warn_refused(folder / JOURNAL, columns)
    warnings.warn(
        f"{folder}: dump was not finalised (process killed before end_dump?); recovered "
        f"{len(columns)} records from {len(parts)} journal chunk(s)" + (f"; stopped at {problem}" if problem else ""),
        TruncatedDumpWarning, stacklevel=4)
    return TraceDump(folder, header, None, False, columns=columns)


def _chunk_number(path: Path) -> tuple[int, str]:
    stem = path.stem.rpartition("-")[2]
    return (int(stem) if stem.isdigit() else -1, path.name)
