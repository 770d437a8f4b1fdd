"""The module tree as explain sees it: places, their parents and depth, and the share arithmetic
(how much of the final error a graft removes)."""
from __future__ import annotations

import math

# A place explains "most" of an error when it removes more than half of it: the residual after
# the top place is called spread when no place explains most of it, and the descent (descend.py)
# measures a place's children only when it makes most of what its parent makes.
MOST = 0.5


def parent(name: str) -> str:
    return name.rpartition(".")[0]


def depth(name: str) -> int:
    return name.count(".") + 1


def is_inside(name: str, place: str) -> bool:
    """``name`` is ``place`` or one of its descendants."""
    return name == place or name.startswith(place + ".")


def share(before: float, after: float) -> float:
    """The part of ``before`` (a final error) that a change bringing it to ``after`` removed;
    1.0 removes it all, negative makes it worse. An infinite error (NaN/Inf in the output)
    removed entirely counts as 1.0, one left as it was as 0.0."""
    if before == 0.0:
        return 0.0
    if math.isinf(before):
        return 0.0 if math.isinf(after) else 1.0
    if math.isinf(after):
        return -math.inf
    return (before - after) / before


def children(names: list[str]) -> dict[str, list[str]]:
    """Each place's direct children among ``names``: the places whose nearest ancestor in
    ``names`` it is (a ModuleList is never called, so a decoder layer's parent is the model)."""
    present = set(names)
    out: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        p = parent(n)
        while p and p not in present:
            p = parent(p)
        if p:
            out[p].append(n)
    return out
