"""The dump format: data model, tensor I/O, writer and readers (docs/format.md)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .protocol import Dump

# Submodules load on first use (PEP 562): a command's --help that imports one leaf of the ground
# floor (dump.csv_cells, dump.atomic) must not pay for torch and h5py.
_LAZY = {"FORMAT_NAME": "model", "FORMAT_VERSION": "model", "Record": "model", "Scalar": "model", "Source": "model",
         "Stats": "model", "TensorMeta": "model", "ModuleDump": "module_reader", "read_module_dump": "module_reader",
         "Dump": "protocol", "DumpFormatError": "errors", "RefusedRecordsWarning": "errors",
         "TruncatedDumpWarning": "errors", "TraceDump": "reader", "read_trace": "reader"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "Record", "Scalar", "Source", "Stats", "TensorMeta", "DumpFormatError",
           "Dump", "TraceDump", "ModuleDump", "TruncatedDumpWarning", "RefusedRecordsWarning", "read_module_dump", "load_dump",
           "find_dump_folders"]


def find_dump_folders(path: str | os.PathLike) -> list[Path]:
    """Every trace-dump folder at or directly under ``path`` (one per process or rank)."""
    p = Path(path)
    if p.is_file():
        p = p.parent
    if (p / "dump.json").exists() or (p / "journal.jsonl").exists():
        return [p]
    if not p.is_dir():
        return []
    return sorted(d for d in p.iterdir()
                  if d.is_dir() and ((d / "dump.json").exists() or (d / "journal.jsonl").exists()))


def load_dump(path: str | os.PathLike, *, rank: int | None = None) -> Dump:
    """Open any xray dump: a trace folder, its dump.json, a dump_dir holding one process
    folder, or a module-level ``.h5`` written by PrecisionDebugger; or another tool's dump a
    reader in ``formats`` claims (mindstudio-probe's ``dump.json`` folders). Returns an object whose
    ``.records`` iterate in execution order. ``rank`` picks ``rank_<rank>/`` of a multi-rank
    dump_dir (only that rank's files are opened)."""
    from .errors import DumpFormatError
    from .module_reader import read_module_dump
    from .reader import read_trace

    p = Path(path)
    if rank is not None:
        if not (p / f"rank_{rank}").is_dir():
            raise DumpFormatError(f"{p}: no rank_{rank}/ folder here")
        p = p / f"rank_{rank}"
    if not p.exists():
        raise DumpFormatError(f"{p}: no such file or folder")
    if p.is_file() and p.suffix in (".h5", ".hdf5"):
        return read_module_dump(p)
    if p.is_file() and p.name not in ("dump.json", "journal.jsonl"):
        raise DumpFormatError(f"{p}: expected a dump folder, its dump.json, or a module-level .h5 file")
    folders = find_dump_folders(p)
    if not folders:
        raise DumpFormatError(f"{p}: no xray dump here (no dump.json or journal.jsonl)")
    if len(folders) > 1:
        names = ", ".join(f.name for f in folders)
        raise DumpFormatError(f"{p} holds {len(folders)} dumps ({names}); pass one of them")
    from .formats import reader_for

    foreign = reader_for(folders[0])
    return foreign.open(folders[0]) if foreign is not None else read_trace(folders[0])
