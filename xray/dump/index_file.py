"""The columnar index on disk (trace format v3): ``index.h5``, and the journal's chunk files.

One HDF5 file holds three datasets: ``records`` and ``tensors`` (compound tables with the
columns of ``xray.dump.columns``) and the string table (``strings``: UTF-8 bytes, ``string_ends``:
the end offset of each string). Opening reads no table: they are read whole, once, the first
time a tool asks for them, then checked (``Columns.validate``). A journal chunk has the same
datasets for the records of one flush, only the strings new since the chunk before, and an
``updates`` table (de-duplicated records whose count grew).

Files are built in memory and written with plain file I/O under a temporary name, then renamed:
a file on disk is always whole, and a full disk raises OSError instead of crashing HDF5.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import h5py
import numpy as np

from .columns import RECORD_DTYPE, TENSOR_DTYPE, UPDATE_DTYPE, Columns, ColumnsError, StringTable
from .tensorio import open_dataset

LAYOUT = "xray-trace-index"  # the file's ``layout`` attribute
LAYOUT_VERSION = 1


def write_file(path: Path, records: np.ndarray, tensors: np.ndarray, blob: np.ndarray, ends: np.ndarray,
               attrs: dict, updates: np.ndarray | None = None) -> None:
    """Write one index or chunk file atomically (tmp + rename); OSError on failure, no file left."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.attrs["layout"] = LAYOUT
        f.attrs["layout_version"] = LAYOUT_VERSION
        for k, v in attrs.items():
            f.attrs[k] = v
        f.create_dataset("records", data=records)
        f.create_dataset("tensors", data=tensors)
        f.create_dataset("strings", data=blob)
        f.create_dataset("string_ends", data=ends)
        if updates is not None:
            f.create_dataset("updates", data=updates)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(buffer.getbuffer())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write_index(path: Path, columns: Columns) -> None:
    blob, ends = columns.strings.to_arrays()
    write_file(path, columns.records, columns.tensors, blob, ends, {"records": len(columns.records)})


class IndexFile:
    """An open index or chunk file; tables are read on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.file = h5py.File(path, "r")
        except OSError as e:
            raise ColumnsError(f"not a readable HDF5 file ({e})") from None
        if self.file.attrs.get("layout") != LAYOUT:
            self.file.close()
            raise ColumnsError(f"not an xray trace index (layout={self.file.attrs.get('layout')!r})")
        version = self.file.attrs.get("layout_version")
        if not isinstance(version, (int, np.integer)) or not 1 <= version <= LAYOUT_VERSION:
            self.file.close()
            raise ColumnsError(f"index layout version {version!r} is newer than this xray reads; upgrade xray")

    def table(self, name: str, dtype: np.dtype) -> np.ndarray:
        try:
            ds = open_dataset(self.file, name)
        except (KeyError, ValueError) as e:
            raise ColumnsError(f"no {name!r} table ({e})") from None
        if ds.dtype != dtype or ds.ndim != 1:
            raise ColumnsError(f"the {name!r} table has columns {ds.dtype} (expected {dtype})")
        try:
            return ds[()]
        except (OSError, ValueError) as e:
            raise ColumnsError(f"the {name!r} table is unreadable ({e})") from None

    def strings(self) -> StringTable:
        blob = self.table("strings", np.dtype(np.uint8))
        ends = self.table("string_ends", np.dtype("<i8"))
        return StringTable.from_arrays(blob, ends)

    def string_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.table("strings", np.dtype(np.uint8)), self.table("string_ends", np.dtype("<i8"))

    def updates(self) -> np.ndarray:
        return self.table("updates", UPDATE_DTYPE) if "updates" in self.file else np.zeros(0, UPDATE_DTYPE)

    def attr(self, name: str, default=None):
        return self.file.attrs.get(name, default)

    def close(self) -> None:
        self.file.close()


def open_columns(path: Path) -> Columns:
    """The columns of an ``index.h5``, read (and checked) on first use: opening a million-record
    dump costs the file open, not the million rows. ColumnsError if it is not an index."""
    index = IndexFile(path)
    index.close()  # checked the header; the tables are read later, in one go

    def load() -> tuple[np.ndarray, np.ndarray, StringTable]:
        f = IndexFile(path)
        try:
            return f.table("records", RECORD_DTYPE), f.table("tensors", TENSOR_DTYPE), f.strings()
        finally:
            f.close()

    return Columns(None, None, None, loader=load)
