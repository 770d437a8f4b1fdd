"""Readers of other tools' dumps, tried by ``load_dump`` before xray's own trace reader.

A reader is a plug-in: ``sniff(folder)`` says cheaply (a few bytes of one file) whether a dump
folder is its format, ``open(folder)`` returns an object with the ``Dump`` protocol. Tools never
ask which format they were handed; adding a format is one ``register`` call here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class ForeignFormat:
    name: str
    sniff: Callable[[Path], bool]
    open: Callable[[Path], Any]


_READERS: list[ForeignFormat] = []


def register(fmt: ForeignFormat) -> None:
    if all(f.name != fmt.name for f in _READERS):
        _READERS.append(fmt)


def reader_for(folder: Path) -> ForeignFormat | None:
    """The foreign reader that claims ``folder``, or None (an xray trace folder)."""
    _builtin()
    return next((f for f in _READERS if f.sniff(folder)), None)


def _builtin() -> None:
    from . import msprobe

    register(ForeignFormat("msprobe", msprobe.is_msprobe_dump, msprobe.read_msprobe_dump))
