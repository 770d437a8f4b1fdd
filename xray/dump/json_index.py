"""Write any trace dump's index as the JSON of format version 2: one readable record per object.

For people and for tools that read JSON (jq, a diff of two runs' records), and for tests that
tamper with records: version 3 keeps its index in columns, which is fast but not plain text.
The result is an ordinary dump that every reader still opens. ``xray export-json`` runs it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .protocol import Dump
from .reader import INDEX_NAME
from .writer import INDEX

JSON_VERSION = 2  # the last version whose dump.json held the records


def write_json_index(dump: Dump, out: str | os.PathLike) -> Path:
    """Write ``dump``'s header and records as a version-2 ``dump.json`` at ``out`` (a file path,
    or a folder to put ``dump.json`` in); atomically. Returns the file written."""
    path = Path(out)
    if path.is_dir():
        path = path / INDEX
    head = dict(dump.header, format_version=JSON_VERSION, complete=dump.complete,
                summary=getattr(dump, "summary", {}) or {})
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
    index = json.loads((folder / INDEX).read_text(encoding="utf-8")).get("index")
    with load_dump(folder) as dump:
        path = write_json_index(dump, folder)
    if isinstance(index, str) and INDEX_NAME.fullmatch(index):  # the reader's rule: never a path
        (folder / index).unlink(missing_ok=True)
    return path
