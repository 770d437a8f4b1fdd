"""begin_dump / end_dump / dump(): the one explicit piece of global state, the active session."""
from __future__ import annotations

import os
import platform
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from .config import DumpConfig
from .ranks import dist_ranks
from ..dump.writer import DumpWriteError, DumpWriter
from ..modes import no_dispatch_modes
from .tracer import Recorder, Tracing


class DumpUsageError(RuntimeError):
    """begin_dump/end_dump called out of order."""


class DumpSession:
    def __init__(self, config: DumpConfig, folder: Path) -> None:
        self.config = config
        self.folder = folder
        header = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": config.to_json(),
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "host": platform.node(),
            "pid": os.getpid(),
            "rank": _rank(),
        }
        self.writer = DumpWriter(folder, header, flush_records=config.flush_records,
                                 flush_seconds=config.flush_seconds, flush_bytes=config.flush_bytes)
        self.recorder = Recorder(config, self.writer)
        self.tracing = Tracing(self.recorder)
        self.started = time.perf_counter()

    def start(self) -> None:
        self.tracing.start()

    def pause(self) -> None:
        self.tracing.stop()

    def summary(self) -> dict:
        r = self.recorder
        return {"op_calls": r.op_calls, "records": r.records_written, "tensors_saved": r.tensors_saved,
                "seconds": round(time.perf_counter() - self.started, 6), "error": r.failed}

    def finish(self) -> Path | None:
        """Write dump.json. Never raises for the recorder's own problems: the user's program
        goes on, with a warning, and the journal keeps what was recorded."""
        self.pause()
        if self.recorder.failed is not None and self.writer.closed:  # an I/O error: warned already
            return self.folder
        try:
            with no_dispatch_modes():  # a user's mode outside ours must not see our file writes
                return self.writer.close(self.summary())
        except Exception as e:  # noqa: BLE001 - end_dump must not break the user's program
            warnings.warn(f"xray: {e}; the journal in {self.folder} still holds what was recorded",
                          RuntimeWarning, stacklevel=3)
            return self.folder


_ACTIVE: DumpSession | None = None
_PAUSED: DumpSession | None = None


def _rank() -> int | None:
    return dist_ranks()[0]


def process_folder(dump_dir: Path) -> Path:
    """``rank_<r>`` under torch.distributed (or torchrun), else ``proc_<pid>``."""
    rank = _rank()
    return Path(dump_dir) / (f"rank_{rank}" if rank is not None else f"proc_{os.getpid()}")


OWNER = "owner.pid"  # the pid of the process that writes (or last wrote) the folder


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if os.name == "nt":  # os.kill would terminate it there: assume the owner still runs
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def claim_folder(folder: Path) -> bool:
    """Make this process the folder's owner unless another live process owns it.

    A folder whose owner has exited is taken over (a re-run replaces its old dump, as always).
    The owner file is written whole under a private name and linked into place, so two
    processes claiming at once cannot both win, nor read a half-written pid."""
    folder.mkdir(parents=True, exist_ok=True)
    owner = folder / OWNER
    tmp = folder / f".{OWNER}.{os.getpid()}.tmp"
    tmp.write_text(str(os.getpid()))
    try:
        try:
            os.link(tmp, owner)
            return True
        except FileExistsError:
            pass
        except OSError:  # no hard links on this file system: exclusive create instead
            try:
                with open(owner, "x") as f:
                    f.write(str(os.getpid()))
                return True
            except FileExistsError:
                pass
        try:
            other = int(owner.read_text().strip())
        except (OSError, ValueError):
            other = 0
        if other != os.getpid() and _alive(other):
            return False
        os.replace(tmp, owner)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def own_folder(folder: Path) -> Path:
    """``folder``, or ``<folder>.<pid>`` beside it when another live process writes ``folder``
    (two processes with the same RANK and dump_dir): neither dump replaces the other."""
    try:
        if claim_folder(folder):
            return folder
        mine = folder.with_name(f"{folder.name}.{os.getpid()}")
        claim_folder(mine)
    except OSError as e:
        raise DumpWriteError(f"cannot write dump folder {folder}: {e.strerror or e}") from e
    warnings.warn(f"xray: {folder} is being written by another process (see its {OWNER}); "
                  f"this process dumps into {mine}", RuntimeWarning, stacklevel=3)
    return mine


def begin_dump(X_DEBUG: int | None = None, X_DEDUP: bool | None = None, X_DUMP_NUM: int | None = None,
               dump_dir: str | os.PathLike | None = None, **options) -> Path | None:
    """Start recording every ATen call and module boundary; returns the dump folder.

    Arguments left out come from the environment variables of the same names (X_DUMP_DIR for
    ``dump_dir``), then defaults. An unwritable ``dump_dir`` gives a warning and no dump (the
    program goes on); calling begin_dump while a dump is active is an error. A folder another
    live process writes (same RANK, same dump_dir) is left alone: this one gets
    ``<folder>.<pid>`` and a warning. Only this process and thread are recorded.
    """
    global _ACTIVE, _PAUSED
    if _ACTIVE is not None:
        raise DumpUsageError(f"begin_dump() called while a dump into {_ACTIVE.folder} is active; "
                             "call end_dump() first")
    if _PAUSED is not None and not any(v is not None for v in (X_DEBUG, X_DEDUP, X_DUMP_NUM, dump_dir)):
        _ACTIVE, _PAUSED = _PAUSED, None  # resume after end_dump(clear_context=False)
        _ACTIVE.start()
        return _ACTIVE.folder
    if _PAUSED is not None:
        _PAUSED.finish()
        _PAUSED = None
    config = DumpConfig.resolve(X_DEBUG, X_DEDUP, X_DUMP_NUM, dump_dir, **options)
    try:
        folder = own_folder(process_folder(config.dump_dir))
        session = DumpSession(config, folder)
    except DumpWriteError as e:
        warnings.warn(f"xray: not dumping: {e}. Pass a writable dump_dir (or set X_DUMP_DIR).",
                      RuntimeWarning, stacklevel=2)
        return None
    session.start()
    _ACTIVE = session
    return folder


def end_dump(clear_context: bool = True) -> Path | None:
    """Stop recording, write dump.json, and return the dump folder.

    With ``clear_context=False`` the session is kept: dump.json is written, and the next
    ``begin_dump()`` without arguments continues the same dump (same de-dup table).
    """
    global _ACTIVE, _PAUSED
    if _ACTIVE is None:
        raise DumpUsageError("end_dump() called without an active begin_dump()")
    session, _ACTIVE = _ACTIVE, None
    if clear_context:
        return session.finish()
    session.pause()
    _PAUSED = session
    if session.recorder.failed is not None and session.writer.closed:
        return session.folder
    try:
        with no_dispatch_modes():
            session.writer.flush()
            session.writer.snapshot(session.summary())
    except Exception as e:  # noqa: BLE001 - as in finish(): warn, never raise into the program
        warnings.warn(f"xray: {e}; the journal in {session.folder} still holds what was recorded",
                      RuntimeWarning, stacklevel=2)
    return session.folder


def active_session() -> DumpSession | None:
    return _ACTIVE


@contextmanager
def dump(X_DEBUG: int | None = None, X_DEDUP: bool | None = None, X_DUMP_NUM: int | None = None,
         dump_dir: str | os.PathLike | None = None, **options) -> Iterator[DumpSession | None]:
    """``with xray.dump(...) as d:`` records the block; ``d.folder`` is the dump folder."""
    folder = begin_dump(X_DEBUG, X_DEDUP, X_DUMP_NUM, dump_dir, **options)
    session = _ACTIVE
    try:
        yield session
    finally:
        if folder is not None and _ACTIVE is session:
            end_dump()
