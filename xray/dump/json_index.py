"""Write any trace dump's index as the JSON of format version 2: one readable record per object.

For people and for tools that read JSON (jq, a diff of two runs' records), and for tests that
tamper with records: version 3 keeps its index in columns, which is fast but not plain text.
The result is an ordinary dump that every reader still opens. ``xray export-json`` runs it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .model import parse_json
from .protocol import Dump
from .reader import INDEX_NAME
from .writer import INDEX

JSON_VERSION = 2  # the last version whose dump.json held the records
# The first key of every export: the proof that an existing file is one this module wrote, and
# so may be replaced (any other file, a recorded dump's own dump.json above all, is refused).
EXPORTED_BY = "exported_by"
_MARK = '{"%s":"xray export-json"' % EXPORTED_BY
# What a dump folder holds besides dump.json (writer, folder_owner): a new dump.json among them
# would make that dump read as another, and a crashed one's journal unrecoverable.
_DUMP_PARTS = ("owner.pid", "journal.jsonl", "journal-*.h5", "tensors-*.h5", "index-*.h5")


class ExportTargetError(ValueError):
    """The export's output exists and cannot be proven to be an earlier export."""


def export_target(out: str | os.PathLike) -> Path:
    """The file an export to ``out`` writes (``out``, or ``out/dump.json`` for a folder), or
    ``ExportTargetError`` when that would replace something this module did not write: a file
    without its mark, or a folder that holds a dump's files."""
    path = Path(out)
    if path.is_dir():
        held = next((p.name for pattern in _DUMP_PARTS for p in path.glob(pattern)), None)
        if held is not None:
            raise ExportTargetError(f"{path} holds a dump ({held}); export into a new file or folder "
                                    "(nothing was overwritten)")
        path = path / INDEX
    if os.path.lexists(path) and not _is_export(path):
        raise ExportTargetError(f"{path} exists and was not written by xray export-json; pass a new file "
                                "(nothing was overwritten)")
    return path


def _is_export(path: Path) -> bool:
    try:
        if path.is_symlink() or not path.is_file():
            return False
        with open(path, "rb") as f:
            return f.read(len(_MARK)) == _MARK.encode()
    except OSError:
        return False


def write_json_index(dump: Dump, out: str | os.PathLike, *, replace: bool = False) -> Path:
    """Write ``dump``'s header and records as a version-2 ``dump.json`` at ``out`` (a file path,
    or a folder to put ``dump.json`` in); atomically. Returns the file written. Only an earlier
    export is replaced (``export_target``); ``replace=True`` replaces whatever is there."""
    path = Path(out)
    if not replace:
        path = export_target(path)
    elif path.is_dir():
        path = path / INDEX
    head = {EXPORTED_BY: "xray export-json", **{k: v for k, v in dump.header.items() if k != EXPORTED_BY}}
    head.update(format_version=JSON_VERSION, complete=dump.complete, summary=getattr(dump, "summary", {}) or {})
    head.pop("index", None)
    text = json.dumps(head, separators=(",", ":"), default=str)
    from .atomic import atomic_write

    with atomic_write(path) as f:  # a full disk leaves neither a partial file nor a temporary
        f.write(text[:-1] + ',"records":[')
        for i, rec in enumerate(dump.records):
            f.write(("," if i else "") + json.dumps(rec.to_json(), separators=(",", ":"), default=str))
        f.write("]}")
    return path


def rewrite_as_json(folder: str | os.PathLike) -> Path:
    """Turn a finished trace-dump folder's index into a version-2 ``dump.json`` in place (the
    columnar index file is removed); the saved tensors stay where they are."""
    from . import load_dump

    folder = Path(folder)
    index = parse_json((folder / INDEX).read_text(encoding="utf-8")).get("index")
    with load_dump(folder) as dump:
        path = write_json_index(dump, folder, replace=True)  # its own index, in place
    if isinstance(index, str) and INDEX_NAME.fullmatch(index):  # the reader's rule: never a path
        (folder / index).unlink(missing_ok=True)
    return path
