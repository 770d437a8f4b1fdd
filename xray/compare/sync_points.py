"""Ranks share no clock but their collectives: where a record ran, counted in collectives.

Why its own module: the compare of one pair of dumps (xray.compare) and the report name the
rank that diverged first, while the torchrun driver (distributed.py) runs those compares.
"""
from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

#: Namespaces of the ops that move data between ranks: torch.distributed's eager collectives
#: (``c10d.allreduce_``, ``c10d.broadcast_``...) and the functional ones (``_c10d_functional.all_reduce``).
COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd"})
# Bookkeeping ops of functional collectives: they wait for or wrap a result, they exchange nothing.
_NOT_EXCHANGES = frozenset({"wait_tensor", "_wrap_tensor_autograd"})

def is_collective(op: str) -> bool:
    """Whether a recorded op name (``c10d.allreduce_.default``) is a collective: a sync point."""
    namespace, _, rest = op.partition(".")
    return namespace in COLLECTIVE_NAMESPACES and rest.split(".", 1)[0] not in _NOT_EXCHANGES


def collective_seqs(records: Iterable[Any]) -> tuple[list[int], int]:
    """Sequence numbers of a dump's collective records, ascending, and how many collective calls
    de-duplication (X_DEDUP) folded into them: those calls are missing from the count."""
    collectives = [r for r in records if is_collective(r.op)]
    return sorted(r.seq for r in collectives), sum(max(0, r.count - 1) for r in collectives)


@dataclass(frozen=True)
class SyncPoint:
    """Where a record ran on its rank, in the only clock ranks share: the collectives.

    ``collectives`` ran on the rank before the record (a collective's own output counts it: that
    value was made by every rank together, after anything any rank did before the collective);
    ``offset`` is how far into the interval after the last of them the record ran (1 = first op
    after it, 0 = the collective itself)."""

    collectives: int
    offset: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def sync_point(collectives: Sequence[int], seq: int, first_seq: int = 0) -> SyncPoint:
    """The SyncPoint of record ``seq``, given the rank's ascending collective seqs."""
    n = bisect.bisect_right(collectives, seq)
    start = collectives[n - 1] if n else first_seq - 1
    return SyncPoint(n, seq - start)


def divergence_order(points: Mapping[str, SyncPoint]) -> list[str]:
    """Rank labels by when their first divergence happened, earliest first: fewest collectives
    before it, then earliest within that collective interval, then lowest rank. Ranks align only at
    collectives: sequence numbers of different ranks are not comparable, collective counts are
    (msprobe orders ranks' NaNs the same way)."""
    from .pairing import rank_key  # lazy: pairing loads torch, the CLI's --help must not

    return sorted(points, key=lambda label: (points[label].collectives, points[label].offset, rank_key(label)))
