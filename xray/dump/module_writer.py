"""Write one rank's module dump: tensor datasets as they are captured, index tables at close.

Nothing half-written looks valid: while a dump is open the file lives under ``<name>.h5.tmp``
with the root attribute ``complete = False``; ``close()`` writes the index tables, sets
``complete = True`` and renames the file into place. A later ``open()`` in the same session
moves it back to the temporary name before appending the next step.

Index rows wait in memory until ``close()``, which opens the file itself when nothing did:
a statistics-only dump has no tensor data, so it touches the file only when its owner decides
to write (PrecisionDebugger's ``flush_secs``), not at every step.

A full disk must not cost the steps already in the file: HDF5 updates a file's metadata in
place, so a write that fails half way leaves the whole file unreadable (and h5py prints a
traceback for every object it then frees). The writer therefore checks the room left (free
space, and the file-size limit) before each tensor and before the index tables, and refuses
with DiskFullError before the disk is full; ``abandon()`` then drops the step being captured
and closes the file complete with the steps before it.
"""
from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from .tensorio import write_dataset
from .module_layout import ATEN, FORMAT_NAME, FORMAT_VERSION, INDEX, INDEX_DTYPE, index_table, step_group


def _attr_value(v: Any) -> Any:
    """HDF5 attributes hold plain str/int/float/bool; lists, dicts and None go in as JSON."""
    if isinstance(v, (list, dict)) or v is None:
        return json.dumps(v)
    if isinstance(v, str):
        return str(v)  # str subclasses (torch.__version__) have no HDF5 type
    return v


# HDF5 types of index tables, by numpy dtype: a step's table usually has the widths of the last.
_TABLE_TYPES: dict[np.dtype, h5py.h5t.TypeID] = {}


def _write_table(group: h5py.Group, name: str, table: np.ndarray) -> None:
    """``group[name] = table``, through h5py's low-level API with the memory type equal to the
    file type: HDF5 then copies the rows as they are (create_dataset converts field by field)."""
    tid = _TABLE_TYPES.get(table.dtype)
    if tid is None:
        if len(_TABLE_TYPES) > 64:
            _TABLE_TYPES.clear()
        tid = _TABLE_TYPES[table.dtype] = h5py.h5t.py_create(table.dtype, logical=True)
    dataset = h5py.h5d.create(group.id, name.encode(), tid, h5py.h5s.create_simple(table.shape))
    if len(table):
        dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, table, mtype=tid)


def _require_group(f: h5py.File, step: int) -> h5py.Group:
    """The step's group, created if missing (cheaper than h5py's require_group)."""
    name = step_group(step).encode()
    if name in f.id:
        return h5py.Group(h5py.h5g.open(f.id, name))
    return h5py.Group(h5py.h5g.create(f.id, name))


def _set_attr(obj: h5py.Group | h5py.File, name: str, value: bool | int | str) -> None:
    """``obj.attrs[name] = value`` with the types h5py's setter would store (bool as its enum,
    int as int64, str as variable-length UTF-8), but an attribute that exists is written in
    place (the setter deletes and re-creates it). This runs several times per step."""
    data = np.array(value, dtype=_VLEN_STR) if isinstance(value, str) else np.array(value)
    key = name.encode()
    if h5py.h5a.exists(obj.id, key):
        attr = h5py.h5a.open(obj.id, key)
    else:
        tid = _ATTR_TYPES.get(data.dtype)
        if tid is None:
            tid = _ATTR_TYPES[data.dtype] = h5py.h5t.py_create(data.dtype, logical=True)
        attr = h5py.h5a.create(obj.id, key, tid, _SCALAR)
    attr.write(data)


_VLEN_STR = h5py.string_dtype("utf-8")
_ATTR_TYPES: dict[np.dtype, h5py.h5t.TypeID] = {}
_SCALAR = h5py.h5s.create(h5py.h5s.SCALAR)


_CAPTURED = 9  # fields of a captured row; a sealed one has INDEX_DTYPE's and the CSV text
_NAME, _DIRECTION, _DATA = (INDEX_DTYPE.names.index(c) for c in ("name", "direction", "data"))
_CSV = len(INDEX_DTYPE.names)


def _index_row(call, name: str, role: str, key: str, cells, requires_grad: bool, data: str, keyword: str,
               source: str) -> tuple:
    """A captured row (see ModuleDumpWriter.step_rows) as the index table's columns (INDEX_DTYPE
    order)."""
    return (call.seq, name, call.path, call.cls, call.call_index, call.direction, role, key, *cells.meta,
            requires_grad, *cells.numbers, data, keyword, source)


class DumpPathError(OSError):
    """The dump path cannot be written; the message names it."""


class DiskFullError(DumpPathError):
    """Writing would leave too little room to finish the file (checked before writing)."""


# Room the writer counts before writing (a file that cannot be finished is lost whole): per
# tensor its bytes and its dataset's object header, per index row and ATen line their bytes
# (a row takes ~0.3 KB and a header ~1 KB in the tables of a 2-layer Llama: these leave margin
# for long names), and a reserve for the HDF5 metadata that closing the file writes.
CLOSE_RESERVE = 256 << 10
PER_TENSOR = 4096
PER_ROW = 1024


def room_left(path: Path) -> int:
    """Bytes ``path`` may still grow by: the free space of its file system for this user, and
    the process's file-size limit (RLIMIT_FSIZE, where it has one) less the file's size."""
    st = os.statvfs(path.parent)
    room = st.f_bavail * st.f_frsize
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return room
    if limit != resource.RLIM_INFINITY:
        size = path.stat().st_size if path.exists() else 0
        room = min(room, limit - size)
    return room


class _Quiet:
    """Around HDF5 writes that may fail: h5py reports a failed write again for every object
    then freed (a traceback each, printed to sys.stderr or through sys.unraisablehook, not raised
    to us), 54 of them for one full disk; the caller warns once instead. (Output of other
    threads while the index is written is dropped too.)"""

    def __enter__(self):
        self.saved = sys.stderr, sys.unraisablehook
        sys.stderr, sys.unraisablehook = _Sink(), _ignore
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None:
            value.__traceback__ = None  # free the failed write's HDF5 objects here, unheard
            gc.collect()
        sys.stderr, sys.unraisablehook = self.saved
        return False


def _first_line(e: Exception) -> str:
    """HDF5's error text without its multi-line detail (time, buffer address, offsets)."""
    text = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)).strip()
    return text.split("\n")[0].split(" (file write failed")[0][:200]


class _Sink:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _ignore(unraisable) -> None:
    pass


class ModuleDumpWriter:
    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.header = dict(header, format=FORMAT_NAME, format_version=FORMAT_VERSION)
        self.rows: dict[int, list[tuple]] = {}  # step -> index rows, until forget_before()
        self._aten: dict[int, list[str]] = {}
        self._touched: set[int] = set()  # steps written since open()
        self._steps: set[int] = set()  # every step in the file
        self._groups: dict[int, h5py.Group] = {}  # open step groups, valid until close()
        self._names: dict[int, set[str]] = {}  # tensor datasets written per step, this session
        self._file: h5py.File | None = None
        self._created = False
        self.bytes_written = 0
        self.tensors_written = 0
        self.failed = False  # set by abandon(): nothing more is written
        self._room = 0  # bytes the file could grow by at open(), less what was written since

    @property
    def is_open(self) -> bool:
        return self._file is not None

    @property
    def pending(self) -> bool:
        """Whether steps were captured that the file does not hold yet."""
        return bool(self._touched)

    @property
    def held_rows(self) -> int:
        """Index rows captured that the file does not hold yet."""
        return sum(len(self.rows.get(step, ())) for step in self._touched)

    def open(self) -> None:
        if self.failed:
            raise DumpPathError(errno.EIO, f"module dump {self.path} stopped after an earlier write error")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self._created and self.path.exists():
                os.replace(self.path, self.tmp)
                self._file = h5py.File(self.tmp, "a")
            else:  # a new session overwrites what an earlier run left at this name
                self.path.unlink(missing_ok=True)
                self._file = h5py.File(self.tmp, "w")
                for k, v in self.header.items():
                    _set_attr(self._file, k, _attr_value(v))
                self._created = True
            _set_attr(self._file, "complete", False)
            self._room = room_left(self.tmp)
        except OSError as e:
            raise DumpPathError(f"cannot write module dump {self.path}: {e.strerror or e}; "
                                "pass a writable dump_path") from e

    def group(self, step: int) -> h5py.Group:
        assert self._file is not None, "writer is not open"
        g = self._groups.get(step)
        if g is None:  # look each step's group up once
            g = self._groups[step] = _require_group(self._file, step)
            self._touched.add(step)
        return g

    def write_tensor(self, step: int, name: str, t: torch.Tensor) -> str:
        """Copy ``t`` into ``/step_<s>/<name>`` now (so later in-place ops cannot change it).
        The dataset carries only ``torch_dtype``: its module, role and statistics are in the
        step's index (HDF5 attributes are slow to write)."""
        self._claim(t.numel() * t.element_size() + PER_TENSOR)
        g = self.group(step)
        names = self._names.setdefault(step, set())
        if name in names:  # the same tensor name twice in one step (re-entered start/stop): keep the last
            del g[name]
        names.add(name)
        error = None
        try:  # (not under _Quiet: the room check keeps this from failing, and a user's thread may print)
            write_dataset(g, name, t)
        except (OSError, RuntimeError) as e:  # raised below, outside this block: nothing keeps HDF5 objects alive
            error = _first_line(e)
        if error is not None:
            g = None
            raise DumpPathError(errno.EIO, f"cannot write {name} into module dump {self.path}: {error}")
        self.bytes_written += t.numel() * t.element_size()
        self.tensors_written += 1
        return f"{step_group(step)}/{name}"

    def _claim(self, nbytes: int) -> None:
        """Count ``nbytes`` against the room left; DiskFullError (nothing written) if the file
        could then not be finished."""
        if nbytes + CLOSE_RESERVE > self._room:
            raise DiskFullError(errno.ENOSPC, f"module dump {self.path}: the disk is nearly full "
                                f"({max(self._room, 0) >> 10} KiB left, {nbytes >> 10} KiB to write and "
                                f"{CLOSE_RESERVE >> 10} KiB kept to finish the file)")
        self._room -= nbytes

    def abandon(self, step: int) -> Path | None:
        """After a write error: drop ``step`` (captured only in part), finish the file with the
        steps before it if the disk still takes that, and write nothing more. Returns the
        file's path if it is complete; never raises."""
        self.failed = True
        for held in (self.rows, self._aten, self._names):
            held.pop(step, None)
        self._touched.discard(step)
        if self._file is None:
            self._touched.clear()  # statistics-only: what the file lacks cannot be written now
            return self.path if self.path.exists() else None
        f = self._file
        try:
            if step not in self._steps and step_group(step).encode() in f.id:
                del f[step_group(step)]
            self._room = max(self._room, CLOSE_RESERVE)  # the reserve is for this
            return self._finish()
        except Exception:  # the disk filled before our check saw it: the file is lost
            pass
        with _Quiet():
            self._file = None
            self._groups.clear()
            with contextlib.suppress(Exception):
                f.close()
            f = None
            gc.collect()
        return None

    def forget_before(self, step: int) -> None:
        """Drop the rows, op records and dataset names held for steps before ``step`` (already
        written): only the current step can be captured again."""
        for held in (self.rows, self._aten, self._names):
            for s in [s for s in held if s < step]:
                del held[s]

    def step_rows(self, step: int) -> list[tuple]:
        """The list the rows of ``step`` go in (appended to directly: hundreds a step). A row is
        captured as (call, name, role, key, cells, requires_grad, data, keyword, source), ``call`` a
        capture.CallKey and ``cells`` a capture.Cells shared by every row of the same call or
        tensor version, and sealed into plain values at the end of the step (seal())."""
        self._touched.add(step)
        return self.rows.setdefault(step, [])

    def seal(self, step: int) -> None:
        """Turn the captured rows of ``step`` into their index form, in place: INDEX_DTYPE's
        columns, then the summary CSV's Dtype..Numel text. A sealed row holds only strings and
        numbers, which Python's garbage collector stops tracking, so rows held until the file
        is written bring no full collections. Rows captured again into a sealed step are
        sealed at the next call."""
        rows = self.rows.get(step)
        if rows and len(rows[-1]) == _CAPTURED:
            rows[:] = [(*_index_row(*r), r[4].csv) if len(r) == _CAPTURED else r for r in rows]

    def csv_rows(self, step: int) -> list[tuple[str, str, str, str]]:
        """The rows of a sealed step as summary_csv.append_index_csv takes them: (name,
        Dtype..Numel cells, direction, data)."""
        return [(r[_NAME], r[_CSV], r[_DIRECTION], r[_DATA]) for r in self.rows.get(step, ())]

    def add_aten(self, step: int, record_json: dict) -> None:
        self._aten.setdefault(step, []).append(json.dumps(record_json, separators=(",", ":")))
        self._touched.add(step)

    def close(self) -> Path | None:
        """Write the index of every step touched, mark the file complete, rename it into place
        (opening the file first if no tensor data did). None if there was nothing to write.
        DiskFullError (the file untouched by this call) if the tables would not fit."""
        if self.failed:
            return None
        if self._file is None:
            if not self._touched:
                return None
            self.open()
        self._claim(PER_ROW * self.held_rows + sum(len(line) for step in self._touched
                                                     for line in self._aten.get(step, ())))
        return self._finish()

    def _finish(self) -> Path:
        error = None
        try:
            with _Quiet():
                self._write_index()
            return self.path
        except (OSError, RuntimeError) as e:  # h5py raises RuntimeError when a flush fails
            error = _first_line(e)
        # Raised outside the except block, so no traceback keeps the dead file's objects alive.
        self.failed = True
        with _Quiet():
            self._groups.clear()
            gc.collect()
        raise DumpPathError(errno.EIO, f"cannot finish module dump {self.path}: {error}")

    def _write_index(self) -> None:
        f, self._file = self._file, None
        self._groups.clear()
        try:
            for step in sorted(self._touched):
                g = _require_group(f, step)
                _set_attr(g, "step", step)
                for name in (INDEX, ATEN):
                    if name.encode() in g.id:
                        del g[name]
                self.seal(step)  # a step cut short by an exception was not
                _write_table(g, INDEX, index_table(self.rows.get(step, [])))
                if self._aten.get(step):
                    g.create_dataset(ATEN, data=np.array(self._aten[step], dtype=h5py.string_dtype()))
            self._steps |= self._touched
            self._touched.clear()
            _set_attr(f, "steps", json.dumps(sorted(self._steps)))
            _set_attr(f, "complete", True)
            f.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            with contextlib.suppress(Exception):
                f.close()
            raise
