"""explain at scale: measure whole subtrees first and descend only where the share is large.

Measuring every module costs two forwards each (fed, grafted), and the cumulative and residual
views add three more: about 2,100 forwards for a 32-layer decoder. Most of them measure modules
that make little of the error. Here the top-level places are measured first; a place's children
are measured only when the place makes most (``MOST``) of what its parent makes, so a broken
call is reached along one path and spread noise stops near the top.

A long run of siblings that hand their output to each other (decoder layers: layer i's output
is layer i+1's input, checked on the target's captured values) is bisected instead of measured
one by one. A run ``a..b`` fed at ``a`` keeps what its members make and drops what reaches it
from upstream; grafted at ``b`` it drops both: ``share(a..b) = share(grafted b) - share(fed a)``,
from two single-place runs. Halves with a large share are split again; the rest stay *groups*
(rows of kind ``group``), whose share their parent's self share leaves out as it does a child's.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import hooks, places, trees
from .places import MOST
# Shorter sibling chains are measured member by member: bisecting them saves no forward.
MIN_CHAIN = 4


class Descent:
    """The measurements of one explain, made lazily: each fed or grafted run at most once."""

    def __init__(self, runs, rows: dict, e0: float, progress: Callable[[str], None] | None = None) -> None:
        self.runs, self.rows, self.e0, self.progress = runs, rows, e0, progress
        self.groups: list = []

    def fed(self, name: str) -> float:
        r = self.rows[name]
        if r.error_fed is None:
            local: dict[str, float] = {}
            r.error_fed = self.runs.final_error(feed=[name], local=local)
            r.local_err = local.get(name)
            self._settle(r)
        return r.error_fed

    def grafted(self, name: str) -> float:
        r = self.rows[name]
        if r.error_grafted is None:
            r.error_grafted = self.runs.final_error(graft=[name])
            self._settle(r)
        return r.error_grafted

    def share(self, name: str) -> float:
        self.fed(name), self.grafted(name)
        return self.rows[name].share

    def _settle(self, r) -> None:
        if r.error_fed is not None and r.error_grafted is not None:
            r.share = places.share(self.e0, r.error_grafted) - places.share(self.e0, r.error_fed)
            if self.progress:
                self.progress(r.name)


def descend(runs, rows: dict, names: list[str], e0: float, tcap: hooks.Capture, group_row: Callable,
            progress: Callable[[str], None] | None = None) -> list:
    """Measure ``rows`` top-down (module docstring); returns the group rows it left unsplit,
    made by ``group_row(parent, members, share)``."""
    d = Descent(runs, rows, e0, progress)
    kids = places.children(names)
    nested = {c for cs in kids.values() for c in cs}
    todo = [(n, 1.0) for n in names if n not in nested]  # the top-level places, against the whole error
    while todo:
        name, parent_share = todo.pop(0)
        if not _large(d.share(name), parent_share) or not kids[name]:
            continue
        mine = d.rows[name].share
        for run in chains(sorted(kids[name], key=lambda c: rows[c].order), tcap, lambda c: rows[c].what):
            if len(run) < MIN_CHAIN:
                todo += [(c, mine) for c in run]
            else:
                todo += [(c, mine) for c in _bisect(d, name, run, mine, group_row)]
    return d.groups


def _bisect(d: Descent, parent: str, run: list[str], parent_share: float, group_row: Callable) -> list[str]:
    """The members of ``run`` reached by splitting every half that makes most of the parent's share."""
    reached, stack = [], [run]
    while stack:
        g = stack.pop()
        if len(g) == 1:
            reached.append(g[0])
            continue
        s = places.share(d.e0, d.grafted(g[-1])) - places.share(d.e0, d.fed(g[0]))
        if _large(s, parent_share):
            mid = len(g) // 2
            stack += [g[mid:], g[:mid]]
        else:
            d.groups.append(group_row(parent, g, s))
    return reached


def _large(share: float | None, parent_share: float) -> bool:
    return share is not None and parent_share > 0 and share > MOST * parent_share


def chains(children: list[str], tcap: hooks.Capture, kind: Callable[[str], str]) -> list[list[str]]:
    """``children`` (in execution order) cut into runs of one ``kind`` (class) where each one,
    called once, is fed the previous one's output (its first floating input equals that
    output's first floating tensor): a stack of layers, not the norm after it."""
    runs: list[list[str]] = []
    for c in children:
        if runs and kind(runs[-1][-1]) == kind(c) and _hands_over(runs[-1][-1], c, tcap):
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs


def _hands_over(a: str, b: str, tcap: hooks.Capture) -> bool:
    ca, cb = tcap.calls.get(a, []), tcap.calls.get(b, [])
    if len(ca) != 1 or len(cb) != 1:
        return False
    out, given = trees.float_leaves(ca[0].output), trees.float_leaves((cb[0].args, cb[0].kwargs))
    return bool(out and given and out[0].shape == given[0].shape and torch.equal(out[0], given[0]))
