"""tqdm over an iterable, shown only on a terminal (or when asked)."""
from __future__ import annotations

import sys
from typing import Iterable


def bar(items: Iterable, desc: str, progress: bool | None = None):
    from tqdm import tqdm

    show = sys.stderr.isatty() if progress is None else progress
    return tqdm(items, desc=desc, disable=not show, leave=False, file=sys.stderr)
