"""The result CSV of a generated test run: its columns, declared once for the plugin and xray-diff."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable

from ..dump import csv_cells
from ..dump.atomic import atomic_write
from .reference import THRESHOLDS, OutputVerdict

ERR_COLUMNS = [f"err>{t:.0e}" for t in THRESHOLDS]  # "err>1e-01" ... "err>1e-06"
# the noise measurement: CPU at the device's dtype against the same fp64 reference (docs/gen.md)
NOISE_COLUMNS = ["cpu_max_abs_err", "noise_level", "err_vs_noise", "max_ulp_err"]
RESULT_COLUMNS = ["name", "op_name", "dtype", "shape", "min-val", "max-val", "is_pass", "max_abs_err",
                  "max_rel_err", *ERR_COLUMNS, *NOISE_COLUMNS, "ref_dtype", "device", "error"]


def _num(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else repr(float(x))


def make_row(name: str, op_name: str, verdict: OutputVerdict | None, *, ref_dtype: str = "", device: str = "",
             error: str = "") -> dict[str, str]:
    """One CSV row (all strings, so it crosses the xdist wire and csv.DictWriter unchanged)."""
    row = {c: "" for c in RESULT_COLUMNS}
    row.update(name=name, op_name=op_name, ref_dtype=ref_dtype, device=device, error=error.replace("\n", " ")[:500])
    if verdict is None:
        row["is_pass"] = "False"
        return row
    v = verdict
    row.update({"dtype": v.dtype, "shape": "x".join(str(s) for s in v.shape) or "scalar",
                "min-val": _num(v.min_val), "max-val": _num(v.max_val), "is_pass": str(bool(v.is_pass)),
                "max_abs_err": _num(v.max_abs_err), "max_rel_err": _num(v.max_rel_err),
                "cpu_max_abs_err": _num(v.cpu_max_abs_err), "noise_level": _num(v.noise_level),
                "err_vs_noise": _num(v.err_vs_noise), "max_ulp_err": _num(v.max_ulp_err)})
    for col, t in zip(ERR_COLUMNS, THRESHOLDS):
        row[col] = str(v.counts.get(t, 0))
    return row


def write_rows(path: str | os.PathLike, rows: Iterable[dict[str, str]]) -> Path:
    """Write rows sorted by test name, atomically (tmp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, newline="") as f:
        w = csv_cells.DictWriter(f, fieldnames=RESULT_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in sorted(rows, key=lambda r: r["name"]):
            w.writerow(r)
    return path
