"""Crash-safe dump writer: a journal of closed chunk files, closed HDF5 segments, a final index.

Why this shape: an HDF5 file that is open when the process is SIGKILLed can be unreadable as a
whole. So every file is written complete under a temporary name and renamed into place: tensors
go into segment files, and at each flush the records since the last one go into a journal chunk
(``journal-<pid>-<token>-<n>.h5``: their columns, the strings new since the chunk before, and the
changed counts of de-duplicated records). ``close()`` writes the columnar ``index.h5`` of every
record and then ``dump.json`` (the header), and removes the journal. A dump without
``dump.json`` is a truncated one, and the reader rebuilds it from the journal (docs/format.md).

Memory follows the flush size, not the length of the recording: a chunk's rows leave memory
once its file is written, and the index is written from the chunk files, a batch at a time
(``index_file.write_index_parts``). What stays is what later records need: the string table
(distinct texts) and the counts of de-duplicated records (one per distinct call).
"""
from __future__ import annotations

import io
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import h5py
import numpy as np
import torch

from .dispatch_modes import no_dispatch_modes
from .column_builder import ColumnBuilder
from .columns import FOLD_DTYPE, NONE, UPDATE_DTYPE, Columns, ColumnsError, StringTable, Table, concat
from .critical import critical_section
from .index_file import IndexFile, IndexSize, write_file, write_index_parts
from .model import FORMAT_NAME, FORMAT_VERSION, Record
from .samples import SCHEME as SAMPLE_SCHEME, SCHEME_KEY as SAMPLE_SCHEME_KEY
from .tensorio import write_dataset

JOURNAL = "journal.jsonl"  # the header line of an unfinished dump (its records are in chunk files)
INDEX = "dump.json"
FLUSH_BYTES = 256 << 20  # default cap on tensor bytes held in memory before a segment is written


def _encode(obj: Any) -> str:
    """Compact JSON; a value JSON cannot hold (a symbolic size) is written as its text rather
    than losing the whole header."""
    return json.dumps(obj, separators=(",", ":"), default=str)


def _count_table(counts: dict[int, tuple[int, int]]) -> np.ndarray:
    """(seq, count, last_seq) of de-duplicated records as UPDATE_DTYPE rows, sorted by seq."""
    table = np.array([(seq, count, last) for seq, (count, last) in counts.items()], dtype=UPDATE_DTYPE)
    return table[np.argsort(table["seq"], kind="stable")]


def _set_counts(records: Table, counts: np.ndarray) -> None:
    """Write the latest (count, last_seq) of de-duplicated records (``_count_table``) into their rows."""
    if not len(counts) or not len(records):
        return
    seqs = records["seq"]
    at = np.minimum(np.searchsorted(counts["seq"], seqs), len(counts) - 1)
    hit = counts["seq"][at] == seqs
    records["count"][hit] = counts["count"][at[hit]]
    records["last_seq"][hit] = counts["last_seq"][at[hit]]


FOLDS_FLUSH = 4 * 65536  # ints in DumpWriter.folds (64k folded calls, ~9 MB as Python ints) that flush


class Fold:
    """The count of a de-duplicated record: the calls folded into it so far (``count``, the
    record's own included) and the last one's seq. The recorder bumps it; the writer reads it at
    flush (``dirty``: registered with ``count_changed`` since the last flush)."""

    __slots__ = ("seq", "count", "last", "writes", "dirty")

    def __init__(self, seq: int, writes: bool = False) -> None:
        self.seq, self.count, self.last, self.writes, self.dirty = seq, 1, seq, writes, False


class DumpWriteError(OSError):
    """The dump folder cannot be written (unwritable path, full disk...)."""


@dataclass(slots=True)
class _Part:
    """One flush's rows of the final index: the journal chunk file that holds them, or the rows
    themselves where no file holds them (close()'s last flush, a chunk the disk refused)."""

    file: str | None
    columns: Columns | None
    records: int
    tensors: int
    folds: int
    samples: bool
    checks: bool = False


class DumpWriter:
    def __init__(self, folder: Path, header: dict[str, Any], *, flush_records: int = 4096,
                 flush_seconds: float = 1.0, flush_bytes: int = FLUSH_BYTES) -> None:
        self.folder = Path(folder)
        self.header = dict(header, format=FORMAT_NAME, format_version=FORMAT_VERSION)
        self.header[SAMPLE_SCHEME_KEY] = SAMPLE_SCHEME  # how its samples' positions were drawn
        self.flush_records = flush_records
        self.flush_seconds = flush_seconds
        self.flush_bytes = flush_bytes
        self.pending_bytes = 0  # bytes of queued tensor copies, bounded by flush_bytes + one tensor
        self.peak_pending_bytes = 0
        # Segment names are unique per writer (pid + random token): a forked child, or a second
        # writer on the same folder, can never replace a segment this writer's records point to.
        self.pid = os.getpid()
        self._prefix = f"tensors-{self.pid}-{secrets.token_hex(4)}"
        # De-duplicated records whose count grew: since the last chunk (read at flush), and since
        # the start (seq -> Fold).
        self._dirty: list[Fold] = []
        self._touched: dict[int, Fold] = {}
        # The folded calls since the last flush, four ints each (FOLD_DTYPE's fields): appended
        # by the recorder (folded), and by its C path straight into this same list.
        self.folds: list[int] = []
        self.folds_flush = FOLDS_FLUSH
        # Every record, as column chunks sharing one string table: records become rows as they
        # arrive (the pending chunk's builder), each flush's rows a part, and the index is
        # written from the parts (read back from their journal chunks: see the module docstring).
        self._strings = StringTable()
        self._builder = ColumnBuilder(self._strings)
        self._parts: list[_Part] = []
        self._lost: list[str] = []  # "<segment>:" of segments not written (_forget_segment)
        self._rows = self._tensor_rows = 0
        self._strings_in_journal = 0
        self._chunk = 0
        self._unjournaled: Columns | None = None  # converted by close(), not in a chunk file
        self._last_chunk: tuple | None = None  # write_file's arguments of the last chunk written
        self._snapshots = 0
        self._tensors: list[tuple[str, torch.Tensor]] = []  # (dataset path, data)
        self._segment = 0
        self._last_flush = time.monotonic()
        # Called at the start of every flush, before records are encoded: the recorder resolves
        # what it deferred (statistics computed on the device, copied to the host once per flush).
        self.before_flush: Callable[[], None] | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for stale in (INDEX, JOURNAL):
                (self.folder / stale).unlink(missing_ok=True)
            for old in (*self.folder.glob("tensors-*.h5"), *self.folder.glob("journal-*.h5"),
                        *self.folder.glob("index-*.h5")):
                old.unlink()
            self._journal = open(self.folder / JOURNAL, "w", encoding="utf-8")
            self._journal.write(json.dumps({"header": self.header}) + "\n")
            self._journal.flush()
        except OSError as e:
            raise DumpWriteError(f"cannot write dump folder {self.folder}: {e.strerror or e}") from e

    # -- called by the tracer -----------------------------------------------------------
    @property
    def strings(self) -> StringTable:
        """The texts every row refers to (the recorder's row path interns its own into it)."""
        return self._strings

    def add(self, record: Record) -> None:
        self._builder.add(record)
        self._maybe_flush()

    def add_rows(self, record: tuple, layouts: list[tuple], stats: list, sources: list[tuple],
                 roles: tuple[int, ...], names: tuple[int, ...], notes: dict[int, int] | None = None,
                 data: dict[int, int] | None = None, checks: dict[int, tuple[float, ...]] | None = None) -> None:
        """A record already as index cells (ColumnBuilder.add_rows): the recorder's row path. Its
        common call in C (xray/record/_fastpath.c) appends the same cells to the builder's
        ``row_lists`` itself and applies ``_maybe_flush``'s rule: change both together."""
        self._builder.add_rows(record, layouts, stats, sources, roles, names, notes, data, checks)
        self._maybe_flush()

    def count_changed(self, fold: "Fold") -> None:
        """``fold``'s count grew since the last flush. The caller sets ``fold.dirty`` and calls
        this once until the next flush, which reads the count then: a folded call only counts."""
        self._dirty.append(fold)

    def folded(self, seq: int, record: int, src_seq: int, src_k: int) -> None:
        """Call ``seq`` was folded into ``record``; its first argument is ``op:<src_seq>:<src_k>``
        (-1, -1: not an op's output). Kept so that data edges through unrecorded calls can be
        followed. The C path appends the same four ints to ``folds`` itself, and calls
        ``folds_full`` on the same rule: change both together."""
        self.folds += (seq, record, src_seq, src_k)
        if len(self.folds) >= self.folds_flush or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.folds_full()

    def folds_full(self) -> None:
        """Folded calls are due (``folds_flush`` ints of them, or the flush timer's second): a
        de-dup'd loop makes no new record to flush them, nor the records and counts before them."""
        self.flush()

    def _take_folds(self) -> np.ndarray:
        folds = np.array(self.folds, dtype=np.int64).view(FOLD_DTYPE)  # four int64 fields a row
        self.folds.clear()  # the same list object: the C path appends to it
        return folds

    def save_tensor(self, record: Record | int, arg: str, t: torch.Tensor) -> str:
        """Queue a copy of ``t`` for the current segment; return its data reference.
        ``record``: the record, or its seq (the recorder's row path has no Record)."""
        nbytes = t.numel() * t.element_size()
        if self._tensors and self.pending_bytes + nbytes > self.flush_bytes:
            self.flush()  # bound memory by bytes, not only by time (the records first, as always)
        path = f"r{record if type(record) is int else record.seq}/{arg}"
        self._tensors.append((path, t))
        self.pending_bytes += nbytes
        self.peak_pending_bytes = max(self.peak_pending_bytes, self.pending_bytes)
        return f"{self._segment_name()}:{path}"

    def _segment_name(self) -> str:
        return f"{self._prefix}-{self._segment:05d}.h5"

    def _maybe_flush(self) -> None:
        if len(self._builder) >= self.flush_records or (
            time.monotonic() - self._last_flush >= self.flush_seconds
        ):
            self.flush()

    @property
    def closed(self) -> bool:
        return self._journal.closed

    def _foreign(self) -> bool:
        """A forked child inherits this writer; only the process that opened it writes."""
        return os.getpid() != self.pid

    def flush(self, *, journal: bool = True) -> None:
        """Write the records since the last flush as a journal chunk (with the changed counts of
        de-duplicated records), then their queued tensors as one closed segment. ``journal=False``
        converts the records without writing the chunk file (close() writes the whole index
        right after).

        The records first: a chunk is small and quick, a segment can be hundreds of MB, and a
        kill while it is written must not take the records with it (the 1 s promise). Until
        the segment is on disk, the chunk's records name tensors it does not yet hold (the
        chunk's ``segment`` attribute says which file they wait for); a reader finds them
        missing, as it does for a segment a full disk refused."""
        if self._foreign():
            return
        with critical_section():
            if self.before_flush is not None:
                self.before_flush()
            self._write_journal(journal)
            lost = self._write_segment()
            if lost is not None:
                self._rewrite_last_chunk()
            self._raise_lost(lost)

    def _raise_lost(self, lost: OSError | None) -> None:
        if lost is not None:
            raise DumpWriteError(f"cannot write to dump folder {self.folder}: {lost.strerror or lost}; "
                                 "the tensors of the last records were not saved") from lost

    def _write_segment(self) -> OSError | None:
        """Write the queued tensors as one closed segment; on failure, remove the partial file,
        drop the data references to it, and return the error."""
        if not self._tensors:
            return None
        name = self._segment_name()
        tmp = self.folder / (name + ".tmp")
        try:
            # Build the HDF5 image in memory and write it with plain file I/O: when HDF5's
            # own writes fail (full disk) h5py can crash the process instead of raising.
            buffer = io.BytesIO()
            with no_dispatch_modes(), h5py.File(buffer, "w") as f:  # never recorded, even inside a dump
                for path, t in self._tensors:
                    write_dataset(f, path, t)
            with open(tmp, "wb") as out:
                out.write(buffer.getbuffer())
            os.replace(tmp, self.folder / name)
        except OSError as e:
            tmp.unlink(missing_ok=True)  # give the space back to the journal
            self._forget_segment(name)
            return e
        except BaseException:
            tmp.unlink(missing_ok=True)
            self._forget_segment(name)
            raise
        finally:
            self._tensors.clear()
            self.pending_bytes = 0
            self._segment += 1
        return None

    def _forget_segment(self, name: str) -> None:
        """Drop the data references into a segment that was not written: from the records still
        pending, and from the chunks already made (their journal files keep naming it: a reader
        finds it missing)."""
        prefix = name + ":"
        self._builder.drop_data(prefix)
        self._lost.append(prefix)  # and from chunks read back for the index (_read_part)
        held = [part.columns.tensors for part in self._parts if part.columns is not None]
        if self._last_chunk is not None:  # rewritten without them by _rewrite_last_chunk
            held.append(self._last_chunk[2])
        for tensors in held:
            self._drop_data(tensors, (prefix,))

    def _drop_data(self, tensors: Table, prefixes: tuple[str, ...]) -> None:
        data = tensors["data"]
        ids = [i for i in np.unique(data).tolist() if i != NONE and self._strings[i].startswith(prefixes)]
        if ids:
            data[np.isin(data, ids)] = NONE

    def _write_journal(self, to_disk: bool) -> None:
        updates = {}
        for fold in self._dirty:
            updates[fold.seq] = (fold.count, fold.last)
            self._touched[fold.seq] = fold
            fold.dirty = False
        self._dirty.clear()
        folds = self._take_folds()
        if len(self._builder):
            chunk = self._builder.build()
            _set_counts(chunk.records, _count_table(updates))
            chunk.folds = folds
            self._rows += len(chunk.records)
            self._tensor_rows += len(chunk.tensors)
            self._builder = ColumnBuilder(self._strings, self._rows, self._tensor_rows)
        elif len(folds):  # only folded calls since the last flush
            chunk = concat([], self._strings)
            chunk.folds = folds
        else:
            chunk = None
        part = None
        if chunk is not None:
            part = _Part(None, chunk, len(chunk.records), len(chunk.tensors), len(chunk.folds),
                         chunk.sample_n is not None, chunk.check is not None)
            self._parts.append(part)
        self._unjournaled = None if to_disk else chunk
        if to_disk and (chunk is not None or updates):
            name = self._write_chunk(chunk, updates)
            if part is not None:  # on disk now: its rows leave memory (read back by _final_parts)
                part.file, part.columns = name, None
        self._last_flush = time.monotonic()

    def _write_chunk(self, chunk: Columns | None, counts: dict[int, tuple[int, int]]) -> str:
        """The records since the last chunk, the strings new since then, the changed counts;
        returns the chunk file's name."""
        first_string = self._strings_in_journal
        blob, ends = self._strings.to_arrays(first_string)
        updates = np.array([(seq, count, last) for seq, (count, last) in counts.items()], dtype=UPDATE_DTYPE)
        if chunk is None:
            chunk = concat([], self._strings)
        name = f"journal-{self._prefix.removeprefix('tensors-')}-{self._chunk:05d}.h5"
        attrs = {"chunk": self._chunk, "first_row": self._rows - len(chunk.records),
                 "first_tensor": self._tensor_rows - len(chunk.tensors), "first_string": first_string}
        if self._tensors:
            attrs["segment"] = self._segment_name()  # written after this chunk: its tensors may lag
        self._last_chunk = (self.folder / name, chunk.records, chunk.tensors, blob, ends, attrs, updates, chunk.folds,
                            chunk.samples(), chunk.check)
        try:
            write_file(self.folder / name, chunk.records, chunk.tensors, blob, ends, attrs, updates=updates,
                       folds=chunk.folds, samples=chunk.samples(), checks=chunk.check)
        except OSError as e:
            raise DumpWriteError(f"cannot write to dump folder {self.folder}: {e.strerror or e}") from e
        self._chunk += 1
        self._strings_in_journal = len(self._strings)
        return name

    def _rewrite_last_chunk(self) -> None:
        """The segment the last chunk's records wait for was not written: the chunk again,
        without their references to it (``_forget_segment`` dropped them), where the disk lets it."""
        if self._last_chunk is None or "segment" not in self._last_chunk[5]:
            return
        path, records, tensors, blob, ends, attrs, updates, folds, samples, checks = self._last_chunk
        attrs = {k: v for k, v in attrs.items() if k != "segment"}
        try:
            write_file(path, records, tensors, blob, ends, attrs, updates=updates, folds=folds, samples=samples,
                       checks=checks)
        except OSError:
            pass  # the chunk keeps naming the missing segment: a reader finds the tensors missing
        self._last_chunk = None

    def _final_parts(self) -> Iterator[Columns]:
        """Every record flushed so far, part by part, with the final counts of de-duplicated ones."""
        counts = _count_table(self._final_counts())
        for part in self._parts:
            columns = part.columns if part.columns is not None else self._read_part(part)
            _set_counts(columns.records, counts)
            yield columns

    def _read_part(self, part: _Part) -> Columns:
        path = self.folder / part.file
        try:
            with IndexFile(path) as f:
                columns = f.columns()
        except (ColumnsError, OSError) as e:
            raise DumpWriteError(f"cannot read back journal chunk {path} to write the index: {e}") from e
        if (len(columns.records), len(columns.tensors), len(columns.folds)) != (part.records, part.tensors, part.folds):
            raise DumpWriteError(f"journal chunk {path} changed since it was written; the index is not "
                                 "written from it (the journal stays, and the reader recovers from it)")
        if self._lost:
            self._drop_data(columns.tensors, tuple(self._lost))
        return columns

    def _index_size(self) -> IndexSize:
        return IndexSize(self._rows, self._tensor_rows, sum(p.folds for p in self._parts),
                         any(p.samples for p in self._parts), any(p.checks for p in self._parts))

    def _final_counts(self) -> dict[int, tuple[int, int]]:
        return {seq: (f.count, f.last) for seq, f in self._touched.items()}

    def close(self, summary: dict[str, Any]) -> Path:
        """Flush, write index.h5 and dump.json atomically, and return the dump folder."""
        with critical_section():
            try:
                self.flush(journal=False)  # index.h5, written next, holds them
                folder = self.snapshot(summary)
            except BaseException:
                self._write_chunk_after_failure()
                raise
            finally:
                self._journal.close()
            self._remove_journal()
        return folder

    def _write_chunk_after_failure(self) -> None:
        """close() could not write the index: the records it converted for it go to the journal
        after all (when the disk lets them), so the dump stays readable from there."""
        if self._unjournaled is not None:
            try:
                self._write_chunk(self._unjournaled, self._final_counts())
            except DumpWriteError:
                pass
            self._unjournaled = None

    def _remove_journal(self) -> None:
        (self.folder / JOURNAL).unlink(missing_ok=True)  # index.h5 now holds all of it
        for chunk in self.folder.glob(f"journal-{self._prefix.removeprefix('tensors-')}-*.h5"):
            chunk.unlink(missing_ok=True)

    def snapshot(self, summary: dict[str, Any]) -> Path:
        """Write index.h5 and dump.json for everything flushed so far (each atomically: tmp + rename)."""
        if self._foreign():
            raise DumpWriteError(f"not writing {self.folder / INDEX}: the dump belongs to process "
                                 f"{self.pid}, not to this forked child")
        # A new index file per snapshot: until dump.json names it, the previous dump.json and
        # the index it names stay whole and agree.
        name = f"index-{self._prefix.removeprefix('tensors-')}-{self._snapshots:03d}.h5"
        head = _encode(dict(self.header, complete=True, summary=summary, index=name))
        tmp = self.folder / (INDEX + ".tmp")
        try:
            write_index_parts(self.folder / name, self._final_parts(), self._strings, self._index_size())
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(head)
            os.replace(tmp, self.folder / INDEX)
        except OSError as e:
            tmp.unlink(missing_ok=True)  # the previous dump.json, if any, stays in place
            (self.folder / name).unlink(missing_ok=True)
            raise DumpWriteError(f"cannot write {self.folder / INDEX}: {e.strerror or e}") from e
        self._snapshots += 1
        for old in self.folder.glob("index-*.h5"):
            if old.name != name:
                old.unlink(missing_ok=True)
        return self.folder

    def abandon(self) -> None:
        """Stop writing after an error: the records not yet in the journal go there first (the
        tensors they saved too, where that still works), so what was recorded stays readable."""
        try:
            self.flush()
        except (OSError, ValueError):
            pass
        try:
            self._journal.close()
        except OSError:
            pass
