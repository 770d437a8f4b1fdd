"""Open the two sides of a compare: single dumps, or whole multi-rank folders paired by rank."""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

from ..dump import DumpFormatError, find_dump_folders, load_dump


class CompareInputError(ValueError):
    """The inputs cannot be compared; the message names the file and what to do."""


def dump_units(path: str | os.PathLike) -> dict[str, Path]:
    """Name -> dump path for every dump at ``path``: one unit for a file or a dump folder, one per
    ``rank_<r>``/``proc_<pid>`` folder (or module-level .h5 file) for a multi-rank folder."""
    p = Path(path)
    if not p.exists():
        raise CompareInputError(f"{p}: no such file or folder")
    if p.is_file():
        return {"": p}
    folders = find_dump_folders(p)
    if folders == [p]:
        return {"": p}
    units = {f.name: f for f in folders}
    for h5 in sorted(p.glob("*.h5")) + sorted(p.glob("*/*.h5")):
        name = h5.parent.name if h5.parent != p else h5.stem
        units.setdefault(name, h5)
    if not units:
        raise CompareInputError(f"{p}: no xray dump here (no dump.json, journal.jsonl or .h5 file)")
    return units


def pair_units(bench: str | os.PathLike, target: str | os.PathLike) -> tuple[list[tuple[str, Path, Path]], list[str]]:
    """(label, bench, target) pairs, paired by rank folder name, and warnings about the rest."""
    ub, ut = dump_units(bench), dump_units(target)
    if len(ub) == 1 and len(ut) == 1:
        (nb, pb), (nt, pt) = next(iter(ub.items())), next(iter(ut.items()))
        return [(nb if nb == nt and nb.startswith("rank_") else "", pb, pt)], []
    common = [n for n in ub if n in ut]
    notes = []
    if not common:
        if len(ub) == len(ut):
            notes.append(f"no rank names in common; paired {len(ub)} dumps in sorted order")
            return [(f"{a}|{b}", ub[a], ut[b]) for a, b in zip(sorted(ub), sorted(ut))], notes
        raise CompareInputError(f"cannot pair {bench} ({', '.join(ub)}) with {target} ({', '.join(ut)}): "
                                "no rank folders in common; pass one dump on each side")
    for side, units in (("bench", ub), ("target", ut)):
        rest = [n for n in units if n not in common]
        if rest:
            notes.append(f"{side} only: {', '.join(rest)} (not compared)")
    return [(n, ub[n], ut[n]) for n in sorted(common, key=rank_key)], notes


def rank_key(name: str) -> tuple:
    """Sort key of unit names: rank_2 before rank_10."""
    head, _, tail = name.rpartition("_")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def open_dump(path: Path, side: str, notes: list[str]) -> Any:
    """load_dump with the side named in errors; truncation warnings go into ``notes``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            dump = load_dump(path)
        except (DumpFormatError, OSError, KeyError) as e:
            raise CompareInputError(f"{side} dump unusable: {e}") from e
        except ImportError as e:
            raise CompareInputError(f"{side} dump {path}: this xray cannot read module-level dumps ({e})") from e
    for w in caught:
        notes.append(f"{side}: {w.message}")
    return dump


def check_same_format(bench: Any, target: Any, bench_path: Path, target_path: Path, notes: list[str]) -> None:
    fb, ft = getattr(bench, "format", "?"), getattr(target, "format", "?")
    # another tool's reader names the xray format whose records it shares (msprobe L0 ~ xray-module)
    if fb != ft and ft not in getattr(bench, "comparable_with", ()) and fb not in getattr(target, "comparable_with", ()):
        raise CompareInputError(f"{bench_path} is an {fb} dump but {target_path} is an {ft} dump; "
                                "compare two dumps of the same kind (both traces or both module-level)")
    vb = (getattr(bench, "header", None) or {}).get("format_version")
    vt = (getattr(target, "header", None) or {}).get("format_version")
    if vb != vt:
        notes.append(f"format versions differ ({fb} v{vb} vs v{vt}); compared through the shared data model")


def global_rank(name: str) -> int | None:
    """The global rank a dump's unit name is for: ``rank_<r>``, ``rank_<r>.<pid>`` (a second
    process claimed the folder) or ``globalrank-<r>_localrank-<l>`` (module-level .h5)."""
    m = re.fullmatch(r"rank_(\d+)(?:\.\d+)?|globalrank-(\d+)_localrank-\d+", name)
    return int(m.group(1) or m.group(2)) if m else None
