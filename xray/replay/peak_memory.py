"""The peak resident memory a block of work adds to its process (ahead-of-time export and
lowering), sampled from ``/proc/self/statm`` by a background thread; None where there is no /proc."""
from __future__ import annotations

import os
import threading
from pathlib import Path

STATM = Path("/proc/self/statm")
EVERY_S = 0.005


def _rss() -> int | None:
    try:
        return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class PeakRss:
    """``with PeakRss() as peak: ...``; then ``peak.added_mb``: the highest RSS seen above the
    RSS at entry, in MiB (sampled every ``EVERY_S``: a shorter spike can be missed)."""

    def __init__(self) -> None:
        self.start = self.peak = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _watch(self) -> None:
        while not self._stop.wait(EVERY_S):
            self._sample()

    def _sample(self) -> None:
        rss = _rss()
        if rss is not None and (self.peak is None or rss > self.peak):
            self.peak = rss

    def __enter__(self) -> "PeakRss":
        self.start = self.peak = _rss()
        if self.start is not None:
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    @property
    def added_mb(self) -> float | None:
        if self.start is None or self.peak is None:
            return None
        return round((self.peak - self.start) / 2 ** 20, 2)
