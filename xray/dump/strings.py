"""Interned texts of a columnar index: one UTF-8 blob and the end offset of each string.

Every text column of the index (op and module names, dtypes, shapes, skeletons, data references)
holds indices into one ``StringTable``, so a million records that name forty ops hold forty
strings. A table read from disk decodes each string the first time it is asked for, with the
dump's length limits, and builds the text-to-index map only when a writer extends it.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .errors import ColumnsError
from .model import MAX_TEXT

NONE = -1  # the index of an absent text (None)


class StringTable:
    """Interned texts, addressed by index. On disk: the UTF-8 bytes of all of them, one blob,
    and the end offset of each (``to_arrays``/``from_arrays``); decoded one by one, on demand."""

    def __init__(self, strings: Sequence[str] = ()) -> None:
        self._strings: list[str | None] = list(strings)
        self._ids: dict[str, int] | None = {}
        for i, text in enumerate(self._strings):
            self._ids.setdefault(text, i)
        self._blob: np.ndarray | None = None
        self._ends: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._strings)

    def intern(self, text: str) -> int:
        ids = self._ids if self._ids is not None else self._reverse()
        i = ids.get(text)
        if i is None:  # the text first, then its id: an interrupt between leaves no id pointing past the end
            i = len(self._strings)
            self._strings.append(text)
            ids[text] = i
        return i

    def opt(self, text: str | None) -> int:
        return NONE if text is None else self.intern(text)

    def __getitem__(self, i: int) -> str:
        s = self._strings[i]
        if s is None:
            s = self._strings[i] = self._decode(i)
        return s

    def get(self, i: int) -> str | None:
        return None if i < 0 else self[i]

    def _decode(self, i: int) -> str:
        start = int(self._ends[i - 1]) if i else 0
        raw = self._blob[start:int(self._ends[i])].tobytes()
        if len(raw) > 4 * MAX_TEXT:
            raise ColumnsError(f"string #{i} is {len(raw)} bytes long (limit {MAX_TEXT} characters)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ColumnsError(f"string #{i} is not UTF-8 ({e})") from None
        if len(text) > MAX_TEXT:
            raise ColumnsError(f"string #{i} is {len(text)} characters long (limit {MAX_TEXT})")
        return text

    def texts(self, start: int = 0) -> list[str]:
        return [self[i] for i in range(start, len(self))]

    def to_arrays(self, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(blob, ends) of the strings from index ``start`` on (a journal chunk's new strings)."""
        encoded = [s.encode("utf-8") for s in self.texts(start)]
        ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), dtype=np.int64)
        return np.frombuffer(b"".join(encoded), dtype=np.uint8), ends

    @classmethod
    def from_arrays(cls, blob: np.ndarray, ends: np.ndarray) -> "StringTable":
        blob, ends = np.asarray(blob), np.asarray(ends)
        if blob.dtype != np.uint8 or blob.ndim != 1 or ends.ndim != 1 or ends.dtype.kind not in "iu":
            raise ColumnsError("the string table is not a byte blob with integer offsets")
        if len(ends) and (ends[0] < 0 or np.any(np.diff(ends) < 0) or ends[-1] > len(blob)):
            raise ColumnsError("the string table's offsets are not ascending within its blob")
        table = cls()
        table._strings = [None] * len(ends)
        table._blob, table._ends = blob, ends.astype(np.int64, copy=False)
        table._ids = None  # built by the first intern(): a reader that only reads never needs it
        return table

    def _reverse(self) -> dict[str, int]:
        if self._ids is None:
            ids: dict[str, int] = {}
            for i in range(len(self._strings)):
                ids.setdefault(self[i], i)
            self._ids = ids
        return self._ids

    def extend(self, texts: Iterable[str]) -> None:
        ids = self._reverse()
        for t in texts:
            i = len(self._strings)
            self._strings.append(t)
            ids.setdefault(t, i)
