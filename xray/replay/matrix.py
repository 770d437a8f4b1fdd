"""The support matrix: one CSV row per (record, backend), a terminal summary, and a heatmap.

The CSV columns are declared once (``MATRIX_COLUMNS``) and rows are appended as they are produced, so a
run that is interrupted still leaves a readable matrix of what was done.
"""
from __future__ import annotations

import html
import json
import math
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from ..dump import csv_cells
from ..dump.model import printable
from ..dump.atomic import write_text
from ..backends.base import ReplayStatus
from ..dump.model import Record
from .configs import CONFIG_COLUMNS

# Backend facts with a column of their own (all of them are in ``facts``, as JSON): delegated_nodes
# counts delegate calls (one blob each), delegated_ops the ops inside them; aot_* is export plus
# lowering (and quantization) in the worker, aot_peak_mb the resident memory it added at its peak.
FACT_COLUMNS = ("opset", "delegated_nodes", "undelegated_nodes", "delegated_ops", "delegated_pct",
                "partitioned_ops", "delegate_bytes", "pte_bytes", "model_bytes", "export_s", "lower_s", "aot_s",
                "aot_peak_mb", "dynamic_dims", "second_size")
MATRIX_COLUMNS = ("seq", "op", "module", "count", "signature", "backend", *CONFIG_COLUMNS, "status", "max_abs_err",
                  "max_rel_err", "mean_abs_err", "mean_rel_err", "latency_ms", "cached", *FACT_COLUMNS, "error", "facts")

# Heatmap colours by status (green = OK ... red = crash), also used by the HTML table.
COLORS = {ReplayStatus.OK: "#2e7d32", ReplayStatus.MISMATCH: "#f9a825", ReplayStatus.EXPORT_FAIL: "#8e24aa",
          ReplayStatus.LOWER_FAIL: "#5e35b1", ReplayStatus.RUN_FAIL: "#e65100", ReplayStatus.CRASH: "#b71c1c",
          ReplayStatus.TIMEOUT: "#6d4c41", ReplayStatus.UNSUPPORTED_PLATFORM: "#90a4ae",
          ReplayStatus.BASELINE_FAIL: "#cfd8dc",
          ReplayStatus.NONDETERMINISTIC: "#00838f", ReplayStatus.SECONDARY_DIFFERS: "#7cb342"}


@dataclass
class MatrixRow:
    seq: int
    op: str
    module: str
    count: int
    signature: str
    backend: str
    status: int
    max_abs_err: float | None
    max_rel_err: float | None
    latency_ms: float | None
    cached: bool
    error: str | None
    facts: dict[str, Any] = field(default_factory=dict)
    mean_abs_err: float | None = None
    mean_rel_err: float | None = None
    config: dict[str, Any] = field(default_factory=dict)  # CONFIG_COLUMNS: flow, dtype, shapes, quant, threads

    def as_csv(self) -> dict[str, Any]:
        d = {"seq": self.seq, "op": self.op, "module": self.module, "count": self.count, "signature": self.signature,
             "backend": self.backend, "status": ReplayStatus(self.status).name, "max_abs_err": _num(self.max_abs_err),
             "max_rel_err": _num(self.max_rel_err), "mean_abs_err": _num(self.mean_abs_err),
             "mean_rel_err": _num(self.mean_rel_err), "latency_ms": _num(self.latency_ms), "cached": int(self.cached),
             "error": (self.error or "").replace("\n", " "), "facts": json.dumps(self.facts, default=str)}
        for k in FACT_COLUMNS:
            v = self.facts.get(k)
            d[k] = "" if v is None else v
        for k in CONFIG_COLUMNS:
            d[k] = self.config.get(k, "")
        return d


@dataclass
class ReplayResult:
    """What a replay produced: one MatrixRow per (record, backend), plus the files written."""

    rows: list[MatrixRow]
    records: list[Record]
    skipped: list[tuple[Record, str]]
    backends: list[str]
    baseline: str
    out: Path
    dumps: dict[str, Path]

    def status(self, seq: int, backend: str) -> ReplayStatus:
        return next(ReplayStatus(r.status) for r in self.rows if r.seq == seq and r.backend == backend)


def _num(x: float | None) -> Any:
    return "" if x is None else f"{x:.6g}"


class MatrixWriter:
    """Appends rows to ``matrix.csv.<pid>-<random>.partial`` (``partial_path``) and flushes each, so a killed run keeps what it did;
    ``close`` renames the complete file to ``matrix.csv``."""

    def __init__(self, path: Path) -> None:
        from ..dump.atomic import partial_path

        self.path = Path(path)
        self._partial = partial_path(self.path)
        self._f = open(self._partial, "w", newline="", encoding="utf-8")
        self._w = csv_cells.DictWriter(self._f, fieldnames=MATRIX_COLUMNS)
        self._w.writeheader()

    def add(self, row: MatrixRow) -> None:
        self._w.writerow(row.as_csv())
        self._f.flush()

    def close(self) -> None:
        self._f.close()
        os.replace(self._partial, self.path)


# -- terminal summary -------------------------------------------------------------------------------

def summary_table(result: ReplayResult, worst: int = 3) -> str:
    """Per backend: % supported (ran), % within tolerance, median latency, the worst ops."""
    lines = []
    table = []
    for spec in result.backends:
        rows = [r for r in result.rows if r.backend == spec]
        if not rows:
            continue
        n = len(rows)
        ran = sum(1 for r in rows if ReplayStatus(r.status).supported)
        ok = sum(1 for r in rows if r.status == ReplayStatus.OK)
        lat = [r.latency_ms for r in rows if r.latency_ms is not None]
        counts = {}
        for r in rows:
            counts[ReplayStatus(r.status).name] = counts.get(ReplayStatus(r.status).name, 0) + 1
        table.append([spec + (" (baseline)" if spec == result.baseline else ""), n, f"{100 * ran / n:.0f}%",
                      f"{100 * ok / n:.0f}%", f"{statistics.median(lat):.3f}" if lat else "-",
                      ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))])
    lines.append(tabulate(table, headers=["backend", "ops", "supported", "within tol", "median ms", "statuses"]))
    for spec in result.backends:
        if spec == result.baseline:
            continue
        # A random op's differing values are expected, not a problem: never among the worst.
        bad = [r for r in result.rows
               if r.backend == spec and r.status not in (ReplayStatus.OK, ReplayStatus.NONDETERMINISTIC)]
        bad.sort(key=lambda r: (0 if r.status in (ReplayStatus.UNSUPPORTED_PLATFORM, ReplayStatus.BASELINE_FAIL)
                                else -r.status,
                                -(r.max_rel_err or 0.0)))
        ranked = sorted((r for r in result.rows if r.backend == spec and r.max_rel_err is not None),
                        key=lambda r: -r.max_rel_err)
        show = (bad + [r for r in ranked if r not in bad])[:worst]
        if show:
            lines.append(f"\nworst on {spec}:")
            lines.append(tabulate([[r.seq, _cut(f"{r.op} {r.module}".strip(), 70), ReplayStatus(r.status).name,
                                    _num(r.max_rel_err) or "-",
                                    " ".join((r.error or "").split())[:90]] for r in show],
                                  headers=["seq", "op", "status", "max rel err", "error"]))
    nobody = _unsupported_everywhere(result)
    if nobody:
        # An op with several records (shapes, dtypes: a sweep) may fail in only some of them.
        total = Counter(r.op for r in result.records)
        names = [op if n == total[op] else f"{op} ({n} of {total[op]} records)" for op, n in sorted(nobody.items())]
        lines.append(f"\n{len(nobody)} op(s) no backend could run: " + ", ".join(names))
    if result.skipped:
        lines.append(f"\n{len(result.skipped)} record(s) skipped (inputs cannot be rebuilt):")
        for rec, why in result.skipped[:5]:
            lines.append(f"  seq={rec.seq} {rec.op}: {why[:150]}")
    return "\n".join(lines)


def _unsupported_everywhere(result: ReplayResult) -> Counter[str]:
    """Op -> how many of its records no backend other than the baseline could run."""
    others = [b for b in result.backends if b != result.baseline]
    if not others:
        return Counter()
    by_seq: dict[int, list[MatrixRow]] = {}
    for r in result.rows:
        if r.backend in others:
            by_seq.setdefault(r.seq, []).append(r)
    return Counter(rows[0].op for rows in by_seq.values()
                   if all(not ReplayStatus(r.status).supported and r.status != ReplayStatus.UNSUPPORTED_PLATFORM
                          for r in rows))


# -- heatmap ------------------------------------------------------------------------------------------

def _grid(result: ReplayResult) -> tuple[list[str], list[list[MatrixRow | None]]]:
    # The module path (a sweep's case: its shapes, dtype and arguments) tells same-op rows apart.
    labels = [_cut(f"{r.op.removeprefix('aten.')} #{r.seq}" + (f" {r.module}" if r.module else ""), 90)
              for r in result.records]
    index = {(r.seq, r.backend): r for r in result.rows}
    grid = [[index.get((rec.seq, b)) for b in result.backends] for rec in result.records]
    return labels, grid


def _cut(text: str, limit: int) -> str:
    """A dump's op and module names as a table, a plot or a page shows them: control and bidi
    characters escaped, at most ``limit`` characters."""
    text = printable(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_heatmap(result: ReplayResult, out: Path) -> tuple[Path, Path]:
    """``heatmap.png`` (matplotlib) and ``heatmap.html`` of ops by backend, coloured by status."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    labels, grid = _grid(result)
    order = list(COLORS)
    values = [[order.index(ReplayStatus(c.status)) if c else math.nan for c in row] for row in grid]
    fig_h = max(3.0, 0.22 * len(labels) + 1.5)
    label_w = 0.05 * max((len(x) for x in labels), default=0)  # inches of 6-point text: sweep labels are long
    fig, ax = plt.subplots(figsize=(2.0 + label_w + 1.4 * len(result.backends), fig_h))
    ax.imshow(values, cmap=ListedColormap([COLORS[s] for s in order]), vmin=-0.5, vmax=len(order) - 0.5,
              aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(result.backends)), result.backends, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ax.legend(handles=[Patch(color=COLORS[s], label=s.name) for s in order], fontsize=6,
              bbox_to_anchor=(1.02, 1), loc="upper left")
    ax.set_title("xray-replay support matrix", fontsize=9)
    fig.tight_layout()
    png = Path(out) / "heatmap.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    page = Path(out) / "heatmap.html"
    write_text(page, printable(_html(result, labels, grid), keep="\n"))  # error texts quote the dump too
    return png, page


def _html(result: ReplayResult, labels: list[str], grid: list[list[MatrixRow | None]]) -> str:
    head = "".join(f"<th>{html.escape(b)}</th>" for b in result.backends)
    body = []
    for label, row in zip(labels, grid):
        cells = []
        for c in row:
            if c is None:
                cells.append("<td></td>")
                continue
            st = ReplayStatus(c.status)
            tip = html.escape(f"{st.name}; max rel err {_num(c.max_rel_err) or '-'}; {c.error or ''}")
            err = _num(c.max_rel_err)
            cells.append(f'<td style="background:{COLORS[st]}" title="{tip}">{st.name}'
                         f'{"<br><small>" + err + "</small>" if err else ""}</td>')
        body.append(f"<tr><th>{html.escape(label)}</th>{''.join(cells)}</tr>")
    return ("<!doctype html><meta charset='utf-8'><title>xray-replay</title><style>"
            "body{font:12px sans-serif}td{color:#fff;padding:2px 6px;text-align:center}"
            "th{text-align:left;padding:2px 6px}</style><h3>xray-replay support matrix</h3>"
            f"<table><tr><th>op</th>{head}</tr>{''.join(body)}</table>")


def write_matrix_html(result: ReplayResult, out: Path) -> Path:
    """``matrix.html``: the CSV's rows as a table (the JSON ``facts`` left out), status cells coloured."""
    import pandas as pd

    columns = [c for c in MATRIX_COLUMNS if c not in ("facts", "signature")]
    frame = pd.DataFrame([r.as_csv() for r in result.rows], columns=columns)
    colour = {s.name: c for s, c in COLORS.items()}
    styled = frame.style.hide(axis="index").map(
        lambda v: f"background:{colour.get(v, '#fff')};color:#fff", subset=["status"])
    page = Path(out) / "matrix.html"
    body = styled.to_html(escape="html") if hasattr(styled, "to_html") else frame.to_html(index=False)
    write_text(page, printable("<!doctype html><meta charset='utf-8'><title>xray-replay matrix</title><style>"
                               "body{font:12px sans-serif}td,th{padding:2px 6px;text-align:left}</style>"
                               f"<h3>xray-replay: {len(result.rows)} rows, {len(result.backends)} configurations"
                               f"</h3>{body}", keep="\n"))
    return page
