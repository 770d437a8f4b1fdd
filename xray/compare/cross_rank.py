"""Cross-rank consistency within one multi-rank run: values every rank must hold alike.

No bench is needed. After an all-reduce, a broadcast or an all-gather every rank of the group holds
the same result, and a replicated DTensor (every placement ``R``) is the same tensor on every
rank. A rank whose copy differs received or computed something wrong; this names the first such
place (op, occurrence, module) and the rank. Which rank is wrong: the odd one out where most ranks
agree; with two ranks, the one whose all-reduce result is not the sum of the ranks' inputs (or,
for a broadcast, not the source's tensor). Where the dumps cannot tell, both are named.

Values are compared on what the dumps hold of them, statistics and samples: a sample is the
tensor's values at positions fixed by its shape (docs/format.md, "Samples"), so two ranks'
copies are compared element by element there, bit for bit (the same result is the same bits on
every rank: ring and tree reductions hand every rank the same sums).

    python -m xray.compare.cross_rank RUN_FOLDER      (or: xray cross-rank RUN_FOLDER)
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

# Collectives whose every output is the same on every rank of the group (ops by their packet name).
SAME_RESULT = frozenset({"all_reduce", "all_reduce_", "allreduce_", "allreduce_coalesced_", "all_reduce_coalesced",
                         "all_reduce_coalesced_", "broadcast", "broadcast_", "all_gather_into_tensor",
                         "all_gather_into_tensor_coalesced", "allgather_", "_allgather_base_",
                         "allgather_into_tensor_coalesced_", "allgather_coalesced_"})
_SUM_REDUCTIONS = ("all_reduce", "all_reduce_", "allreduce_")
# Statistics of the same tensor, reduced on two ranks, may differ by float64 summation order only.
STATS_RTOL = 1e-9
# An all-reduce's result against the sum of the recorded inputs: fp32 rounding of a few terms.
SUM_RTOL = 1e-5


@dataclass(frozen=True)
class Copy:
    """One rank's copy of a value that must agree: the record, and its tensor's statistics and sample."""

    rank: str
    seq: int
    module: str | None
    tensor: str
    shape: tuple[int, ...]
    stats: tuple[float | None, ...]  # min, max, mean, std
    sample: tuple[float, ...] | None
    expected: tuple[float, ...] | None = None  # what it should be, where the dumps say (see module doc)


@dataclass
class Finding:
    """Ranks that disagree on one value."""

    what: str  # "all-reduce result", "broadcast result", "replicated tensor"...
    op: str
    occurrence: int  # the how-many-th such call on each rank (0 first)
    module: str | None
    tensor: str
    copies: list[Copy]
    wrong: list[str]  # the ranks named wrong; empty when the dumps cannot tell which
    why: str  # how the wrong ranks were told apart
    difference: float  # the largest relative difference between two ranks' copies

    def line(self) -> str:
        where = f" in {self.module}" if self.module else ""
        seqs = ", ".join(f"{c.rank} seq {c.seq}" for c in self.copies)
        who = (f"{' and '.join(self.wrong)} wrong ({self.why})" if self.wrong else
               f"{' and '.join(c.rank for c in self.copies)} disagree (the dumps cannot tell which is wrong)")
        return (f"{self.what} of {self.op} #{self.occurrence}{where} [{self.tensor}]: {who}; {seqs}, relative "
                f"difference {self.difference:.3g}")


@dataclass
class CrossRankReport:
    folder: str
    ranks: list[str]
    checked: int = 0  # values compared across ranks
    findings: list[Finding] = field(default_factory=list)  # first (in rank 0's execution order) first
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def text(self) -> str:
        head = f"{len(self.ranks)} ranks ({', '.join(self.ranks)}), {self.checked} values that must agree across ranks"
        lines = [head] + [f"note: {n}" for n in self.notes]
        if not self.findings:
            lines.append("all agree" if self.checked else "nothing to check: no collective result or replicated "
                                                          "DTensor with statistics in these dumps")
        else:
            lines.append(f"FIRST DISAGREEMENT: {self.first.line()}")
            lines += [f"  also: {f.line()}" for f in self.findings[1:10]]
            if len(self.findings) > 10:
                lines.append(f"  ... and {len(self.findings) - 10} more")
        return "\n".join(lines)


def check_ranks(folder: str | Path) -> CrossRankReport:
    """The cross-rank check of one run's rank dumps (``folder`` holds ``rank_<r>/``)."""
    from .pairing import global_rank
    from .pairing import CompareInputError, dump_units, open_dump, rank_key

    units = {n: p for n, p in dump_units(folder).items() if global_rank(n) is not None}
    if len(units) < 2:
        raise CompareInputError(f"{folder}: the cross-rank check needs a run's folder of rank_<r>/ dumps "
                                f"(found {len(units)})")
    names = sorted(units, key=rank_key)
    report = CrossRankReport(str(folder), names)
    values: dict[str, dict[tuple, list[Copy]]] = {}
    for name in names:
        notes: list[str] = []
        dump = open_dump(units[name], name, notes)
        try:
            values[name] = _values(name, dump.records)
        finally:
            close = getattr(dump, "close", None)
            if callable(close):
                close()
        report.notes += notes
    keys = list(values[names[0]])
    for name in names[1:]:
        keys += [k for k in values[name] if k not in values[names[0]]]
    found: list[tuple[int, Finding]] = []
    for key in keys:
        per_rank = {n: values[n].get(key, []) for n in names}
        counts = {n: len(v) for n, v in per_rank.items()}
        if len(set(counts.values())) > 1:
            report.notes.append(f"{key[1]} ({key[0]}): calls per rank differ ({', '.join(f'{n} {c}' for n, c in counts.items())}); "
                                "compared the first calls of each")
        for k in range(min(counts.values())):
            copies = [per_rank[n][k] for n in names]
            if any(c.stats[2] is None for c in copies):
                continue
            report.checked += 1
            finding = _judge(key, k, copies)
            if finding is not None:
                found.append((copies[0].seq, finding))
    report.findings = [f for _, f in sorted(found, key=lambda x: x[0])]
    return report


def _values(rank: str, records: Iterable[Any]) -> dict[tuple, list[Copy]]:
    """(kind, op, group or module, tensor) -> this rank's copies, in execution order."""
    out: dict[tuple, list[Copy]] = {}
    for rec in records:
        if rec.kind != "op":
            continue
        packet = rec.op.split(".")[1] if rec.op.count(".") >= 2 else rec.op
        namespace = rec.op.split(".")[0]
        if namespace in ("c10d", "_c10d_functional") and packet in SAME_RESULT:
            what = ("all-reduce result" if "reduce" in packet else "broadcast result" if "broadcast" in packet
                    else "all-gather result")
            group = _group(rec)
            expected = _expected_sum(rec) if packet in _SUM_REDUCTIONS else None
            for name, meta in rec.output_tensors():
                _add(out, (what, rec.op, group, name), _copy(rank, rec, name, meta, expected))
        else:
            for name, meta in rec.output_tensors():
                sh = getattr(meta, "sharding", None)
                if sh is not None and sh.placements and all(p == "R" for p in sh.placements):
                    _add(out, ("replicated tensor", rec.op, rec.module or "", rec.direction, name),
                         _copy(rank, rec, name, meta, None))
    return out


def _add(out: dict, key: tuple, copy: Copy | None) -> None:
    if copy is not None:
        out.setdefault(key, []).append(copy)


def _copy(rank: str, rec: Any, name: str, meta: Any, expected: tuple[float, ...] | None) -> Copy | None:
    st = getattr(meta, "stats", None)
    if st is None:
        return None
    return Copy(rank, rec.seq, rec.module, name, tuple(meta.shape), (st.min, st.max, st.mean, st.std),
                st.sample, expected)


def _group(rec: Any) -> str:
    """The process group a collective ran in, as recorded (its group name or object text)."""
    for key in ("group_name", "process_group", "group"):
        v = rec.inputs.get(key)
        if v is not None:
            return str(getattr(v, "value", v))[:200]
    return ""


def _expected_sum(rec: Any) -> tuple[float, ...] | None:
    """A sum all-reduce's own input sample (before the call): ``_judge`` adds the ranks' up."""
    if str(_op_arg(rec)).lower() not in ("sum", "", "none"):
        return None
    inputs = [m for _, m in rec.input_tensors()]
    if len(inputs) != 1 or inputs[0].stats is None or inputs[0].stats.sample is None:
        return None
    return inputs[0].stats.sample


def _op_arg(rec: Any) -> Any:
    for key in ("reduce_op", "op"):
        v = rec.inputs.get(key)
        if v is not None:
            return getattr(v, "value", v)
    return ""


def _judge(key: tuple, k: int, copies: list[Copy]) -> Finding | None:
    groups: list[list[Copy]] = []
    for c in copies:
        for g in groups:
            if _same(g[0], c):
                g.append(c)
                break
        else:
            groups.append([c])
    if len(groups) == 1:
        return None
    difference = max(_difference(a, b) for a in copies for b in copies)
    groups.sort(key=len, reverse=True)
    if len(groups[0]) > len(groups[1]):  # a majority: the others are odd
        wrong, why = [c.rank for g in groups[1:] for c in g], f"{len(groups[0])} ranks agree on another value"
    else:
        wrong, why = _against_expected(key, copies), "not the sum of the ranks' inputs"
    first = copies[0]
    return Finding(key[0], key[1], k, first.module, first.tensor, copies, wrong, why, difference)


def _against_expected(key: tuple, copies: list[Copy]) -> list[str]:
    """Without a majority: the ranks whose all-reduce result is not the sum of the recorded inputs
    (their samples, at the same positions), or whose broadcast copy differs from the source's."""
    if key[0] == "all-reduce result" and all(c.expected is not None and c.sample is not None for c in copies):
        total = [math.fsum(vals) for vals in zip(*(c.expected for c in copies))]
        scale = max((sum(abs(v) for v in vals) for vals in zip(*(c.expected for c in copies))), default=0.0) or 1.0
        wrong = [c.rank for c in copies
                 if len(c.sample) != len(total) or any(abs(a - b) > SUM_RTOL * scale for a, b in zip(c.sample, total))]
        return wrong if 0 < len(wrong) < len(copies) else []
    return []


def _same(a: Copy, b: Copy) -> bool:
    if a.shape != b.shape:
        return False
    if a.sample is not None and b.sample is not None and not _bits_equal(a.sample, b.sample):
        return False
    return all(_close(x, y, STATS_RTOL) for x, y in zip(a.stats, b.stats))


def _bits_equal(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def _close(x: float | None, y: float | None, rtol: float) -> bool:
    if x is None or y is None:
        return x is y
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return abs(x - y) <= rtol * max(abs(x), abs(y), 1e-30)


def _difference(a: Copy, b: Copy) -> float:
    pairs = list(zip(a.stats, b.stats)) + (list(zip(a.sample, b.sample)) if a.sample and b.sample else [])
    return max((abs(x - y) / max(abs(x), abs(y), 1e-30) for x, y in pairs
                if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)), default=0.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xray cross-rank", description=(
        "Within one multi-rank run, check that what must agree across ranks does: all-reduce, broadcast and "
        "all-gather results, and replicated DTensors. Names the first op and rank that disagree. Exit status 1 "
        "when ranks disagree, 2 when the folder is unusable. docs/distributed.md"))
    p.add_argument("run", help="the run's folder of rank_<r>/ dumps")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args.run)


def run(folder: str) -> int:
    from ..quiet import one_line
    from .pairing import CompareInputError

    try:
        report = check_ranks(folder)
    except (CompareInputError, ValueError, OSError) as e:
        print(f"xray cross-rank: error: {one_line(e)}", file=sys.stderr)
        return 2
    print(report.text())
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
