"""Write a CompareResult: CSV (pandas-readable), summary JSON, terminal table, self-contained HTML."""
from __future__ import annotations

import base64
import io
import json
import math
import os
import textwrap
from collections import Counter
from html import escape
from operator import attrgetter
from pathlib import Path

from tabulate import tabulate

from ..dump import csv_cells
from ..dump.model import printable
from ..dump.atomic import atomic_write, write_text
from .result import COMPARE_COLUMNS, CompareResult, CompareRow, PairStatus, Summary

_FAIL_ORDER = {PairStatus.NAN_INF.value: 0, PairStatus.FAIL.value: 1, PairStatus.WARNING.value: 2}


def write_csv(result: CompareResult, path: str | os.PathLike) -> None:
    """One line per row. Fields are read with one attrgetter, not ``asdict`` (which deep-copies
    every row: a minute at a million rows); the text is what csv.DictWriter wrote."""
    get = attrgetter(*COMPARE_COLUMNS)
    with atomic_write(path, newline="") as f:
        w = csv_cells.Writer(f)  # names from the dump cannot become spreadsheet formulas
        w.writerow(COMPARE_COLUMNS)
        w.writerows(["" if v is None else v for v in get(r)] for r in result.rows)


def write_summary_json(result: CompareResult, path: str | os.PathLike) -> None:
    write_text(path, json.dumps(result.summary.to_json(), indent=2, default=str) + "\n")


def worst_rows(rows: list[CompareRow], n: int = 10) -> list[CompareRow]:
    """Failing rows first (NaN/Inf, fail, warning), most different first (lowest cosine, then error)."""
    bad = [r for r in rows if r.status in _FAIL_ORDER]
    return sorted(bad, key=lambda r: (_FAIL_ORDER[r.status], r.cosine if r.cosine is not None else 2.0,
                                      -(r.max_abs_err or r.stats_err or 0.0)))[:n]


def _fmt(v) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _short(name: str, width: int = 60) -> str:
    """A record name at most ``width`` long that keeps what it means: its op (namespace and the
    ``.default`` overload dropped first) and #seq whole, the module path cut from the left by
    whole components, its last component always kept."""
    if len(name) <= width:
        return name
    module, sep, op = name.rpartition("/")
    if not sep:  # a module record: <module path>.<Class>.<call>.<direction>
        parts = name.split(".")
        if len(parts) < 4 or parts[-1] not in ("forward", "backward"):
            return "…" + name[-(width - 1):]
        module, op, sep = ".".join(parts[:-3]), ".".join(parts[-3:]), "."
    for shorter in ((op.replace(".default#", "#"), op.replace(".default#", "#").split(".", 1)[-1])
                    if sep == "/" else ()):
        op = shorter
        if len(module) + 1 + len(op) <= width:
            return f"{module}/{op}"
    parts = module.split(".")
    while len(parts) > 1 and len("….".join(["", *parts])) + 1 + len(op) > width:
        parts.pop(0)
    shown = ("…" if parts != module.split(".") else "") + ".".join(parts)
    text = f"{shown}{sep}{op}"
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _table_rows(rows: list[CompareRow]) -> list[list[str]]:
    return [[r.index, r.status, r.origin, _short(printable(r.bench_name or "-")), _short(printable(r.target_name or "-")),
             r.tensor,
             r.mode, _fmt(r.cosine), _fmt(r.max_abs_err), _fmt(r.isclose_pct), _fmt(r.stats_err), r.layout]
            for r in rows]


TABLE_HEADERS = ["#", "status", "origin", "bench", "target", "out", "mode", "cosine", "max abs", "close %",
                 "stats err", "layout"]  # the HTML report's worst rows (a page has room for every column)

TERMINAL_WIDTH = 120  # the worst-rows table fits a common terminal; every column is in the CSV

#: The worst-rows table: (header, CompareRow -> cell). The record column shows the bench's name.
_WORST_COLUMNS = [("rank", lambda r: r.rank), ("#", lambda r: r.index), ("status", lambda r: r.status),
                  ("origin", lambda r: r.origin),
                  ("record (bench)", lambda r: printable(r.bench_name or r.target_name or "-")),
                  ("out", lambda r: r.tensor),
                  ("cosine", lambda r: _fmt(r.cosine)), ("max abs", lambda r: _fmt(r.max_abs_err)),
                  ("close %", lambda r: _fmt(r.isclose_pct)), ("stats err", lambda r: _fmt(r.stats_err)),
                  ("layout", lambda r: r.layout)]


def worst_table(rows: list[CompareRow], width: int = TERMINAL_WIDTH) -> str:
    """The worst rows as a table at most ``width`` wide: columns empty in every row are left
    out, and record names are shortened from the left (their tail names the op and its #seq)."""
    columns = [(h, f) for h, f in _WORST_COLUMNS if any(f(r) not in (None, "") for r in rows)]
    cells = [[f(r) for _, f in columns] for r in rows]
    name = [h for h, _ in columns].index("record (bench)")
    longest = max(len(str(c[name])) for c in cells)
    for name_width in range(longest, 11, -1):
        shown = [c[:name] + [_short(str(c[name]), name_width)] + c[name + 1:] for c in cells]
        text = tabulate(shown, headers=[h for h, _ in columns], tablefmt="simple")
        if max(map(len, text.splitlines())) <= width:
            break
    return text


def terminal_report(result: CompareResult, worst: int = 10) -> str:
    s = result.summary
    totals = [["records (bench / target)", f"{s.bench_records} / {s.target_records}"],
              ["matched records", f"{s.matched} ({s.match_pct:g}%)"],
              ["unmatched records (bench / target)", f"{s.unmatched_bench} / {s.unmatched_target}"],
              ["pairs: pass / warning / fail / nan-inf / skip", f"{s.passed} / {s.warned} / {s.failed} / {s.nan_inf} / {s.skipped}"],
              ["tensor data compared", f"{s.bytes_compared / 1e9:.3f} GB in {s.seconds:.2f} s"]]
    out = [f"!! {d}" for d in s.dedup] + [f"!! {label} NOT COMPARED: {e}" for label, e in s.errors.items()]
    out += [f"!! {w}" for w in getattr(s, "stopped", ())]
    out += [f"!! ranks disagree: {w}" for w in getattr(s, "cross_rank", ())]
    out.append(tabulate(totals, tablefmt="simple"))
    fd = s.first_divergence
    if fd:
        how = "error born here" if fd["origin"] == "born" else f"origin {fd['origin']}: no failing record with agreeing inputs"
        out.append(f"\nFIRST DIVERGENCE ({how}): row {fd['index']}{' rank ' + fd['rank'] if fd['rank'] else ''}\n"
                   f"  bench:  {fd['bench']}  [{fd['tensor']}]\n  target: {fd['target']}")
        if fd.get("cause"):
            out.append(f"  cause:  {fd['cause']}: {fd.get('culprit') or ''}{_errors(fd)}")
    else:
        out.append(("\nNo divergence in what was recorded, but a recording STOPPED early (above)."
                    if getattr(s, "stopped", None) else "\nNo divergence: no row failed.") +
                   (" But a dump is de-duplicated (above): calls it folded away were not compared." if s.dedup else ""))
    if len(s.ranks) > 1 and s.divergence_order:
        out.append("\n" + rank_order_table(s))
    bad = worst_rows(result.rows, worst)
    if bad:
        out.append("\nWorst rows (all columns, target names included, are in the CSV):\n" + worst_table(bad))
    for w in s.warnings:
        out.append(f"warning: {w}")
    if s.verdict:  # wrapped: the console report fits 120 columns
        out.append("\n" + textwrap.fill(f"verdict: {s.verdict_kind}: {s.verdict}", width=100, subsequent_indent="  ",
                                         break_long_words=False, break_on_hyphens=False))
    return printable("\n".join(out), keep="\n")  # a dump's names in any line: control and bidi characters escaped


def rank_order_table(s: Summary) -> str:
    """The diverging ranks, first first. Ranks share no clock: they are ordered by how many
    collectives ran before their first divergence, then by how far into that interval it came."""
    from .sync_points import is_collective

    cells = []
    for label in s.divergence_order:
        r = s.ranks[label]
        fd, sync = r["first_divergence"], r["sync"]
        via = " (received in the collective)" if is_collective(fd.get("target_op") or fd["op"] or "") else ""
        cells.append([label, sync["collectives"], sync["offset"], _short(fd["target"] or fd["bench"] or "-", 50),
                      f"{fd['origin']}{via}", fd.get("cause") or ""])
    return ("Ranks in the order they diverged (collectives that ran before each rank's first divergence):\n" +
            tabulate(cells, headers=["rank", "collectives", "offset", "first divergence (target)", "origin", "cause"],
                     tablefmt="simple"))


def _errors(fd: dict) -> str:
    parts = [f"{k.replace('_err', '')} {fd[k]:.3g}" for k in ("local_err", "local_floor", "accumulated_err")
             if fd.get(k) is not None]
    return f" ({', '.join(parts)})" if parts else ""


def _plot_png(rows: list[CompareRow], first: int | None) -> str:
    """Error along execution order as a base64 PNG: where the drift is born and how it grows. The
    page draws it itself; this is what a viewer with scripts turned off shows.

    Top: relative error (RMSE over the bench's RMS; statistics rows: their stats error), which
    a scaling bug moves (x1.01 -> 0.01). Bottom: 1 - cosine, which only direction moves (a
    scaling bug stays at the floor there): both, so neither kind of error hides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"pass": "tab:green", "warning": "tab:orange", "fail": "tab:red", "nan/inf": "purple"}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.6), dpi=100, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    for ax, value, label in ((top, _relative_error, "relative error\n(rel. RMSE / stats err)"),
                             (bottom, _cosine_distance, "1 - cosine")):
        for status, color in colors.items():
            pts = [(r.index, value(r)) for r in rows if r.status == status and value(r) is not None]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, c=color, label=status)
        if first is not None:
            ax.axvline(first, color="black", linestyle="--", linewidth=1, label="first divergence")
        ax.set_yscale("log")
        ax.set_ylabel(label)
    top.legend(loc="upper left", fontsize=8)
    bottom.set_xlabel("execution order (row)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


_FLOOR = 1e-12  # log scale: an exact match is drawn at the floor


def _relative_error(r: CompareRow) -> float | None:
    if r.rel_rmse is not None and math.isfinite(r.rel_rmse):
        return max(r.rel_rmse, _FLOOR)
    if r.stats_err is not None and math.isfinite(r.stats_err):
        return max(r.stats_err, _FLOOR)
    return None


def _cosine_distance(r: CompareRow) -> float | None:
    return max(1.0 - r.cosine, _FLOOR) if r.cosine is not None and math.isfinite(r.cosine) else None


_HTML = """<!doctype html><html><head><meta charset="utf-8"><title>xray-compare</title>
<style>{{ css }}</style></head><body>
<h1>xray-compare</h1><p>bench: <code>{{ s.bench }}</code><br>target: <code>{{ s.target }}</code></p>
{% if s.verdict %}<p class="top verdict {{ 'fail' if s.verdict_kind == 'bug' else ('warning' if s.verdict_kind == 'cannot tell' else 'pass') }}"><b>verdict: {{ s.verdict_kind }}</b>: {{ s.verdict }}</p>{% endif %}
{% if fd %}<p class="top first-divergence"><b>First divergence</b>: {% if fd_id is not none %}<a href="#row-{{ fd_id }}" data-row="{{ fd_id }}">row {{ fd.index }}</a>{% else %}row {{ fd.index }}{% endif %}{% if fd.rank %} rank {{ fd.rank }}{% endif %} ({{ fd.origin }}): bench <code>{{ fd.bench }}</code> vs target
<code>{{ fd.target }}</code> [{{ fd.tensor }}]{% if fd.layout %}, layout: {{ fd.layout }}{% endif %}{% if fd.cause %}; cause: {{ fd.cause }}{% endif %}</p>
{% else %}<p class="top">No row failed.</p>{% endif %}
{% if s.dedup %}<h2 class="fail">De-duplicated dumps</h2><ul>{% for w in s.dedup %}<li>{{ w }}</li>{% endfor %}</ul>{% endif %}
<table>{% for k, v in totals %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}</table>
{% if fd and fd.cause %}<h2>First divergence</h2><table><tr><th>cause</th><td>{{ fd.cause }}</td></tr><tr><th>culprit</th><td>{{ fd.culprit }}</td></tr>
<tr><th>local error (vs float64 recomputation on the target's inputs)</th><td>{{ fd.local_err if fd.local_err is not none else "not measured" }}</td></tr>
<tr><th>local floor (CPU at the target's dtype)</th><td>{{ fd.local_floor if fd.local_floor is not none else "" }}</td></tr>
<tr><th>accumulated error (target vs bench)</th><td>{{ fd.accumulated_err if fd.accumulated_err is not none else "" }}</td></tr></table>{% endif %}
<h2>Error along execution order</h2>
<p>Top: relative error (a scaling bug shows here); bottom: 1 - cosine (a direction error shows here). Click a point to select its row.</p>
<svg id="plot" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="error along execution order"></svg><div id="tip"></div>
<noscript><p>Scripts are off here: the plot as a picture, and no table of every row (the CSV has them).</p>
<img alt="error plot" src="data:image/png;base64,{{ png }}"></noscript>
<h2>Rows</h2>
<div class="controls"><input id="filter" type="search" placeholder="filter: name, module, op, cause..." aria-label="filter rows">
<select id="status" aria-label="status"><option value="">every status</option><option value="failing">fail or nan/inf</option>{% for st in statuses %}<option value="{{ st }}">{{ st }}</option>{% endfor %}</select>
<button id="prev">&lt; previous</button><button id="next">next &gt;</button> <span id="rowinfo"></span></div>
<div class="tablewrap"><table id="rows"><thead><tr></tr></thead><tbody></tbody></table></div>
{% if tree %}<h2>Modules (coloured by their worst row{% if fd %}; the first divergence is marked{% endif %})</h2>
<button id="tree-open">open all</button><button id="tree-close">close all</button>{{ tree }}{% endif %}
{% if worst %}<h2>Worst rows</h2><table><tr>{% for h in headers %}<th>{{ h }}</th>{% endfor %}</tr>
{% for cells, test, id in worst %}<tr>{% for c in cells %}<td>{% if loop.first %}<a href="#row-{{ id }}" data-row="{{ id }}">{{ c }}</a>{% else %}{{ c }}{% endif %}</td>{% endfor %}{% if linked %}<td>{% if test %}<a href="{{ test }}">{{ test.rsplit("/", 1)[-1] }}</a>{% endif %}</td>{% endif %}</tr>{% endfor %}</table>{% endif %}
{% if errors %}<h2>Local vs accumulated error of failing rows</h2>{{ errors }}{% endif %}
{% if unmatched_count %}<h2>Unmatched ({{ unmatched_count }})</h2>{{ unmatched }}{% endif %}
{% if s.warnings %}<h2>Warnings</h2><ul>{% for w in s.warnings %}<li>{{ w }}</li>{% endfor %}</ul>{% endif %}
<script type="application/json" id="xray-data">{{ data }}</script>
<script>{{ js }}</script>
</body></html>"""


def write_html(result: CompareResult, path: str | os.PathLike, worst: int = 50, max_unmatched: int = 500,
               tests: str | os.PathLike | None = None) -> None:
    """One file, no external assets, works offline: the rows travel as JSON and the page's own
    script draws the plot and the sortable, filterable table (report_page.py). ``tests``: an
    xray-gen folder; a worst row links to the generated test file of its op when that file is there."""
    from jinja2 import Environment

    from .report_page import PAGE_CSS, PAGE_JS, page_data, page_rows, script_json

    s = result.summary
    fd = s.first_divergence
    ids = {(r.rank, r.index): i for i, r in enumerate(result.rows)}  # a row's id: its position (ranks repeat indices)
    fd_id = ids.get((fd.get("rank") or "", fd["index"])) if fd else None
    if fd and fd_id is None:  # a summary whose rank label the rows spell differently
        fd_id = next((i for i, r in enumerate(result.rows) if r.index == fd["index"]), None)
    unmatched = [r for r in result.rows if r.status == PairStatus.UNMATCHED.value]
    failing = [r for r in result.rows if r.origin or r.cause][:worst]
    positions = page_rows(result.rows)
    present = {r.status for r in result.rows}
    data = page_data(result.rows, positions, {"rel": _relative_error, "cosd": _cosine_distance}, fd_id,
                     len(result.rows))
    env = Environment(autoescape=True)
    html = env.from_string(_HTML).render(
        s=s, fd=fd, fd_id=fd_id, png=_plot_png(result.rows, fd["index"] if fd else None),
        css=_markup(PAGE_CSS), js=_markup(PAGE_JS), data=_markup(script_json(data)),
        statuses=[st.value for st in PairStatus if st.value in present],
        totals=[("records bench / target", f"{s.bench_records} / {s.target_records}"),
                ("matched", f"{s.matched} ({s.match_pct:g}%)"),
                ("pass / warning / fail / nan-inf / skip / unmatched",
                 f"{s.passed} / {s.warned} / {s.failed} / {s.nan_inf} / {s.skipped} / {s.unmatched}")],
        tree=_markup(module_tree_html(result.rows, (fd or {}).get("module"))),
        headers=TABLE_HEADERS + (["test"] if tests is not None else []), linked=tests is not None,
        worst=[(cells, _test_link(r, tests, path), ids[(r.rank, r.index)]) for r, cells in
               ((r, _table_rows([r])[0]) for r in worst_rows(result.rows, worst))],
        unmatched=_markup(tabulate([[r.index, r.bench_name or "-", r.target_name or "-", r.tensor, r.note]
                                    for r in unmatched[:max_unmatched]],
                                   headers=["#", "bench", "target", "out", "note"], tablefmt="html")),
        unmatched_count=len(unmatched),
        errors=_markup(tabulate([[r.index, r.status, r.origin, r.cause, _short(r.target_name or "-"), _fmt(r.local_err),
                                  _fmt(r.local_floor), _fmt(r.accumulated_err), r.culprit] for r in failing],
                                headers=["#", "status", "origin", "cause", "target", "local err", "local floor",
                                         "accumulated err", "culprit"], tablefmt="html")) if failing else "")
    write_text(path, printable(html, keep="\n"))  # html.escape leaves control and bidi characters


def _test_link(r: CompareRow, tests: str | os.PathLike | None, html: str | os.PathLike) -> str:
    """The generated test file of the row's op (xray-gen names it test_<ns>_<op>_<overload>.py),
    relative to the report, or "" when there is none."""
    op = r.bench_op or r.target_op
    if tests is None or op.count(".") != 2:
        return ""
    file = Path(tests) / f"test_{op.replace('.', '_')}.py"
    return Path(os.path.relpath(file, Path(html).resolve().parent)).as_posix() if file.is_file() else ""


_WORST = {s: i for i, s in enumerate(["nan/inf", "fail", "warning", "pass", "skip", "unmatched"])}
MAX_TREE_NODES = 5000  # a report stays readable (and small) on the largest models


def module_tree_html(rows: list[CompareRow], first_module: str | None) -> str:
    """The module hierarchy as nested lists, each module coloured by the worst status of the rows
    under it; modules on the first divergence's path are marked and open. "" when no row names a
    module."""
    tree: dict = {}
    for r in rows:
        if not r.module or r.status not in _WORST:
            continue
        node = tree
        for part in r.module.split("."):
            node = node.setdefault(part, {})
        stats = node.setdefault(None, Counter())
        stats[r.status] += 1
    if not tree:
        return ""
    first = first_module.split(".") if first_module else []
    count = [0]

    def totals(node: dict) -> Counter:
        c = Counter(node.get(None, {}))
        for k, child in node.items():
            if k is not None:
                c += totals(child)
        return c

    def render(node: dict, path: list[str]) -> str:
        items = []
        for name, child in node.items():
            if name is None or count[0] >= MAX_TREE_NODES:
                continue
            count[0] += 1
            here = path + [name]
            c = totals(child)
            worst = min(c, key=_WORST.__getitem__)
            on_path = here == first[:len(here)]
            label = (f"{'.'.join(here) if not path else name} — {worst}, {sum(c.values())} rows"
                     + (f", {c['fail'] + c['nan/inf']} failing" if c["fail"] + c["nan/inf"] else "")
                     + (" ◀ first divergence" if on_path and len(here) == len(first) else ""))
            css = f"{_css(worst)}{' first' if on_path else ''}"
            # the page's script filters the table to this module's rows
            rows_button = f'<button class="mod" data-module="{escape(".".join(here))}">rows</button>'
            inner = render(child, here)
            if inner:
                is_open = " open" if on_path or worst in ("fail", "nan/inf") else ""
                items.append(f'<li><details{is_open}><summary class="{css}">{escape(label)}{rows_button}</summary>'
                             f'{inner}</details></li>')
            else:
                items.append(f'<li class="{css}">{escape(label)}{rows_button}</li>')
        return f'<ul class="tree">{"".join(items)}</ul>' if items else ""

    return render(tree, [])


def _css(status: str) -> str:
    return {"nan/inf": "nan", "fail": "fail", "warning": "warning", "pass": "pass"}.get(status, "skip")


def _markup(html: str):
    from markupsafe import Markup

    return Markup(html)  # tabulate escapes cell text itself
