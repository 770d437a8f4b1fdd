"""Parse the ``step=`` and ``rank=`` selections: ints, "4-6" ranges, comma lists, or all."""
from __future__ import annotations

from typing import Iterable, Union

Selection = Union[None, int, str, Iterable[Union[int, str]]]


class SelectionError(ValueError):
    """A step or rank list that cannot be parsed; the message names the bad item."""


def _parse_item(item: int | str, what: str) -> list[int]:
    if isinstance(item, bool):
        raise SelectionError(f"{what}: {item!r} is not a {what} number; use ints or ranges like '4-6'")
    if isinstance(item, int):
        if item < 0:
            raise SelectionError(f"{what}: {item} is negative; {what}s count from 0")
        return [item]
    if isinstance(item, str):
        text = item.strip()
        lo, sep, hi = text.partition("-")
        try:
            if not sep:
                return _parse_item(int(text), what)
            a, b = int(lo), int(hi)
        except ValueError:
            raise SelectionError(f"{what}: cannot parse {item!r}; use an int or a range like '4-6'") from None
        if a < 0 or b < a:
            raise SelectionError(f"{what}: range {item!r} is empty or negative; write it low-high, e.g. '4-6'")
        return list(range(a, b + 1))
    raise SelectionError(f"{what}: {item!r} ({type(item).__name__}) is not an int or a range string like '4-6'")


def parse_selection(value: Selection, what: str = "step") -> frozenset[int] | None:
    """A set of selected numbers, or None for "all" (None or an empty list).

    Accepts ``3``, ``"3"``, ``"1,4-6"``, ``[1, "4-6"]``.
    """
    if value is None:
        return None
    if isinstance(value, (int, str)):
        items: list = [p for p in str(value).split(",") if p.strip()] if isinstance(value, str) else [value]
    else:
        try:
            items = list(value)
        except TypeError:
            raise SelectionError(f"{what}: expected a list of ints or ranges, got {type(value).__name__}") from None
    if not items:
        return None
    out: set[int] = set()
    for item in items:
        out.update(_parse_item(item, what))
    return frozenset(out)
