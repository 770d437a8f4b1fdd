"""The HTML report's interactive part: the rows as JSON embedded in the page, and the page's own
hand-written CSS and JavaScript (a sortable, filterable table; an SVG scatter of error along
execution order whose points select their row). No framework and no CDN: the file works offline."""
from __future__ import annotations

import json
import math
from typing import Callable

from ..dump.model import printable
from .result import CompareRow, PairStatus

#: The table's columns: (CompareRow field, header, numeric). A column empty in every row is left out.
PAGE_COLUMNS: list[tuple[str, str, bool]] = [
    ("index", "#", True), ("rank", "rank", False), ("status", "status", False), ("origin", "origin", False),
    ("cause", "cause", False), ("bench_name", "bench", False), ("target_name", "target", False),
    ("tensor", "out", False), ("mode", "mode", False), ("cosine", "cosine", True),
    ("max_abs_err", "max abs", True), ("rel_rmse", "rel RMSE", True), ("isclose_pct", "close %", True),
    ("stats_err", "stats err", True), ("layout", "layout", False)]

# A million-row compare would make a page of hundreds of MB: past this, every row that did not
# pass is kept and passing rows are sampled evenly (the CSV has them all).
MAX_PAGE_ROWS = 20000

_KEEP_FIRST = {PairStatus.NAN_INF.value: 0, PairStatus.FAIL.value: 1, PairStatus.WARNING.value: 2,
               PairStatus.UNMATCHED.value: 3, PairStatus.SKIP.value: 4, PairStatus.PASS.value: 5}


def page_rows(rows: list[CompareRow], limit: int = MAX_PAGE_ROWS) -> list[int]:
    """Positions in ``rows`` the page embeds, in execution order: all of them up to ``limit``;
    past it the worst statuses first, the last status admitted sampled evenly."""
    if len(rows) <= limit:
        return list(range(len(rows)))
    by_status: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_status.setdefault(_KEEP_FIRST.get(r.status, 5), []).append(i)
    kept: list[int] = []
    for _, positions in sorted(by_status.items()):
        room = limit - len(kept)
        if room <= 0:
            break
        step = max(1, math.ceil(len(positions) / room))
        kept += positions[::step][:room]
    return sorted(kept)


def _number(v) -> float | str | None:
    """JSON has no NaN or Inf: those travel as strings the page reads back; 6 digits are plenty."""
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return float(f"{v:.6g}")


def page_data(rows: list[CompareRow], positions: list[int], plotted: dict[str, Callable[[CompareRow], float | None]],
              first: int | None, total: int) -> dict:
    """What the page's script reads: column declarations, one array per row (its id, the
    declared fields, its module and the plotted values), the first divergence's row id."""
    columns = [(key, label, num) for key, label, num in PAGE_COLUMNS
               if any(getattr(rows[i], key) not in (None, "") for i in positions)]
    keys = ["id"] + [k for k, _, _ in columns] + ["module"] + list(plotted)
    out = []
    for i in positions:
        r = rows[i]
        cells: list = [i]
        for key in keys[1:]:
            v = plotted[key](r) if key in plotted else getattr(r, key)
            # every name comes from a dump: control and bidi characters arrive escaped, as text
            cells.append(printable(v) if isinstance(v, str) else _number(v))
        out.append(cells)
    return {"keys": keys, "columns": [{"key": k, "label": label, "num": num} for k, label, num in columns],
            "rows": out, "first": first, "total": total}


def script_json(data: dict) -> str:
    """``data`` as JSON that is safe inside a <script> element: no ``</script>`` or ``<!--`` can
    end it early (``<``, ``>`` and ``&`` become \\u escapes), and U+2028/2029, which old
    JavaScript parsers read as line ends, are escaped too."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for c in "<>&\u2028\u2029":
        text = text.replace(c, f"\\u{ord(c):04x}")
    return text


PAGE_CSS = """
body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px}th{background:#eee}.fail,.nan{color:#b00}.warning{color:#b60}
.pass{color:#070}.skip,.unmatched{color:#777}ul.tree{list-style:none;padding-left:1.2em;font-size:13px}
.tree summary{cursor:pointer}.first{background:#fdd;font-weight:bold}
.top{font-size:15px;margin:.4em 0}.top code{font-size:13px}
#rows th{cursor:pointer;user-select:none;position:sticky;top:0}
#rows th[aria-sort=ascending]::after{content:" \\25B2"}#rows th[aria-sort=descending]::after{content:" \\25BC"}
#rows td{white-space:nowrap}#rows td.name{white-space:normal;overflow-wrap:anywhere;max-width:32em}
#rows td.num{text-align:right;font-variant-numeric:tabular-nums}
#rows tbody tr{cursor:pointer}#rows tr.selected td{background:#ffe58a}#rows tr.firstrow td:first-child{font-weight:bold}
.tablewrap{max-height:70vh;overflow:auto;border:1px solid #ccc;display:inline-block;max-width:100%}
.controls{margin:.5em 0}.controls input{width:24em}
#plot{border:1px solid #ddd;background:#fff}#plot .pt{cursor:pointer;stroke:none}
#plot .pt.sel{stroke:#000;stroke-width:2}#plot .axis{stroke:#888;fill:none}#plot text{font-size:11px;fill:#333}
#plot .grid{stroke:#eee}#plot .fd{stroke:#000;stroke-dasharray:4 3}
.c-pass{fill:#2ca02c}.c-warning{fill:#ff7f0e}.c-fail{fill:#d62728}.c-nan{fill:#800080}.c-skip{fill:#999}
#tip{position:fixed;display:none;background:#fff;border:1px solid #888;padding:3px 6px;font-size:12px;
pointer-events:none;max-width:40em;overflow-wrap:anywhere}
button.mod{font-size:10px;margin-left:.5em;padding:0 4px}
"""

# Every value from the dump is set as textContent or an attribute, never parsed as HTML.
PAGE_JS = r"""
(function () {
"use strict";
var D = JSON.parse(document.getElementById("xray-data").textContent);
var SPECIAL = {"nan": NaN, "inf": Infinity, "-inf": -Infinity};
var rows = D.rows.map(function (a) {
  var o = {};
  D.keys.forEach(function (k, i) { var v = a[i]; o[k] = (typeof v === "string" && v in SPECIAL) ? SPECIAL[v] : v; });
  return o;
});
var byId = {};
rows.forEach(function (r) { byId[r.id] = r; });
var CSS = {"nan/inf": "nan", "fail": "fail", "warning": "warning", "pass": "pass"};
function css(status) { return CSS[status] || "skip"; }
var PAGE = 500;
var state = {sort: null, dir: 1, text: "", status: "", page: 0, sel: null};
var $ = function (id) { return document.getElementById(id); };

function sig(v) {
  var a = Math.abs(v);
  if (Number.isInteger(v) && a < 1e5) return String(v);  // exact: 0, cosine 1, 100 %
  if (a < 1e-3 || a >= 1e5) return v.toExponential(2);
  var s = v.toPrecision(3);
  return s.indexOf("e") >= 0 ? v.toExponential(2) : s;
}
function fmt(v, key) {
  if (v === null || v === undefined || v === "") return "";
  if (typeof v !== "number") return String(v);
  if (key === "index") return String(v);
  if (isNaN(v)) return "nan";
  if (!isFinite(v)) return v > 0 ? "inf" : "-inf";
  // 3 digits would show 0.99999 as 1.00 and 99.98% as 100: the distance is what tells
  if (key === "cosine" && v > 0.999 && v < 1) return "1\u2212" + sig(1 - v);
  if (key === "isclose_pct" && v < 100 && v > 99.9) return "100\u2212" + sig(100 - v);
  return sig(v);
}
window.xrayFormat = fmt;

// ---- filtering and sorting ----
var textKeys = D.keys.filter(function (k) { return rows.length && rows.some(function (r) { return typeof r[k] === "string"; }); });
function matches(r) {
  if (state.status === "failing" ? !(r.status === "fail" || r.status === "nan/inf")
      : state.status && r.status !== state.status) return false;
  if (!state.text) return true;
  var q = state.text.toLowerCase();
  return textKeys.some(function (k) { return typeof r[k] === "string" && r[k].toLowerCase().indexOf(q) >= 0; });
}
function cmp(a, b) {
  var k = state.sort, x = a[k], y = b[k];
  var xe = x === null || x === "" || (typeof x === "number" && isNaN(x));
  var ye = y === null || y === "" || (typeof y === "number" && isNaN(y));
  if (xe || ye) return xe && ye ? a.id - b.id : (xe ? 1 : -1);  // empty and NaN last either way
  if (x < y) return -state.dir;
  if (x > y) return state.dir;
  return a.id - b.id;
}
function view() {
  var v = rows.filter(matches);
  if (state.sort) v.sort(cmp);
  return v;
}

// ---- the table ----
var table = $("rows"), tbody = table.tBodies[0], info = $("rowinfo");
(function header() {
  var tr = table.tHead.rows[0];
  D.columns.forEach(function (c) {
    var th = document.createElement("th");
    th.textContent = c.label;
    th.setAttribute("data-key", c.key);
    th.title = "sort by " + c.label;
    th.addEventListener("click", function () {
      // first click: worst first (lowest cosine, largest error), execution order and names ascending
      state.dir = state.sort === c.key ? -state.dir : (c.num && c.key !== "cosine" && c.key !== "index" ? -1 : 1);
      state.sort = c.key;
      render();
    });
    tr.appendChild(th);
  });
})();
function render(v) {
  v = v || view();
  var pages = Math.max(1, Math.ceil(v.length / PAGE));
  state.page = Math.min(state.page, pages - 1);
  var frag = document.createDocumentFragment();
  v.slice(state.page * PAGE, (state.page + 1) * PAGE).forEach(function (r) {
    var tr = document.createElement("tr");
    tr.id = "row-" + r.id;
    tr.setAttribute("data-row", r.id);
    tr.className = css(r.status) + (r.id === D.first ? " firstrow" : "") + (r.id === state.sel ? " selected" : "");
    tr.setAttribute("aria-selected", r.id === state.sel ? "true" : "false");
    D.columns.forEach(function (c) {
      var td = document.createElement("td");
      td.textContent = fmt(r[c.key], c.key);
      if (c.num && typeof r[c.key] === "number" && c.key !== "index") { td.className = "num"; td.title = String(r[c.key]); }
      else if (/name$/.test(c.key)) td.className = "name";
      tr.appendChild(td);
    });
    frag.appendChild(tr);
  });
  tbody.textContent = "";
  tbody.appendChild(frag);
  D.columns.forEach(function (c, i) {
    var th = table.tHead.rows[0].cells[i];
    if (state.sort === c.key) th.setAttribute("aria-sort", state.dir > 0 ? "ascending" : "descending");
    else th.removeAttribute("aria-sort");
  });
  info.textContent = v.length + " of " + rows.length + " rows" + (pages > 1 ? ", page " + (state.page + 1) + " of " + pages : "") +
    (D.total > rows.length ? " (the page holds " + rows.length + " of " + D.total + " rows: every row that did not pass, passing rows sampled; the CSV has all)" : "");
  $("prev").disabled = state.page === 0;
  $("next").disabled = state.page >= pages - 1;
}
$("filter").addEventListener("input", function (e) { state.text = e.target.value; state.page = 0; render(); });
$("status").addEventListener("change", function (e) { state.status = e.target.value; state.page = 0; render(); });
$("prev").addEventListener("click", function () { state.page--; render(); });
$("next").addEventListener("click", function () { state.page++; render(); });
tbody.addEventListener("click", function (e) {
  var tr = e.target.closest("tr[data-row]");
  if (tr) select(+tr.getAttribute("data-row"), false);
});

// ---- selection: a row, its points, the address ----
function select(id, scroll) {
  var r = byId[id];
  if (!r) return;
  state.sel = id;
  var v = view(), pos = v.indexOf(r);
  if (pos < 0) {  // filtered out: show every row again rather than select something hidden
    state.text = ""; state.status = ""; $("filter").value = ""; $("status").value = "";
    v = view(); pos = v.indexOf(r);
  }
  state.page = Math.floor(pos / PAGE);
  render(v);
  Array.prototype.forEach.call(document.querySelectorAll("#plot .pt.sel"), function (p) { p.classList.remove("sel"); });
  Array.prototype.forEach.call(document.querySelectorAll('#plot .pt[data-row="' + id + '"]'), function (p) {
    p.classList.add("sel");
    p.parentNode.appendChild(p);  // on top of its neighbours
  });
  var tr = $("row-" + id);
  if (scroll && tr) tr.scrollIntoView({block: "center"});
  if (location.hash !== "#row-" + id) try { history.replaceState(null, "", "#row-" + id); } catch (err) { /* file: in some browsers */ }
}
window.xraySelect = select;
function fromHash() {
  var m = /^#row-(\d+)$/.exec(location.hash);
  if (m) select(+m[1], true);
}
window.addEventListener("hashchange", fromHash);

// ---- the plot: error along execution order, one point per row and panel ----
var NS = "http://www.w3.org/2000/svg";
function el(name, attrs, parent) {
  var e = document.createElementNS(NS, name);
  for (var k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
(function plot() {
  var svg = $("plot");
  var panels = [{key: "rel", label: "relative error", h: 230}, {key: "cosd", label: "1 \u2212 cosine", h: 150}];
  var W = 1000, L = 70, R = 15, T = 10, GAP = 25, B = 35;
  var H = T + panels.reduce(function (s, p) { return s + p.h + GAP; }, 0) - GAP + B;
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  var xs = rows.map(function (r) { return r.index; });
  var x0 = Math.min.apply(null, xs.concat([0])), x1 = Math.max.apply(null, xs.concat([1]));
  function X(i) { return L + (i - x0) / Math.max(1, x1 - x0) * (W - L - R); }
  var order = {"pass": 0, "skip": 0, "unmatched": 0, "warning": 1, "fail": 2, "nan/inf": 3};
  var drawn = rows.slice().sort(function (a, b) { return (order[a.status] || 0) - (order[b.status] || 0); });
  var top = T;
  panels.forEach(function (p, n) {
    var vals = rows.map(function (r) { return r[p.key]; }).filter(function (v) { return typeof v === "number" && v > 0 && isFinite(v); });
    if (!vals.length) vals = [1e-12, 1];
    var lo = Math.floor(Math.log10(Math.min.apply(null, vals))), hi = Math.ceil(Math.log10(Math.max.apply(null, vals)));
    if (hi <= lo) hi = lo + 1;
    var b = top + p.h;
    function Y(v) { return b - (Math.log10(v) - lo) / (hi - lo) * p.h; }
    var g = el("g", {}, svg);
    var step = Math.max(1, Math.ceil((hi - lo) / 6));
    for (var e = lo; e <= hi; e += step) {
      el("line", {"class": "grid", x1: L, x2: W - R, y1: Y(Math.pow(10, e)), y2: Y(Math.pow(10, e))}, g);
      el("text", {x: L - 4, y: Y(Math.pow(10, e)) + 4, "text-anchor": "end"}, g).textContent = "1e" + e;
    }
    el("rect", {"class": "axis", x: L, y: top, width: W - L - R, height: p.h}, g);
    el("text", {x: 12, y: top + p.h / 2, transform: "rotate(-90 12 " + (top + p.h / 2) + ")", "text-anchor": "middle"}, g).textContent = p.label;
    if (D.first !== null && byId[D.first]) {
      var fx = X(byId[D.first].index);
      el("line", {"class": "fd", x1: fx, x2: fx, y1: top, y2: b}, g);
      if (n === 0) el("text", {x: fx + 4, y: top + 12}, g).textContent = "first divergence";
    }
    drawn.forEach(function (r) {
      var v = r[p.key];
      if (typeof v !== "number" || !(v > 0) || !isFinite(v)) return;
      el("circle", {"class": "pt c-" + css(r.status), cx: X(r.index).toFixed(1), cy: Y(v).toFixed(1), r: 2.5, "data-row": r.id}, g);
    });
    top = b + GAP;
  });
  el("text", {x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle"}, svg).textContent = "execution order (row #)";
  svg.addEventListener("click", function (e) {
    var t = e.target.closest("[data-row]");
    if (t) select(+t.getAttribute("data-row"), true);
  });
  var tip = $("tip");
  svg.addEventListener("mouseover", function (e) {
    var t = e.target.closest("[data-row]");
    if (!t) { tip.style.display = "none"; return; }
    var r = byId[+t.getAttribute("data-row")];
    tip.textContent = "#" + r.index + " " + r.status + "  " + (r.bench_name || r.target_name || "") +
      "  rel " + fmt(r.rel, "rel") + "  1\u2212cos " + fmt(r.cosd, "cosd");
    tip.style.left = (e.clientX + 12) + "px"; tip.style.top = (e.clientY + 12) + "px"; tip.style.display = "block";
  });
  svg.addEventListener("mouseout", function () { tip.style.display = "none"; });
})();

// ---- the module tree: open or close all, a module's rows ----
$("tree-open") && $("tree-open").addEventListener("click", function () {
  Array.prototype.forEach.call(document.querySelectorAll(".tree details"), function (d) { d.open = true; });
});
$("tree-close") && $("tree-close").addEventListener("click", function () {
  Array.prototype.forEach.call(document.querySelectorAll(".tree details"), function (d) { d.open = false; });
});
document.addEventListener("click", function (e) {
  var b = e.target.closest("button.mod");
  if (!b) return;
  e.preventDefault();  // inside a <summary>: filter, do not fold
  state.text = b.getAttribute("data-module"); state.page = 0; $("filter").value = state.text;
  render();
  table.scrollIntoView({block: "start"});
});

render();
fromHash();
})();
"""
