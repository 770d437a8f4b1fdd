"""Output files appear whole or not at all.

A full disk or a kill mid-write must not leave a complete-looking, truncated CSV/JSON/HTML over
the previous good one: writers go through a temporary name in the same folder and rename into
place (atomic on POSIX), and a failure names the file and removes the temporary.
"""
from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


class OutputWriteError(OSError):
    """An output file could not be written; the message names it. The previous file is intact."""


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """``open(path, mode)`` through ``.<name>.<pid>-<random>.tmp``, renamed into place on success.
    The temporary is unique to this write: two runs (or threads) writing the same output never
    share one, and the last to finish leaves its whole file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputWriteError(e.errno, f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_writable(*paths: str | os.PathLike | None) -> None:
    """Raise OutputWriteError, worded as a failed write would be, for an output file whose folder
    is missing or that names a folder: checked before the work, so a long run never ends in it."""
    import errno

    for path in filter(None, paths):
        path = Path(path)
        code = errno.EISDIR if path.is_dir() else None if path.parent.is_dir() else errno.ENOENT
        if code is not None:
            raise OutputWriteError(code, f"cannot write {path}: {os.strerror(code)}")


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


def partial_path(path: str | os.PathLike) -> Path:
    """Where a file written row by row grows until it is complete (then renamed to ``path``):
    ``<name>.<pid>-<random>.partial``, unique to this writer, so two runs into one folder
    never write, rename or delete each other's."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
