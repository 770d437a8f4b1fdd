"""Signals wait while a dump's bookkeeping is half done.

Ctrl-C (KeyboardInterrupt) or a program's own signal handler (a SIGTERM handler that calls
sys.exit) can strike between any two bytecodes. Inside begin_dump, end_dump or a flush, that
left a session half started (its dispatch mode on, no one to end it) or a journal chunk half
made. ``critical_section`` holds every signal that has a Python handler until the block ends,
then delivers it again: the program still stops, one step later, with the dump whole.
"""
from __future__ import annotations

import signal
import threading

try:  # the C functions under the signal module: its wrappers convert every handler to an enum
    import _signal as _raw
except ImportError:  # another Python implementation
    _raw = signal
from contextlib import contextmanager
from typing import Iterator

_held = threading.local()


_NUMBERS = sorted(int(s) for s in signal.valid_signals())  # plain ints: enum lookups cost 5 us each


def _python_handled() -> list[int]:
    """The signals whose handler is Python code (SIGINT's default_int_handler included)."""
    found = []
    getsignal = _raw.getsignal
    for sig in _NUMBERS:
        try:
            if callable(getsignal(sig)):
                found.append(sig)
        except (ValueError, OSError):
            continue
    return found


@contextmanager
def critical_section() -> Iterator[None]:
    """Hold signals with Python handlers until the block ends (main thread only: Python runs
    every handler there; in another thread the block runs as is). Re-entrant."""
    if threading.current_thread() is not threading.main_thread() or getattr(_held, "depth", 0):
        _held.depth = getattr(_held, "depth", 0) + 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    arrived: list[int] = []
    saved = {}
    try:
        for sig in _python_handled():
            saved[sig] = _raw.signal(sig, lambda signum, frame: arrived.append(signum))
    except BaseException:
        for sig, handler in saved.items():
            _raw.signal(sig, handler)
        raise
    _held.depth = 1
    try:
        yield
    finally:
        _held.depth = 0
        for sig, handler in saved.items():
            _raw.signal(sig, handler)
        for signum in dict.fromkeys(arrived):  # each once, in arrival order, to its own handler
            signal.raise_signal(signum)
