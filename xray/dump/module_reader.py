"""Read a module dump (``xray-module``) into the shared data model, lazily.

Only the small per-step index tables are read to build records; tensor data is read on demand
by ``load_tensor``, so a multi-GB file is listed and summarised in bounded memory.

A dump is untrusted input: ``read_module_dump`` validates the whole layout once, at load
(``_validate``): every step group, index table and row, every ATen record and the header of
every dataset a row names (never its data), with the counts and lengths capped as in
``model.py``. Anything wrong is one DumpFormatError naming the file, the step and row, and
what is wrong; past that point the readers below can trust what they read.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import h5py
import numpy as np
import torch

from .model import MAX_DIMS, MAX_ITEMS, MAX_NAME, MAX_TEXT, Record, Source, Stats, TensorMeta, echo, parse_json
from .errors import DumpFormatError, TruncatedDumpWarning
from .tensorio import (DTYPE_ATTR, UnsafeDatasetError, dtype_from_name, dtype_name, open_dataset, read_dataset,
                       stored_dtype_name)
from .module_layout import (ATEN, FORMAT_NAME, FORMAT_VERSION, INDEX, INDEX_DTYPE, OPTIONAL_COLUMNS, ROLES,
                            STATE_ROLES, step_group)

_CHUNK = 65536  # index rows read at a time
_OUTPUT_ROLES = ("forward_output", "backward_output")


@dataclass
class TensorRow:
    """One row of a step's index: a named tensor of one module call."""

    step: int
    seq: int
    name: str  # <path>.<Class>.<call>.<role>.<key>
    module: str
    cls: str
    call_index: int
    direction: str
    role: str
    key: str
    meta: TensorMeta
    keyword: str = ""  # forward inputs: the keyword argument the tensor came from ("" if positional)


def _s(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _opt(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


class ModuleDump:
    """A module dump: ``.records`` (module calls, then ATen ops if recorded) in execution order,
    ``.header``, ``named_tensors()``, tensors on demand. Same interface as TraceDump."""

    def __init__(self, path: Path, f: h5py.File, header: dict[str, Any], complete: bool, steps: list[int],
                 aten: dict[int, list[Record]]) -> None:
        self.path = path
        self.folder = path.parent
        self.header = header
        self.complete = complete
        self._f = f
        self._steps = steps  # validated at load, as are the ATen records (see _validate)
        self._aten = aten
        self._records: list[Record] | None = None

    @property
    def format(self) -> str:
        return FORMAT_NAME

    @property
    def rank(self) -> int | None:
        return self.header.get("global_rank")

    @property
    def steps(self) -> list[int]:
        return list(self._steps)

    def __repr__(self) -> str:
        state = "complete" if self.complete else "INCOMPLETE"
        return f"ModuleDump({str(self.path)!r}, steps {self.steps}, {state})"

    # -- lazy row access -------------------------------------------------------------------
    def _index(self, step: int) -> h5py.Dataset | None:
        if step not in self._steps or INDEX not in self._f[step_group(step)]:
            return None
        return open_dataset(self._f, f"{step_group(step)}/{INDEX}")

    def rows(self, step: int | None = None) -> Iterator[TensorRow]:
        """Every tensor row, step by step, in capture order (reads the index in chunks)."""
        for s in ([step] if step is not None else self.steps):
            ds = self._index(s)
            if ds is None:
                continue
            for start in range(0, ds.shape[0], _CHUNK):
                yield from index_rows(s, ds[start:start + _CHUNK].tolist())

    def named_tensors(self, step: int | None = None) -> Iterator[tuple[str, TensorMeta]]:
        """(full tensor name, meta) pairs, e.g. ``model.norm.LlamaRMSNorm.0.forward_output.0``.
        Names repeat across steps: pass ``step`` to take one."""
        for row in self.rows(step):
            yield row.name, row.meta

    # -- records -----------------------------------------------------------------------------
    @property
    def records(self) -> list[Record]:
        if self._records is None:
            self._records = self._build_records()
        return self._records

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def _build_records(self) -> list[Record]:
        by_call: dict[tuple[int, int], Record] = {}
        outputs: dict[tuple[int, int], dict[int, TensorMeta]] = {}
        for row in self.rows():
            k = (row.step, row.seq)
            rec = by_call.get(k)
            if rec is None:
                rec = by_call[k] = Record(seq=row.seq, kind="module", op=row.cls, direction=row.direction,
                                          module=row.module, call_index=row.call_index, step=row.step)
            if row.role in _OUTPUT_ROLES:
                outputs.setdefault(k, {})[int(row.key)] = row.meta
            elif row.role in STATE_ROLES:  # the module's own parameters and buffers: never inputs
                rec.params[row.key] = row.meta
            else:
                rec.inputs[f"{row.role}.{row.key}"] = row.meta
                if row.keyword:
                    rec.keywords[f"{row.role}.{row.key}"] = row.keyword
        for k, outs in outputs.items():  # outputs not recorded (overflow_check) stay None
            by_call[k].outputs = [outs.get(i) for i in range(max(outs) + 1)]
        records = list(by_call.values())
        records += self._aten_records()
        records.sort(key=lambda r: (r.step if r.step is not None else -1, r.seq))
        return records

    def _aten_records(self) -> list[Record]:
        out = []
        for step in self._steps:
            for rec in self._aten.get(step, ()):
                rec.step = step
                out.append(rec)
        return out

    # -- tensors -----------------------------------------------------------------------------
    def has_data(self, meta: TensorMeta) -> bool:
        return meta.data is not None and meta.data in self._f

    def dataset(self, meta: TensorMeta | str) -> h5py.Dataset:
        """The HDF5 dataset behind ``meta`` (for chunked reads of large tensors)."""
        ref = meta if isinstance(meta, str) else meta.data
        if not ref:
            raise KeyError("this tensor's data was not saved (statistics-only dump: use task='tensor')")
        if ref not in self._f:
            raise KeyError(f"{self.path}: no saved tensor {ref!r} (incomplete dump?)")
        return open_dataset(self._f, ref)  # headers were checked against their rows at load

    def load_tensor(self, meta: TensorMeta | str) -> torch.Tensor:
        """The saved tensor for ``meta`` (or a dataset path), on CPU."""
        return read_dataset(self.dataset(meta))

    def close(self) -> None:
        if self._f.id.valid:
            self._f.close()

    def __enter__(self) -> "ModuleDump":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def index_rows(step: int, rows: Iterable[tuple]) -> Iterator[TensorRow]:
    """TensorRows from index rows (tuples in INDEX_DTYPE's field order), as read from the file
    or as still held by the writer (the debugger's summary CSV needs no read-back). Version 1
    rows end before the ``keyword`` column, version 2 rows before ``source``: a parameter there
    is named by its module's path."""
    for row in rows:
        (seq, name, module, cls, call_index, direction, role, key, dtype, shape, device, requires_grad,
         mn, mx, mean, std, nan, posinf, neginf, numel, data) = row[:21]
        stats = Stats(_opt(mn), _opt(mx), _opt(mean), _opt(std), nan=int(nan), posinf=int(posinf),
                      neginf=int(neginf), numel=int(numel))
        data, module, role, key = _s(data), _s(module), _s(role), _s(key)
        source = _s(row[22]) if len(row) > 22 else ""
        if not source and role in STATE_ROLES:
            source = f"{STATE_ROLES[role]}:{module}.{key}" if module else f"{STATE_ROLES[role]}:{key}"
        meta = TensorMeta(shape=tuple(parse_json(_s(shape))), dtype=_s(dtype), device=_s(device),
                          requires_grad=bool(requires_grad), stats=stats, data=data or None, source=source or None)
        yield TensorRow(step, int(seq), _s(name), module, _s(cls), int(call_index), _s(direction), role,
                        key, meta, _s(row[21]) if len(row) > 21 else "")


def read_module_dump(path: str | os.PathLike) -> ModuleDump:
    """Open a PrecisionDebugger ``.h5`` file, validated (see the module docstring); refuses files
    that are not xray module dumps, or damaged ones, with one DumpFormatError line, and warns
    (TruncatedDumpWarning) about files whose writer never finished."""
    p = Path(path)
    if not p.exists():
        raise DumpFormatError(f"{p}: no such file")
    if not p.is_file():
        raise DumpFormatError(f"{p}: not a file (a module dump is one .h5 file)")
    try:
        f = h5py.File(p, "r")
    except OSError as e:
        raise DumpFormatError(f"{p}: not a readable HDF5 file (truncated or corrupt?): {_line(e)}") from None
    try:
        header, complete, steps, aten = _validate(p, f)
    except BaseException:
        f.close()
        raise
    if not complete:
        warnings.warn(f"{p}: module dump was never finished (stop() not called, or the process died); "
                      "its index may be missing, so records can be incomplete", TruncatedDumpWarning, stacklevel=2)
    return ModuleDump(p, f, header, complete, steps, aten)


# -- validation at load -----------------------------------------------------------------------
MAX_STEPS = 1 << 20  # steps in one file (a statistics-only dump of a long run has many)
MAX_ROWS = 1 << 24  # index rows of one step
MAX_ATTRS = 256  # root attributes
_INT_COLUMNS = ("seq", "call_index", "nan", "posinf", "neginf", "numel")
_FLOAT_COLUMNS = ("min", "max", "mean", "std")
_BOOL_COLUMNS = ("requires_grad",)
_TEXT_COLUMNS = ("name", "data", "source")  # up to MAX_TEXT; the other string columns MAX_NAME
_DIRECTIONS = ("forward", "backward")


class _Bad(Exception):
    """A validation failure, turned into DumpFormatError with the file and place prefixed."""


def _line(e: BaseException) -> str:
    """An exception as one short line (HDF5 messages run over several)."""
    text = " ".join(str(e).split())
    return text if len(text) <= 400 else text[:400] + "..."


def _validate(p: Path, f: h5py.File) -> tuple[dict, bool, list[int], dict[int, list[Record]]]:
    """Check the whole layout; returns (header, complete, steps, ATen records by step)."""
    where = ""
    try:
        header = _header(f)
        complete = bool(header.pop("complete", False))
        steps = _step_groups(f)
        listed = header.get("steps")
        if complete and listed is not None and sorted(listed) != steps:
            raise _Bad(f"the steps attribute {echo(listed)} disagrees with the step groups {echo(steps)}")
        aten: dict[int, list[Record]] = {}
        checked: set[str] = set()
        for step in steps:
            where = f"/{step_group(step)}"
            g = f[step_group(step)]
            if INDEX in g:
                _check_index(f, step, checked)
            elif complete:
                raise _Bad("has no index table")
            if ATEN in g:
                aten[step] = _aten(f, step)
        return header, complete, steps, aten
    except _Bad as e:
        raise DumpFormatError(f"{p}: {where + ': ' if where and not str(e).startswith('/') else ''}{e}") from None
    except UnsafeDatasetError as e:
        raise DumpFormatError(f"{p}: {_line(e).replace(str(f.filename) + ':', '')}") from None
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:  # h5py on a damaged file
        raise DumpFormatError(f"{p}: {where + ': ' if where else ''}unreadable ({type(e).__name__}: {_line(e)}); "
                              "the file is damaged") from None


def _text(v: Any, what: str, limit: int = MAX_NAME) -> str:
    if isinstance(v, bytes):
        try:
            v = v.decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad(f"{what} is not UTF-8 text: {echo(v)}") from None
    if not isinstance(v, str):
        raise _Bad(f"{what} must be text, got {type(v).__name__} {echo(v)}")
    if len(v) > limit:
        raise _Bad(f"{what} is {len(v)} characters long (limit {limit}): {echo(v)}")
    return v


def _header(f: h5py.File) -> dict[str, Any]:
    if len(f.attrs) > MAX_ATTRS:
        raise _Bad(f"{len(f.attrs)} root attributes (limit {MAX_ATTRS}); not an xray module dump")
    header: dict[str, Any] = {}
    for k in f.attrs:
        try:
            v = f.attrs[k]
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as e:
            raise _Bad(f"root attribute {echo(k)} is unreadable ({_line(e)})") from None
        if isinstance(v, (bytes, str)):
            v = _text(v, f"root attribute {echo(k)}", MAX_TEXT)
        elif isinstance(v, np.generic):
            v = v.item()
        elif isinstance(v, np.ndarray) and v.size > MAX_ITEMS:
            raise _Bad(f"root attribute {echo(k)} has {v.size} items (limit {MAX_ITEMS})")
        header[_text(k, "a root attribute's name")] = v
    if header.get("format") != FORMAT_NAME:
        raise _Bad(f"not an xray module dump (format attribute is {echo(header.get('format'))})")
    version = header.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise _Bad(f"module dump format version {echo(version)} is not supported by this xray (reads versions "
                   f"1..{FORMAT_VERSION}); upgrade xray or re-record the dump")
    if "steps" in header:
        header["steps"] = _steps_attr(header["steps"])
    return header


def _steps_attr(v: Any) -> list[int]:
    try:
        steps = parse_json(v) if isinstance(v, str) else None
    except (ValueError, RecursionError):
        steps = None
    if (not isinstance(steps, list) or len(steps) > MAX_STEPS
            or not all(type(s) is int and s >= 0 for s in steps)):
        raise _Bad(f"the steps attribute must be a JSON list of step numbers, got {echo(v)}")
    return steps


def _step_groups(f: h5py.File) -> list[int]:
    names = list(f.keys())
    if len(names) > MAX_STEPS:
        raise _Bad(f"{len(names)} objects at the root (limit {MAX_STEPS} steps)")
    steps = []
    for name in names:
        number = name.removeprefix("step_")
        if not name.startswith("step_") or not number.isdigit() or number != str(int(number)):
            raise _Bad(f"/{echo(name)[1:-1]} is not a step group (expected step_<number>); "
                       "the file is damaged or not written by xray")
        link = f.get(name, getlink=True)
        if not isinstance(link, h5py.HardLink) or not isinstance(f[name], h5py.Group):
            raise _Bad(f"/{name} is not a group stored in the file")
        steps.append(int(number))
    return sorted(steps)


def _check_index(f: h5py.File, step: int, checked: set[str]) -> None:
    ds = open_dataset(f, f"{step_group(step)}/{INDEX}")
    where = f"/{step_group(step)}/{INDEX}"
    names = ds.dtype.names
    if names is None:
        raise _Bad(f"{where} is not a table (dtype {ds.dtype})")
    missing = set(INDEX_DTYPE.names) - OPTIONAL_COLUMNS - set(names)
    if missing:
        raise _Bad(f"{where} lacks columns {sorted(missing)}; the file is damaged or not written by xray")
    if ds.ndim != 1:
        raise _Bad(f"{where} has shape {ds.shape}; an index table is one-dimensional")
    if ds.shape[0] > MAX_ROWS:
        raise _Bad(f"{where} has {ds.shape[0]} rows (limit {MAX_ROWS})")
    for column in names:
        kind = ds.dtype[column].kind
        expected = ("i" if column in _INT_COLUMNS else "f" if column in _FLOAT_COLUMNS
                    else "b" if column in _BOOL_COLUMNS else "SO")
        if column in INDEX_DTYPE.names and kind not in expected and not (expected == "i" and kind == "u"):
            raise _Bad(f"{where} column {column!r} has type {ds.dtype[column]}, not the layout's")
    n = 0
    headers = None
    for start in range(0, ds.shape[0], _CHUNK):
        for row in ds[start:start + _CHUNK].tolist():
            try:
                headers = _check_row(f, step, row, checked, headers)
            except _Bad as e:
                raise _Bad(f"{where} row {n}: {e}") from None
            n += 1


def _check_row(f: h5py.File, step: int, row: tuple, checked: set[str], headers: dict | None) -> dict | None:
    """Check one index row; returns the step's dataset headers once they were needed."""
    (seq, name, module, cls, call_index, direction, role, key, dtype, shape, device, _requires_grad,
     *_floats, nan, posinf, neginf, numel, data) = row[:21]
    for what, v in (("seq", seq), ("call_index", call_index), ("nan", nan), ("posinf", posinf),
                    ("neginf", neginf), ("numel", numel)):
        if v < 0:
            raise _Bad(f"{what} is negative ({v})")
    name = _text(name, "name", MAX_TEXT)
    _text(module, "module")
    _text(cls, "cls")
    if _text(direction, "direction") not in _DIRECTIONS:
        raise _Bad(f"direction must be forward or backward, got {echo(direction)}")
    role = _text(role, "role")
    if role not in ROLES:
        raise _Bad(f"unknown role {echo(role)}")
    key = _text(key, "key")
    if role in _OUTPUT_ROLES and not (key.isdigit() and int(key) < MAX_ITEMS):
        raise _Bad(f"{role} key must be an output index below {MAX_ITEMS}, got {echo(key)}")
    try:
        torch_dtype = dtype_from_name(_text(dtype, "dtype"))
    except ValueError:
        raise _Bad(f"unknown dtype {echo(dtype)}") from None
    shape_text = _text(shape, "shape")
    try:
        dims = parse_json(shape_text)
    except (ValueError, RecursionError):
        dims = None
    if (not isinstance(dims, list) or len(dims) > MAX_DIMS
            or not all(type(d) is int and 0 <= d < (1 << 62) for d in dims)):
        raise _Bad(f"shape must be a JSON list of at most {MAX_DIMS} sizes >= 0, got {echo(shape_text)}")
    if math.prod(dims) != numel:
        raise _Bad(f"numel {numel} disagrees with shape {shape_text}")
    _text(device, "device")
    if len(row) > 21:
        _text(row[21], "keyword")
    if len(row) > 22:
        source = _text(row[22], "source", MAX_TEXT)
        try:
            Source.parse(source or None)
        except ValueError as e:
            raise _Bad(str(e)) from None
    data = _text(data, "data", MAX_TEXT)
    if data and data not in checked:
        if headers is None:
            headers = _dataset_headers(f, step)
        _check_data(f, step, data, tuple(dims), torch_dtype, headers)
        checked.add(data)
    return headers


def _check_data(f: h5py.File, step: int, data: str, shape: tuple, torch_dtype: torch.dtype,
                headers: dict[str, Any]) -> None:
    """The header of the dataset a row names (never its bytes): where it is, its shape, and its
    element width against the row's dtype (the bytes are reinterpreted as that dtype)."""
    prefix = f"{step_group(step)}/"
    if not data.startswith(prefix):
        raise _Bad(f"data {echo(data)} is not in its step's group")
    name = data[len(prefix):]
    if "/" in name or not headers:  # not a member of the step group itself: the general path
        try:
            ds = open_dataset(f, data)
        except KeyError:
            raise _Bad(f"data {echo(data)} names no dataset in the file") from None
        except UnsafeDatasetError as e:
            raise _Bad(_line(e).replace(str(f.filename) + ":", "")) from None
        header = (ds.shape, ds.dtype.itemsize, ds.dtype.kind, stored_dtype_name(ds))
    else:
        header = headers.get(name)
        if header is None:
            raise _Bad(f"data {echo(data)} names no dataset in the file")
        if isinstance(header, str):
            raise _Bad(f"data {echo(data)}: refused: {header}")
    ds_shape, itemsize, kind, stored = header
    if tuple(ds_shape) != shape:
        raise _Bad(f"dataset {echo(data)} has shape {list(ds_shape)}, the index says {list(shape)}")
    stored = _text(stored, f"dataset {echo(data)}'s torch_dtype attribute")
    try:
        stored_dtype = dtype_from_name(stored)
    except ValueError:
        raise _Bad(f"dataset {echo(data)} has an unknown torch_dtype {echo(stored)}") from None
    width = torch.empty((), dtype=torch_dtype).element_size()
    if stored_dtype != torch_dtype or itemsize != width or kind not in "biufc":
        raise _Bad(f"dataset {echo(data)} holds {kind}{itemsize} data tagged {stored}, the index says "
                   f"{dtype_name(torch_dtype)}")


_LINK_KINDS = {h5py.h5l.TYPE_SOFT: "SoftLink", h5py.h5l.TYPE_EXTERNAL: "ExternalLink"}
_TYPE_KINDS = {h5py.h5t.INTEGER: "i", h5py.h5t.FLOAT: "f", h5py.h5t.ENUM: "b", h5py.h5t.COMPOUND: "c"}


def _dataset_headers(f: h5py.File, step: int) -> dict[str, Any]:
    """Every member of a step group: (shape, element size, kind, torch_dtype) for a dataset
    stored in the file, else why it is refused. The same refusals as tensorio.open_dataset
    (links, external storage, virtual datasets), through h5py's low-level API in one pass:
    ~70 us a dataset against ~500 us through the high-level one, for thousands per step."""
    group = f[step_group(step)].id
    links: dict[str, int] = {}

    def visit(name: bytes, info) -> None:
        links[name.decode("utf-8", "replace")] = info.type
        return None

    group.links.iterate(visit, info=True)
    headers: dict[str, Any] = {}
    for name, kind in links.items():
        if kind != h5py.h5l.TYPE_HARD:
            headers[name] = f"a {_LINK_KINDS.get(kind, 'user-defined link')}, not stored in the file"
            continue
        obj = h5py.h5o.open(group, name.encode())
        if not isinstance(obj, h5py.h5d.DatasetID):
            headers[name] = f"not a dataset (a {type(obj).__name__.removesuffix('ID')})"
            continue
        plist = obj.get_create_plist()
        if plist.get_layout() == h5py.h5d.VIRTUAL:
            headers[name] = "a virtual dataset (its bytes are mapped from other files)"
            continue
        if plist.get_external_count():
            headers[name] = "external storage (its bytes live in another file)"
            continue
        tid = obj.get_type()
        stored = ""
        if h5py.h5a.exists(obj, DTYPE_ATTR.encode()):
            attr = h5py.h5a.open(obj, DTYPE_ATTR.encode())
            if attr.shape not in ((), (1,)) or attr.dtype.kind not in "SOU":
                headers[name] = f"its {DTYPE_ATTR} attribute is not a text"
                continue
            buf = np.empty(attr.shape, dtype=attr.dtype)
            attr.read(buf)
            stored = buf.reshape(()).item() if buf.size else ""
        else:
            stored = h5py.Dataset(obj).dtype.name  # untagged: numpy's own name, as read_dataset does
        headers[name] = (obj.shape, tid.get_size(), _TYPE_KINDS.get(tid.get_class(), "?"), stored)
    return headers


def _aten(f: h5py.File, step: int) -> list[Record]:
    where = f"/{step_group(step)}/{ATEN}"
    ds = open_dataset(f, f"{step_group(step)}/{ATEN}")
    if ds.ndim != 1 or ds.dtype.kind not in "SO" or ds.shape[0] > MAX_ROWS:
        raise _Bad(f"{where} must be a list of JSON text lines, got {ds.dtype} of shape {ds.shape}")
    out = []
    for i, line in enumerate(ds[()].tolist()):
        try:
            rec = Record.from_json(parse_json(_text(line, "the line", MAX_TEXT * 16)))
        except _Bad as e:
            raise _Bad(f"{where} record #{i}: {e}") from None
        except (KeyError, TypeError, ValueError, RecursionError) as e:
            raise _Bad(f"{where} record #{i} is malformed ({type(e).__name__}: {_line(e)})") from None
        out.append(rec)
    return out
