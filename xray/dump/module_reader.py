"""Read a module dump (``xray-module``) into the shared data model, lazily.

Only the small per-step index tables are read to build records; tensor data is read on demand
by ``load_tensor``, so a multi-GB file is listed and summarised in bounded memory.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import h5py
import numpy as np
import torch

from .model import Record, Stats, TensorMeta
from .reader import DumpFormatError, TruncatedDumpWarning
from .tensorio import open_dataset, read_dataset
from .module_layout import (ATEN, FORMAT_NAME, FORMAT_VERSION, INDEX, INDEX_DTYPE, OPTIONAL_COLUMNS, STATE_ROLES,
                            step_group)

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


def _attr(v: Any) -> Any:
    if isinstance(v, bytes):
        v = v.decode("utf-8")
    if isinstance(v, np.generic):
        v = v.item()
    return v


class ModuleDump:
    """A module dump: ``.records`` (module calls, then ATen ops if recorded) in execution order,
    ``.header``, ``named_tensors()``, tensors on demand. Same interface as TraceDump."""

    def __init__(self, path: Path, f: h5py.File, header: dict[str, Any], complete: bool) -> None:
        self.path = path
        self.folder = path.parent
        self.header = header
        self.complete = complete
        self._f = f
        self._records: list[Record] | None = None

    @property
    def format(self) -> str:
        return FORMAT_NAME

    @property
    def rank(self) -> int | None:
        return self.header.get("global_rank")

    @property
    def steps(self) -> list[int]:
        return sorted(int(k.removeprefix("step_")) for k in self._f.keys() if k.startswith("step_"))

    def __repr__(self) -> str:
        state = "complete" if self.complete else "INCOMPLETE"
        return f"ModuleDump({str(self.path)!r}, steps {self.steps}, {state})"

    # -- lazy row access -------------------------------------------------------------------
    def _index(self, step: int) -> h5py.Dataset | None:
        g = self._f.get(step_group(step))
        if g is None or INDEX not in g:
            return None
        ds = open_dataset(self._f, f"{step_group(step)}/{INDEX}")
        missing = set(INDEX_DTYPE.names) - OPTIONAL_COLUMNS - set(ds.dtype.names or ())
        if missing:
            raise DumpFormatError(f"{self.path}: /{step_group(step)}/{INDEX} lacks columns {sorted(missing)}; "
                                  "the file is damaged or not written by xray")
        return ds

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
        for s in self.steps:
            g = self._f[step_group(s)]
            if ATEN not in g:
                continue
            for i, line in enumerate(open_dataset(self._f, f"{step_group(s)}/{ATEN}").asstr()[()]):
                try:
                    rec = Record.from_json(json.loads(line))
                except (KeyError, TypeError, ValueError) as e:
                    raise DumpFormatError(f"{self.path}: /{step_group(s)}/{ATEN} record #{i} is malformed "
                                          f"({type(e).__name__}: {e})") from e
                rec.step = s
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
        return open_dataset(self._f, ref)

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
        meta = TensorMeta(shape=tuple(json.loads(_s(shape))), dtype=_s(dtype), device=_s(device),
                          requires_grad=bool(requires_grad), stats=stats, data=data or None, source=source or None)
        yield TensorRow(step, int(seq), _s(name), module, _s(cls), int(call_index), _s(direction), role,
                        key, meta, _s(row[21]) if len(row) > 21 else "")


def read_module_dump(path: str | os.PathLike) -> ModuleDump:
    """Open a PrecisionDebugger ``.h5`` file; refuses files that are not xray module dumps and
    warns (TruncatedDumpWarning) about files whose writer never finished."""
    p = Path(path)
    if not p.exists():
        raise DumpFormatError(f"{p}: no such file")
    try:
        f = h5py.File(p, "r")
    except OSError as e:
        raise DumpFormatError(f"{p}: not a readable HDF5 file (truncated or corrupt?): {e}") from None
    try:
        header = {k: _attr(v) for k, v in f.attrs.items()}
        if header.get("format") != FORMAT_NAME:
            raise DumpFormatError(f"{p}: not an xray module dump (format attribute is {header.get('format')!r})")
        version = header.get("format_version")
        if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
            raise DumpFormatError(f"{p}: module dump format version {version!r} is not supported by this xray "
                                  f"(reads versions 1..{FORMAT_VERSION}); upgrade xray or re-record the dump")
        for k in ("steps",):
            if isinstance(header.get(k), str):
                header[k] = json.loads(header[k])
        complete = bool(header.pop("complete", False))
    except BaseException:
        f.close()
        raise
    if not complete:
        warnings.warn(f"{p}: module dump was never finished (stop() not called, or the process died); "
                      "its index may be missing, so records can be incomplete", TruncatedDumpWarning, stacklevel=2)
    return ModuleDump(p, f, header, complete)
