"""Crash-safe dump writer: an append-only journal, closed HDF5 segments, and a final dump.json.

Why this shape: an HDF5 file that is open when the process is SIGKILLed can be unreadable as a
whole. So tensors go into small segment files that are written complete under a temporary name
and renamed into place, and records go to ``journal.jsonl`` (one JSON object a line, flushed
with each segment). ``dump.json`` is written atomically by ``close()``. A dump without
``dump.json`` is a truncated one, and the reader rebuilds it from the journal.
"""
from __future__ import annotations

import io
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable

import h5py
import torch

from .model import FORMAT_NAME, FORMAT_VERSION, Record
from .tensorio import write_dataset

JOURNAL = "journal.jsonl"
INDEX = "dump.json"
FLUSH_BYTES = 256 << 20  # default cap on tensor bytes held in memory before a segment is written


def _encode(obj: Any) -> str:
    """Compact JSON; a value JSON cannot hold (a symbolic size) is written as its text rather
    than losing the whole record."""
    return json.dumps(obj, separators=(",", ":"), default=str)


class DumpWriteError(OSError):
    """The dump folder cannot be written (unwritable path, full disk...)."""


class DumpWriter:
    def __init__(self, folder: Path, header: dict[str, Any], *, flush_records: int = 512,
                 flush_seconds: float = 1.0, flush_bytes: int = FLUSH_BYTES) -> None:
        self.folder = Path(folder)
        self.header = dict(header, format=FORMAT_NAME, format_version=FORMAT_VERSION)
        self.flush_records = flush_records
        self.flush_seconds = flush_seconds
        self.flush_bytes = flush_bytes
        self.pending_bytes = 0  # bytes of queued tensor copies, bounded by flush_bytes + one tensor
        self.peak_pending_bytes = 0
        # Segment names are unique per writer (pid + random token): a forked child, or a second
        # writer on the same folder, can never replace a segment this writer's records point to.
        self.pid = os.getpid()
        self._prefix = f"tensors-{self.pid}-{secrets.token_hex(4)}"
        self._records: dict[int, Record] = {}  # seq -> record, every record, for dump.json
        self._pending: list[Record] = []  # not yet in the journal
        self._updates: dict[int, Record] = {}  # de-duplicated records whose count changed
        self._encoded: dict[int, str] = {}  # seq -> JSON text, so dump.json re-encodes nothing
        self._stale: set[int] = set()  # records changed since they were encoded
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
            for seg in self.folder.glob("tensors-*.h5"):
                seg.unlink()
            self._journal = open(self.folder / JOURNAL, "w", encoding="utf-8")
            self._journal.write(json.dumps({"header": self.header}) + "\n")
            self._journal.flush()
        except OSError as e:
            raise DumpWriteError(f"cannot write dump folder {self.folder}: {e.strerror or e}") from e

    # -- called by the tracer -----------------------------------------------------------
    def add(self, record: Record) -> None:
        self._records[record.seq] = record
        self._pending.append(record)
        self._maybe_flush()

    def touch(self, record: Record) -> None:
        """A de-duplicated record's count or last_seq changed."""
        self._updates[record.seq] = record
        self._stale.add(record.seq)

    def save_tensor(self, record: Record, arg: str, t: torch.Tensor) -> str:
        """Queue a copy of ``t`` for the current segment; return its data reference."""
        nbytes = t.numel() * t.element_size()
        if self._tensors and self.pending_bytes + nbytes > self.flush_bytes:
            self._raise_lost(self._write_segment())  # bound memory by bytes, not only by time
        path = f"r{record.seq}/{arg}"
        self._tensors.append((path, t))
        self.pending_bytes += nbytes
        self.peak_pending_bytes = max(self.peak_pending_bytes, self.pending_bytes)
        return f"{self._segment_name()}:{path}"

    def _segment_name(self) -> str:
        return f"{self._prefix}-{self._segment:05d}.h5"

    def _maybe_flush(self) -> None:
        if len(self._pending) >= self.flush_records or (
            time.monotonic() - self._last_flush >= self.flush_seconds
        ):
            self.flush()

    @property
    def closed(self) -> bool:
        return self._journal.closed

    def _foreign(self) -> bool:
        """A forked child inherits this writer; only the process that opened it writes."""
        return os.getpid() != self.pid

    def flush(self, *, updates: bool = True) -> None:
        """Write queued tensors as one closed segment, then their records to the journal
        (and, with ``updates``, the changed counts of de-duplicated records)."""
        if self._foreign():
            return
        if self.before_flush is not None:
            self.before_flush()
        lost = None
        try:
            lost = self._write_segment()
        finally:
            # The records go to the journal even when their segment could not be written
            # (a full disk): a lost tensor copy must not take the records' metadata with it.
            self._write_journal(updates)
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
            with h5py.File(buffer, "w") as f:
                for path, t in self._tensors:
                    write_dataset(f, path, t)
            with open(tmp, "wb") as out:
                out.write(buffer.getbuffer())
            os.replace(tmp, self.folder / name)
        except OSError as e:
            tmp.unlink(missing_ok=True)  # give the space back to the journal
            self._forget_segment(name)
            return e
        finally:
            self._tensors.clear()
            self.pending_bytes = 0
            self._segment += 1
        return None

    def _forget_segment(self, name: str) -> None:
        prefix = name + ":"
        for r in self._pending:
            for _, meta in (*r.input_tensors(), *r.output_tensors()):
                if meta.data is not None and meta.data.startswith(prefix):
                    meta.data = None

    def _write_journal(self, updates: bool) -> None:
        try:
            lines = []
            for r in self._pending:
                text = self._encoded[r.seq] = _encode(r.to_json())
                self._stale.discard(r.seq)
                lines.append(text)
            if updates:
                lines += [json.dumps({"update": r.seq, "count": r.count, "last_seq": r.last_seq})
                          for r in self._updates.values()]
            if lines:
                self._journal.write("\n".join(lines) + "\n")
                self._journal.flush()
        except OSError as e:
            raise DumpWriteError(f"cannot write to dump folder {self.folder}: {e.strerror or e}") from e
        self._pending.clear()
        self._updates.clear()
        self._last_flush = time.monotonic()

    def close(self, summary: dict[str, Any]) -> Path:
        """Flush, write dump.json atomically, and return the dump folder."""
        self.flush(updates=False)  # dump.json, written next, carries the final counts
        self._journal.close()
        folder = self.snapshot(summary)
        (self.folder / JOURNAL).unlink(missing_ok=True)  # dump.json now holds all of it
        return folder

    def snapshot(self, summary: dict[str, Any]) -> Path:
        """Write dump.json for everything recorded so far (atomically: tmp file + rename)."""
        if self._foreign():
            raise DumpWriteError(f"not writing {self.folder / INDEX}: the dump belongs to process "
                                 f"{self.pid}, not to this forked child")
        for seq in self._stale:
            self._encoded[seq] = _encode(self._records[seq].to_json())
        self._stale.clear()
        head = _encode(dict(self.header, complete=True, summary=summary))
        tmp = self.folder / (INDEX + ".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(head[:-1] + ',"records":[')
                f.write(",".join(self._encoded.get(seq) or _encode(r.to_json()) for seq, r in self._records.items()))
                f.write("]}")
            os.replace(tmp, self.folder / INDEX)
        except OSError as e:
            tmp.unlink(missing_ok=True)  # the previous dump.json, if any, stays in place
            raise DumpWriteError(f"cannot write {self.folder / INDEX}: {e.strerror or e}") from e
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
