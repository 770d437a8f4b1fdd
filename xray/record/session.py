"""begin_dump / end_dump / dump(): the one explicit piece of global state, the active session."""
from __future__ import annotations

import atexit
import os
import platform
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from .config import DumpConfig
from .ranks import dist_ranks
from ..dump.critical import critical_section
from ..dump.folder_owner import new_token, own_folder
from ..dump.writer import DumpWriteError, DumpWriter
from ..dump.dispatch_modes import no_dispatch_modes
from ..numerics import math_settings
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
            "math": math_settings.current(),  # the floors compare allows this run (docs/format.md)
        }
        self.writer = DumpWriter(folder, header, flush_records=config.flush_records,
                                 flush_seconds=config.flush_seconds, flush_bytes=config.flush_bytes)
        self.recorder = Recorder(config, self.writer)
        self.tracing = Tracing(self.recorder)
        self.started = time.perf_counter()
        self.thread = threading.current_thread().name
        self.program: dict | None = None  # how a recorded script ended (mark_program)

    def start(self) -> None:
        self.tracing.start()

    def pause(self) -> None:
        self.tracing.stop()

    def summary(self) -> dict:
        r = self.recorder
        summary = {"op_calls": r.op_calls, "records": r.records_written, "tensors_saved": r.tensors_saved,
                   "seconds": round(time.perf_counter() - self.started, 6), "error": r.failed}
        if r.stopped is not None:  # compare's verdict says "recording stopped at ..."
            summary["stopped"] = r.stopped
        if r.unrecorded_backward:  # backward ran, X_DEBUG without BACKWARD: compare's verdict says so
            summary["unrecorded"] = {"backward_calls": r.unrecorded_backward}
        return summary if self.program is None else dict(summary, program=self.program)

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
# begin_dump/end_dump run whole or not at all, one at a time: two threads beginning at once
# cannot both start, and a signal waits until the session is consistent (critical_section).
_LOCK = threading.RLock()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker, a multiprocessing Process) inherits the parent's
    session: its recorder goes quiet there (tracer._after_fork_in_child) and its files stay the
    parent's. The child holds no session of its own, so it may begin a dump of its own
    (``proc_<child pid>``); an end_dump of the parent's session, if the child runs that code,
    leaves the parent's dump alone. The lock is new too: another thread may have held it."""
    global _ACTIVE, _PAUSED, _INHERITED, _LOCK
    _INHERITED = _ACTIVE or _PAUSED or _INHERITED
    _ACTIVE = _PAUSED = None
    _LOCK = threading.RLock()


_INHERITED: DumpSession | None = None  # in a forked child: the parent's session, never ended here
os.register_at_fork(after_in_child=_after_fork_in_child)


def _rank() -> int | None:
    return dist_ranks()[0]


def process_folder(dump_dir: Path) -> Path:
    """``rank_<r>`` under torch.distributed (or torchrun), else ``proc_<pid>``."""
    rank = _rank()
    return Path(dump_dir) / (f"rank_{rank}" if rank is not None else f"proc_{os.getpid()}")


def begin_dump(X_DEBUG: int | None = None, X_DEDUP: bool | None = None, X_DUMP_NUM: int | None = None,
               dump_dir: str | os.PathLike | None = None, **options) -> Path | None:
    """Start recording every ATen call and module boundary; returns the dump folder.

    Arguments left out come from the environment variables of the same names (X_DUMP_DIR for
    ``dump_dir``), then defaults. An unwritable ``dump_dir`` gives a warning and no dump (the
    program goes on). One session records at a time in a process: begin_dump while a dump is
    active (from any thread) raises DumpUsageError and leaves that dump alone. Every session
    gets its own folder: one that another live process, or an earlier session of this one,
    wrote is left alone, and this one gets ``<folder>.<pid>`` (then ``-2``...) and a warning.
    Only this process and thread are recorded.
    """
    return _begin(X_DEBUG, X_DEDUP, X_DUMP_NUM, dump_dir, options, [])


def _begin(X_DEBUG, X_DEDUP, X_DUMP_NUM, dump_dir, options: dict, begun: list) -> Path | None:
    """begin_dump; the session started goes into ``begun`` before a held signal can strike."""
    global _ACTIVE, _PAUSED
    with _LOCK, critical_section():
        if _ACTIVE is not None:
            raise DumpUsageError(f"begin_dump() called while a dump into {_ACTIVE.folder} is active "
                                 f"(begun in thread {_ACTIVE.thread!r}); xray records one session per process "
                                 "at a time: call end_dump() first")
        if _PAUSED is not None and not any(v is not None for v in (X_DEBUG, X_DEDUP, X_DUMP_NUM, dump_dir)):
            session, _PAUSED = _PAUSED, None  # resume after end_dump(clear_context=False)
            session.thread = threading.current_thread().name
            session.start()
            _ACTIVE = session
            begun.append(session)
            return session.folder
        if _PAUSED is not None:
            paused, _PAUSED = _PAUSED, None
            paused.finish()
        config = DumpConfig.resolve(X_DEBUG, X_DEDUP, X_DUMP_NUM, dump_dir, **options)
        token = new_token()
        try:
            folder = own_folder(process_folder(config.dump_dir), token)
            session = DumpSession(config, folder)
        except DumpWriteError as e:
            warnings.warn(f"xray: not dumping: {e}. Pass a writable dump_dir (or set X_DUMP_DIR).",
                          RuntimeWarning, stacklevel=3)
            return None
        try:
            session.start()
        except BaseException:
            session.finish()  # the dump mode and hooks off again, the empty dump closed
            raise
        _ACTIVE = session
        begun.append(session)
        return folder


def mark_program(script: str, status: int, failure: str | None) -> None:
    """Note in the active dump's summary how the recorded program ended (``xray record``):
    ``{"script", "status", "failure"}``; a dump of a failed run says so."""
    if _ACTIVE is not None:
        _ACTIVE.program = {"script": script, "status": status, "failure": failure}


def end_dump(clear_context: bool = True) -> Path | None:
    """Stop recording, write dump.json, and return the dump folder.

    With ``clear_context=False`` the session is kept: dump.json is written, and the next
    ``begin_dump()`` without arguments continues the same dump (same de-dup table).
    """
    global _ACTIVE, _PAUSED, _INHERITED
    with _LOCK, critical_section():
        if _ACTIVE is None and _INHERITED is not None:  # a forked child ends the parent's session
            _INHERITED = None
            return None
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


@atexit.register
def _end_at_exit() -> None:
    """A program that exits with a dump still open (sys.exit, an uncaught exception, a handled
    signal, no end_dump) gets its dump.json written, so nothing since the last flush is lost."""
    global _PAUSED
    if not _LOCK.acquire(timeout=10):  # a daemon thread frozen mid-begin: exit rather than hang
        return
    try:
        if any(s is not None and s.writer.pid != os.getpid() for s in (_ACTIVE, _PAUSED)):
            return  # a forked child: the dump is the parent's
        if _ACTIVE is not None:
            warnings.warn(f"xray: the program exits with a dump open; writing {_ACTIVE.folder}", RuntimeWarning)
            end_dump()
        if _PAUSED is not None:
            paused, _PAUSED = _PAUSED, None
            paused.finish()
    finally:
        _LOCK.release()


def active_session() -> DumpSession | None:
    return _ACTIVE


@contextmanager
def dump(X_DEBUG: int | None = None, X_DEDUP: bool | None = None, X_DUMP_NUM: int | None = None,
         dump_dir: str | os.PathLike | None = None, **options) -> Iterator[DumpSession | None]:
    """``with xray.dump(...) as d:`` records the block; ``d.folder`` is the dump folder. Whatever
    ends the block (an exception, Ctrl-C, sys.exit) ends the dump, with dump.json written."""
    begun: list[DumpSession] = []
    try:
        _begin(X_DEBUG, X_DEDUP, X_DUMP_NUM, dump_dir, options, begun)
        yield begun[0] if begun else None
    finally:
        if begun and _ACTIVE is begun[0]:
            end_dump()
