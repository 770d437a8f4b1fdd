"""Progress for every xray command: a tqdm bar on a terminal, a plain line every few seconds elsewhere.

A bar redrawn with carriage returns turns a log file (CI, ``2> run.log``, nohup) into lines of
thousands of characters; a log wants one short line now and then instead. Every tool that
shows progress goes through ``progress()``, so the rule lives here once.
"""
from __future__ import annotations

import sys
import time
from typing import IO, Any, Iterable, Iterator

PLAIN_EVERY_S = 5.0  # seconds between two plain lines


def progress(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "", unit: str = "it",
             unit_scale: bool = False, enabled: bool = True, file: IO[str] | None = None,
             every_s: float = PLAIN_EVERY_S) -> Any:
    """A tqdm bar when ``file`` (stderr) is a terminal, else a ``PlainProgress``; nothing shown when
    not ``enabled``. Either one iterates ``iterable`` and has ``update(n)`` and ``close()``."""
    stream = file if file is not None else sys.stderr
    if enabled and _is_terminal(stream):
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, leave=False, file=stream)
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=stream,
                         every_s=every_s if enabled else None)


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class PlainProgress:
    """tqdm's ``update``/``close``/iteration, written as one short line at most every ``every_s``
    seconds and a last line at close (``every_s=None``: silent)."""

    def __init__(self, iterable: Iterable | None = None, *, total: float | None = None, desc: str = "",
                 unit: str = "it", unit_scale: bool = False, file: IO[str] | None = None,
                 every_s: float | None = PLAIN_EVERY_S) -> None:
        self.iterable = iterable
        self.total = total if total is not None else _len(iterable)
        self.desc, self.unit, self.unit_scale = desc, unit, unit_scale
        self.file = file if file is not None else sys.stderr
        self.every_s = every_s
        self.n = 0
        self.started = self._said = time.monotonic()
        self._closed = False

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.every_s is not None and now - self._said >= self.every_s:
            self._said = now
            self._say()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.every_s is not None and time.monotonic() - self.started >= self.every_s:
            self._say(done=True)  # a run too short for a line needs no closing line either

    def line(self, done: bool = False) -> str:
        count = _amount(self.n, self.unit, self.unit_scale)
        if self.total:
            count += f" of {_amount(self.total, self.unit, self.unit_scale)} ({100.0 * self.n / self.total:.0f}%)"
        state = "done" if done else "running"
        return f"{self.desc or 'progress'}: {count}, {time.monotonic() - self.started:.0f} s, {state}"

    def _say(self, done: bool = False) -> None:
        try:
            print(self.line(done), file=self.file, flush=True)
        except (OSError, ValueError):  # a closed or full log must not stop the work
            self.every_s = None


def _len(iterable: Iterable | None) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None


def _amount(n: float, unit: str, scale: bool) -> str:
    if scale:
        for prefix in ("", "k", "M", "G", "T"):
            if abs(n) < 1000:
                return f"{n:.3g} {prefix}{unit.strip()}"
            n /= 1000
        return f"{n:.3g} P{unit}"
    return f"{n:g} {unit.strip()}".rstrip()
