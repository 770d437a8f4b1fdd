"""Which ops xray-gen skips: a list of fnmatch patterns on op names, from a file."""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_BLACKLIST = Path(__file__).with_name("default_blacklist.txt")


@dataclass
class Blacklist:
    patterns: list[str] = field(default_factory=list)
    source: str = "none"

    def __post_init__(self) -> None:
        joined = "|".join(fnmatch.translate(p) for p in self.patterns)
        self._re = re.compile(joined) if joined else None
        self._cache: dict[str, bool] = {}

    def blocks(self, op: str) -> bool:
        hit = self._cache.get(op)
        if hit is None:
            hit = self._cache[op] = bool(self._re and self._re.match(op))
        return hit

    @classmethod
    def load(cls, path: str | os.PathLike | None = DEFAULT_BLACKLIST) -> "Blacklist":
        """Read patterns (``#`` comments and blank lines ignored); ``None`` means no blacklist."""
        if path is None:
            return cls([], "none")
        p = Path(path)
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{p}: cannot read blacklist ({e})") from e
        pats = [ln.split("#", 1)[0].strip() for ln in lines]
        return cls([x for x in pats if x], str(p))
