"""Compare where the dumps live: under torchrun, every rank compares its own rank pair from its
node's disk and writes its rows there; rank 0 gathers the small per-rank summaries over gloo and
names the rank that diverged first, ordered by the collectives each rank ran before it.

    torchrun --nnodes N --nproc-per-node M -m xray.compare BENCH TARGET OUT/

Without torchrun's environment, ``python -m xray.compare`` is one process comparing every rank
pair (``compare_dumps``), with the same outputs. docs/compare.md, "Comparing where the dumps live".
"""
from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..console import closed_pipe_is_quiet
from .pairing import global_rank
from .result import CompareResult, CompareRow, Summary
from .sync_points import SyncPoint, divergence_order
from .verdict import settle_verdict

MERGED_CSV = "compare.csv"
SUMMARY_JSON = "summary.json"


def rank_unit(path: str | os.PathLike, rank: int, world_size: int, side: str, notes: list[str]) -> tuple[str, Path]:
    """(name, dump path) of ``rank``'s dump at ``path``: the job's folder of every rank, or a
    node's folder holding only its local ranks. A single dump is accepted for a world of one."""
    from .pairing import CompareInputError, dump_units

    units = dump_units(path)
    if set(units) == {""} and world_size == 1:
        return "", units[""]
    found = sorted((n for n in units if global_rank(n) == rank), key=lambda n: (n != f"rank_{rank}", n))
    if not found:
        found_here = ", ".join(n or "<one dump>" for n in units)
        raise CompareInputError(f"{side} {path}: no dump of rank {rank} here (found: {found_here}); "
                                f"pass the folder that holds rank_{rank}/ on this rank's node")
    if len(found) > 1:
        notes.append(f"{side}: {', '.join(found[1:])} also claim rank {rank}; compared {found[0]}")
    return found[0], units[found[0]]


# --------------------------------------------------------------------------------------------
# The job: each rank compares its pair, rank 0 reports.


def compare_rank(bench: str | os.PathLike, target: str | os.PathLike, out_dir: str | os.PathLike, rank: int,
                 world_size: int, *, rules=None, worst: int = 10, **options: Any) -> dict[str, Any]:
    """Compare ``rank``'s pair from local disk, write ``OUT/rank_<r>.csv`` and return what rank 0
    needs to report (no rows: totals, first divergence, warnings and the worst few rows).
    ``options``: ``compare_dumps``'s (reference, threads, statistics_only, ignore_step,
    attribute_first); a rank never draws a progress bar."""
    from . import CompareInputError, compare_dumps
    from .report import worst_rows, write_csv

    payload: dict[str, Any] = {"rank": rank, "label": f"rank_{rank}", "host": socket.gethostname(), "error": None}
    try:
        notes: list[str] = []
        name_b, pb = rank_unit(bench, rank, world_size, "bench", notes)
        name_t, pt = rank_unit(target, rank, world_size, "target", notes)
        result = compare_dumps(pb, pt, rules=rules, **{"threads": 1, **options, "progress": False})
        label = next(iter(result.summary.ranks), "")
        if not label:  # a pair not named rank_<r> on both sides; in a world of one, the job's one rank
            label = (name_b if name_b == name_t else f"{name_b}|{name_t}") if world_size > 1 else f"rank_{rank}"
            _relabel(result, label)
        result.summary.warnings[:0] = notes
        csv_path = Path(out_dir).resolve() / f"rank_{rank}.csv"
        write_csv(result, csv_path)
        payload.update(label=label, summary=result.summary.to_json(), csv=str(csv_path),
                       csv_sha256=_sha256(csv_path), worst=[r.to_dict() for r in worst_rows(result.rows, worst)])
    except (CompareInputError, ValueError, OSError) as e:
        from ..quiet import one_line

        payload.update(error=one_line(e), exit=2)
    except Exception as e:  # a bug: still reach the gather, so no rank waits for this one forever
        traceback.print_exc()
        payload.update(error=f"{type(e).__name__}: {e} (a bug in xray: traceback on rank {rank}'s stderr)", exit=1)
    return payload


def _relabel(result: CompareResult, label: str) -> None:
    for r in result.rows:
        r.rank = label
    s = result.summary
    s.ranks = {label: v for v in s.ranks.values()}
    s.divergence_order = [label] if s.divergence_order else []
    for fd in [s.first_divergence, *(v.get("first_divergence") for v in s.ranks.values())]:
        if fd:
            fd["rank"] = label


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def merge_summaries(bench: str, target: str, payloads: Sequence[Mapping[str, Any]]) -> Summary:
    """One Summary of the job from the ranks' payloads: the totals add up, the first divergence is
    the first rank's in ``divergence_order``; ranks that could not compare are in ``errors``."""
    from . import match_pct

    s = Summary(bench=bench, target=target)
    for p in sorted(payloads, key=lambda p: p["rank"]):
        if p.get("error"):
            s.errors[p["label"]] = p["error"]
            continue
        part = p["summary"]
        for k in ("bench_records", "target_records", "matched", "rows", "passed", "warned", "failed", "nan_inf",
                  "skipped", "random_draws", "unmatched", "unmatched_bench", "unmatched_target", "bytes_compared"):
            setattr(s, k, getattr(s, k) + part[k])
        for label, totals in part["ranks"].items():
            s.ranks[label] = dict(totals, host=p["host"], csv=p["csv"])
        s.dedup += part["dedup"]
        s.unrecorded_backward += part.get("unrecorded_backward") or []
        s.stopped += part.get("stopped") or []
        # each rank's own warnings name it, where the job has several
        s.warnings += part["warnings"] if len(payloads) == 1 else [f"{p['label']}: {w}" for w in part["warnings"]]
        s.seconds = max(s.seconds, part["seconds"])
    s.match_pct = match_pct(s.matched, s.bench_records, s.target_records)
    s.divergence_order = divergence_order({label: SyncPoint(**r["sync"]) for label, r in s.ranks.items()
                                           if r.get("sync")})
    s.first_divergence = s.ranks[s.divergence_order[0]]["first_divergence"] if s.divergence_order else None
    settle_verdict(s)
    return s


def merge_csv(payloads: Sequence[Mapping[str, Any]], path: Path) -> str | None:
    """Concatenate the ranks' CSVs into ``path`` when this process sees every one of them as the
    rank wrote it (a shared filesystem); else say where the rows are. A stale file of an earlier
    run on this node is told apart by its checksum."""
    from ..dump.atomic import atomic_write

    ok = [p for p in sorted(payloads, key=lambda p: p["rank"]) if not p.get("error")]
    unseen = [p for p in ok if not (Path(p["csv"]).is_file() and _sha256(Path(p["csv"])) == p["csv_sha256"])]
    if unseen:
        return ("rows stay where each rank wrote them (not on a filesystem rank 0 shares): " +
                ", ".join(f"{p['label']}: {p['host']}:{p['csv']}" for p in unseen))
    with atomic_write(path, newline="") as out:
        for i, p in enumerate(ok):
            with open(p["csv"], newline="") as f:
                lines = f.read().splitlines(keepends=True)
            out.writelines(lines if i == 0 else lines[1:])
    return None


def run(args: argparse.Namespace, rules) -> int:
    """The torchrun job. Every rank reaches the gather and the broadcast, whatever failed, and
    every rank exits with the job's status, so torchrun's own status is 0 only when all compared."""
    from datetime import timedelta

    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:  # objects travel on CPU: gloo, whatever accelerator the node has
        dist.init_process_group("gloo", timeout=timedelta(minutes=args.timeout_min))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        payload = compare_rank(args.bench, args.target, out_dir, rank, world, rules=rules, worst=args.worst,
                               **args.compare)
        try:
            from .pairing import dump_units

            payload["seen"] = sorted(set(dump_units(args.bench)) & set(dump_units(args.target)))
        except Exception:
            payload["seen"] = []
        if payload.get("error"):
            print(f"xray.compare rank {rank}: error: {payload['error']}", file=sys.stderr)
        gathered: list | None = [None] * world if rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        status = [0]
        if rank == 0:
            status[0] = report(args, gathered, out_dir, world)
        dist.broadcast_object_list(status, src=0)
        return status[0]
    finally:
        if owned:
            dist.destroy_process_group()


def report(args: argparse.Namespace, payloads: list[dict], out_dir: Path, world: int) -> int:
    """Rank 0: summary.json, the merged CSV when it can, the console report. Returns the exit status."""
    from .pairing import rank_key
    from .report import terminal_report, write_summary_json

    s = merge_summaries(str(args.bench), str(args.target), payloads)
    compared = {p["label"] for p in payloads}
    left = sorted({n for p in payloads for n in p.get("seen", ())
                   if global_rank(n) is not None and global_rank(n) >= world and n not in compared}, key=rank_key)
    if left:
        s.warnings.append(f"not compared by any rank (world size {world}): {', '.join(left)}")
    where = merge_csv(payloads, out_dir / MERGED_CSV)
    if where:
        s.warnings.append(where)
    write_summary_json(CompareResult([], s), out_dir / SUMMARY_JSON)
    worst = [CompareRow(**r) for p in payloads for r in p.get("worst", ())]
    print(terminal_report(CompareResult(worst, s), args.worst))
    written = [out_dir / SUMMARY_JSON] + ([] if where else [out_dir / MERGED_CSV])
    print(f"\nwrote {', '.join(map(str, written))} and rank_<r>.csv on each rank's node")
    return max((p.get("exit", 0) for p in payloads), default=0)


# --------------------------------------------------------------------------------------------
# python -m xray.compare


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrun --nnodes N --nproc-per-node M -m xray.compare",
        description="Each rank compares BENCH/rank_<r> with TARGET/rank_<r> from its own node's disk and writes "
                    "OUT/rank_<r>.csv there; rank 0 writes OUT/summary.json (and OUT/compare.csv when every rank's "
                    "rows are on a filesystem it sees) and prints which rank diverged first. Without torchrun: one "
                    "process compares every rank pair, like xray-compare.",
        epilog="Compare options (--tol, --warn-cosine, --stats-warn-factor, --fp64-multiplier, --reference, "
               "--threads, --worst, --ignore-step, --attribute-all) are xray-compare's (xray-compare --help). "
               "Exit status: 0 when every rank compared, 2 when an input is unusable (torchrun itself then exits "
               "1). docs/compare.md, 'Comparing where the dumps live'.")
    p.add_argument("bench", help="trusted dumps: the job's folder of rank_<r>/ dumps, or this node's")
    p.add_argument("target", help="dumps to check, the same way")
    p.add_argument("out_dir", help="folder for rank_<r>.csv (each rank, on its node) and summary.json (rank 0)")
    p.add_argument("--timeout-min", type=float, default=120.0,
                   help="how long rank 0 waits for the slowest rank's compare (default %(default)s)")
    return p


@closed_pipe_is_quiet
def main(argv: list[str] | None = None) -> int:
    from ..quiet import one_line, quiet_third_party
    from .cli import build_parser as compare_parser, compare_options, rules_from_args

    args, rest = build_parser().parse_known_args(argv)
    # One parser for the compare options of both entries: xray-compare's.
    opts = compare_parser().parse_args([args.bench, args.target, os.path.join(args.out_dir, MERGED_CSV), *rest])
    if opts.html or opts.summary_json or opts.tests:
        print("python -m xray.compare: error: the report goes to OUT/ (summary.json); --html, --summary-json and --tests "
              "are xray-compare's", file=sys.stderr)
        return 2
    quiet_third_party()
    try:
        rules = rules_from_args(opts)
    except ValueError as e:
        print(f"python -m xray.compare: error: {one_line(e)}", file=sys.stderr)
        return 2
    args.worst, args.compare = opts.worst, compare_options(opts)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return run(args, rules)
    return single_process(args, rules)


def single_process(args: argparse.Namespace, rules) -> int:
    """No torchrun: one process compares every rank pair, writing what rank 0 writes."""
    from . import CompareInputError, compare_dumps
    from ..quiet import one_line
    from .report import terminal_report, write_csv, write_summary_json

    out_dir = Path(args.out_dir)
    try:
        result = compare_dumps(args.bench, args.target, rules=rules, **args.compare)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(result, out_dir / MERGED_CSV)
        write_summary_json(result, out_dir / SUMMARY_JSON)
    except (CompareInputError, ValueError, OSError) as e:
        print(f"python -m xray.compare: error: {one_line(e)}", file=sys.stderr)
        return 2
    print(terminal_report(result, args.worst))
    print(f"\nwrote {out_dir / MERGED_CSV}, {out_dir / SUMMARY_JSON} (one process compared every rank pair; to "
          "compare each rank's pair on its own node: torchrun --nnodes N --nproc-per-node M -m xray.compare ...)")
    return 0
