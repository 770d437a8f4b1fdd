"""Third-party output of a backend run goes to ``OUT/drift.log``, not to the user's terminal.

Lowering and running a whole model on a backend makes torch, ExecuTorch and ONNX Runtime write
warnings, C++ log lines and whole tracebacks (torch's fake-tensor traceback when XNNPACK
lowering fails) on stderr: they bury xray's own report. While a backend runs, file descriptor 2
and ``sys.stderr`` both point into the log, so Python's writers, ``logging`` handlers made
earlier (torch's, on the stderr of their day: re-pointed for the block) and C++ code all land
there; the console gets xray's lines only.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Iterator

LOG_NAME = "drift.log"


@contextmanager
def into_log(log: Path, title: str) -> Iterator[None]:
    """Send everything written on stderr during the block to ``log`` (appended, under ``title``)."""
    with open(log, "a", encoding="utf-8", errors="replace") as f:
        f.write(f"==== {title} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        f.flush()
        sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no file descriptor 2 (an embedded interpreter): Python's writers only
            saved = None
        if saved is not None:
            os.dup2(f.fileno(), 2)
        handlers = _stderr_handlers()
        for h in handlers:
            h.setStream(f)
        try:
            with redirect_stderr(f):
                yield
        finally:
            try:
                sys.stderr.flush()
            finally:
                for h, stream in handlers.items():
                    h.setStream(stream)
                if saved is not None:
                    os.dup2(saved, 2)
                    os.close(saved)


def _stderr_handlers() -> dict[logging.StreamHandler, object]:
    """Every logging handler writing to stderr (as it was when the handler was made), with its stream."""
    streams = {id(sys.stderr), id(sys.__stderr__)}
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    return {h: h.stream for lg in loggers for h in lg.handlers
            if type(h) is logging.StreamHandler and id(h.stream) in streams}


def log_exception(log: Path, error: BaseException) -> None:
    """Append ``error``'s whole traceback (and its causes) to the log."""
    with open(log, "a", encoding="utf-8", errors="replace") as f:
        f.write("".join(traceback.format_exception(error)))


def full_message(error: BaseException) -> str:
    """The error's whole message, then each cause's, without tracebacks: what the report keeps."""
    parts, seen = [], set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append("".join(traceback.format_exception_only(e)).strip())
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return "\ncaused by: ".join(parts)
