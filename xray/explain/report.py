"""explain.json, the HTML module tree coloured by share, and the terminal tables."""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

from tabulate import tabulate

from .analysis import Explanation, Row


def _num(v: float | None, pct: bool = False) -> str:
    if v is None:
        return ""
    if pct:
        return "-inf" if v == -math.inf else f"{100 * v:.1f}%"
    return f"{v:.3g}"


def _finite(v):
    """JSON has no Infinity: non-finite numbers are written as strings ("inf", "nan")."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def write_json(x: Explanation, path: Path) -> Path:
    path.write_text(json.dumps(_finite(x.to_json()), indent=1))
    return path


def write_fix_json(f, path: Path) -> Path:
    path.write_text(json.dumps(_finite(f.to_json()), indent=1))
    return path


def terminal(x: Explanation, top: int = 10) -> str:
    """The ranking, the top module's calls and the verdict."""
    head = ["module", "class", "self share", "share", "error grafted", "prefix error", "local err", "accum. err"]
    rows = [[r.name, r.what, _num(r.self_share, True), _num(r.share, True), _num(r.error_grafted),
             _num(r.prefix_error), _num(r.local_err), _num(r.accumulated_err)] for r in x.ranking()[:top]]
    text = [f"bench {x.bench} vs target {x.target}: final error {x.error:.3g} ({x.seconds:.1f} s)", "",
            tabulate(rows, head, tablefmt="simple", disable_numparse=True)]
    groups = [r for r in x.rows if r.kind == "group"]
    if groups:
        text += ["", "not descended (--search tree): " + "; ".join(
            f"{r.name} ({r.what}) {_num(r.share, True)}" for r in sorted(groups, key=lambda r: -r.share))]
    ops = op_rows(x, top)
    if ops:
        text += ["", tabulate([[r.name, _num(r.share, True), _num(r.error_grafted), r.status, r.origin,
                                _num(r.local_err), _num(r.local_floor)] for r in ops],
                              ["call (compare's name)", "share", "error grafted", "compare", "origin", "local err",
                               "local floor"], tablefmt="simple", disable_numparse=True)]
    return "\n".join(text + [f"note: {n}" for n in x.notes] + ["", "verdict: " + x.verdict])


def op_rows(x: Explanation, top: int) -> list[Row]:
    """The ``top`` op rows by share, and every call compare singles out (born wrong, its first
    divergence, the first Inf/NaN) wherever its share ranks: the call to look at is never cut."""
    ranked = sorted((r for r in x.rows if r.kind == "op"), key=lambda r: -(r.share or 0))
    shown = ranked[:top]
    return shown + [r for r in ranked[top:] if r.key]


def _colour(share: float | None) -> str:
    """White (nothing) to red (all of the final error), by self share."""
    s = 0.0 if share is None or not math.isfinite(share) else max(0.0, min(1.0, share))
    g = int(255 * (1 - s))
    return f"rgb(255,{g},{g})"


NEGATIVE = ("A negative share means that grafting the bench's value there made the final error larger: the "
            "place's own error partly cancels errors made elsewhere (the final error is a max-norm, which does "
            "not add up). It is printed as measured and coloured white, as no share.")


def write_html(x: Explanation, path: Path) -> Path:
    """The module tree (nested by path) coloured by self share; self-contained, no scripts."""
    # a parent, then its children; with --search tree only what was measured, and the groups left whole
    shown = [r for r in x.rows if r.kind == "group" or (r.kind == "module" and r.share is not None)]
    modules = sorted(shown or [r for r in x.rows if r.kind == "module"], key=lambda r: r.tree)
    ops: dict[str, list[Row]] = {}
    for r in x.rows:
        if r.kind == "op":
            ops.setdefault(r.module, []).append(r)
    def line(r: Row) -> str:
        calls = "".join(f"<li class=op style='background:{_colour(o.share)}'><code>{html.escape(o.name)}</code> "
                        f"share {_num(o.share, True)}, compare {html.escape(o.status)} {html.escape(o.origin)}, "
                        f"local {_num(o.local_err)}</li>" for o in ops.get(r.name, []))
        return (f"<li style='margin-left:{1.2 * (r.depth - 1):.1f}em;background:{_colour(r.self_share)}'>"
                f"<code>{html.escape(r.name)}</code> <i>{html.escape(r.what)}</i> "
                f"self {_num(r.self_share, True)} · share {_num(r.share, True)} · local {_num(r.local_err)} · "
                f"accumulated {_num(r.accumulated_err)} · fixed up to here {_num(r.prefix_error)}"
                + (f"<ul>{calls}</ul>" if calls else "") + "</li>")

    body = "\n".join(line(r) for r in modules)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>xray explain</title>
<style>body{{font-family:sans-serif;margin:2em}} ul{{list-style:none;padding-left:0}}
li{{padding:2px 6px;margin:1px 0;border-radius:3px}} code{{font-size:90%}}</style></head><body>
<h1>xray explain: {html.escape(x.bench)} vs {html.escape(x.target)}</h1>
<p>Final error {_num(x.error)}. <b>{html.escape(x.verdict)}</b></p>
<p>Colour: the share of the final error a module's own code makes (self share: grafting its output
minus feeding it the bench's inputs, its child modules left out); white none, red all. docs/explain.md.</p>
<p>{html.escape(NEGATIVE)}</p>
<ul>{body}</ul></body></html>"""
    path.write_text(page)
    return path


def fix_text(f) -> str:
    lines = [f"bench {f.bench} vs target {f.target}: final error {f.error_before:.3g}, bound {f.max_error:g} "
             f"({f.seconds:.1f} s, {len(f.trials)} trial runs)"]
    if f.born:
        lines.append(f"searched from the first Inf/NaN the bench does not have: {f.born}")
    notes = [f"note: {n}" for n in f.notes]
    if not f.modules and not f.ops and f.found:
        return "\n".join(lines + ["already under the bound: nothing to keep in fp32"])
    if not f.found:
        return "\n".join(lines + notes + [f"no set of fp32 islands among the modules tried reaches the bound "
                                          f"(the best: {_num(f.error_after)})"])
    where = "; ".join(f"{m or 'the model itself'}: {', '.join(o)}" for m, o in f.ops.items())
    keep = [f"{len(f.modules)} module(s) in fp32: {', '.join(f.modules)}"] if f.modules else []
    if f.ops and not f.op_code:  # an op kind is part of the fix itself (where an overflow is born)
        keep.append(f"these ATen ops in fp32: {where}")
    lines += [f"keep {', and '.join(keep)}",
              f"final error before {f.error_before:.3g}, after {f.error_after:.3g}", *notes, "",
              "# paste after building the model:", f.code]
    if f.op_code:
        lines += [f"# or, finer (then ops): keep only these ATen ops in fp32: {where}; "
                  f"final error after {f.error_after_ops:.3g}", f.op_code]
    return "\n".join(lines)
