"""The result CSV of a generated test run: its columns, declared once for the plugin and xray-diff."""
from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Iterable

from .reference import THRESHOLDS, Comparison

ERR_COLUMNS = [f"err>{t:.0e}" for t in THRESHOLDS]  # "err>1e-01" ... "err>1e-06"
COLUMNS = ["name", "op_name", "dtype", "shape", "min-val", "max-val", "is_pass", "max_abs_err", "max_rel_err",
           *ERR_COLUMNS, "ref_dtype", "tolerance", "device", "error"]


def _num(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else repr(float(x))


def make_row(name: str, op_name: str, cmp: Comparison | None, *, ref_dtype: str = "", device: str = "",
             error: str = "") -> dict[str, str]:
    """One CSV row (all strings, so it crosses the xdist wire and csv.DictWriter unchanged)."""
    row = {c: "" for c in COLUMNS}
    row.update(name=name, op_name=op_name, ref_dtype=ref_dtype, device=device, error=error.replace("\n", " ")[:500])
    if cmp is None:
        row["is_pass"] = "False"
        return row
    row.update({"dtype": cmp.dtype, "shape": "x".join(str(s) for s in cmp.shape) or "scalar",
                "min-val": _num(cmp.min_val), "max-val": _num(cmp.max_val), "is_pass": str(bool(cmp.is_pass)),
                "max_abs_err": _num(cmp.max_abs_err), "max_rel_err": _num(cmp.max_rel_err),
                "tolerance": _num(cmp.tolerance)})
    for col, t in zip(ERR_COLUMNS, THRESHOLDS):
        row[col] = str(cmp.counts.get(t, 0))
    return row


def write_rows(path: str | os.PathLike, rows: Iterable[dict[str, str]]) -> Path:
    """Write rows sorted by test name, atomically (tmp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in sorted(rows, key=lambda r: r["name"]):
            w.writerow(r)
    os.replace(tmp, path)
    return path
