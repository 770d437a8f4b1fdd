"""CSV cells a spreadsheet cannot evaluate: every CSV xray writes goes through here.

A dump is untrusted: a module or op named ``=HYPERLINK(...)`` or ``=cmd|...`` would become a
live formula in the out.csv a user opens in a spreadsheet. Following OWASP's advice on CSV
injection, a text cell that starts with ``= + - @``, a tab or a carriage return is written with
a leading ``'`` (shown as text, never evaluated). Numbers stay numbers: ``-0.5`` or ``-inf``
(as a float or as its text) is left as it is, so pandas still reads the column as numeric.
Control and bidi characters (an ANSI escape, a right-to-left override) are written as their
backslash escapes (``model.printable``): a CSV shown by ``cat`` or a viewer is a terminal too.
"""
from __future__ import annotations

import csv
from typing import IO, Any, Iterable, Mapping

from .model import printable

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def risky(text: str) -> bool:
    """Whether a spreadsheet would evaluate ``text`` as a formula (a number is never risky)."""
    if not text.startswith(FORMULA_START):
        return False
    try:
        float(text)
        return False
    except ValueError:
        return True


def cell(value: Any) -> Any:
    """``value`` as a safe CSV cell: risky texts get a leading ``'``, control and bidi characters
    their escapes; everything else is unchanged."""
    if isinstance(value, str) and value:
        value = printable(value)
        if risky(value):
            return "'" + value
    return value


def row(values: Iterable[Any]) -> list[Any]:
    return [cell(v) for v in values]


def dict_row(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: cell(v) for k, v in values.items()}


class Writer:
    """``csv.writer`` whose rows go through ``cell``."""

    def __init__(self, f: IO[str], **kwargs) -> None:
        self._w = csv.writer(f, **kwargs)

    def writerow(self, values: Iterable[Any]) -> Any:
        return self._w.writerow(row(values))

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for values in rows:
            self._w.writerow(row(values))


class DictWriter(csv.DictWriter):
    """``csv.DictWriter`` whose rows go through ``cell``."""

    def writerow(self, rowdict: Mapping[str, Any]) -> Any:
        return super().writerow(dict_row(rowdict))

    def writerows(self, rowdicts: Iterable[Mapping[str, Any]]) -> None:
        for r in rowdicts:
            self.writerow(r)


def frame(df):
    """A pandas DataFrame with ``cell`` applied to its text columns (for ``DataFrame.to_csv``)."""
    out = df.copy()
    for name in out.columns:
        if out[name].dtype == object:
            out[name] = out[name].map(cell)
    return out
