"""The terminal report of ``xray drift``: one line per backend, then each backend's layers.

Columns are declared once here (``BACKEND_COLUMNS``, ``LAYER_COLUMNS``)."""
from __future__ import annotations

import textwrap

from tabulate import tabulate

from .run import OK, BackendDrift, DriftResult

BACKEND_COLUMNS = ["backend", "status", "exposes", "mapped", "first drifting layer", "node / op", "origin / cause",
                   "local err", "accumulated err", "seconds"]
LAYER_COLUMNS = ["layer", "outputs", "worst", "born", "local err (floor)", "isolated err", "accumulated err"]


def _g(v: float | None) -> str:
    return "" if v is None else f"{v:.3g}"


QUANT_HEADERS = ["layer", "outputs", "verdict", "SQNR dB", "rel err", "SQNR lost dB", "rms err (steps)",
                 "allowed (steps)", "node"]


def _first(b: BackendDrift) -> list[str]:
    if b.status != OK:
        return ["(failed: the error is below the table)", "", "", "", ""]
    if b.quant is not None:
        q = b.quant
        row = next((lr for lr in q["layers"] if lr["layer"] == q["first_beyond"]), None)
        if row is None:
            return [f"none beyond {q['scheme']} quantization", "", "", "", ""]
        return [row["layer"], row["node"], f"beyond {q['scheme']}", "", _g(row["rel_err"])]
    fd = b.first
    if fd is None:
        if not b.compare:
            return ["(not compared)", "", "", "", ""]
        return ["none (no row beyond tolerance)", "", "", "", ""]
    layer = b.first_layer or fd.get("module") or "<root>"
    node = f"{b.first_node} {fd.get('op') or ''}".strip()
    why = " / ".join(x for x in (fd.get("origin"), fd.get("cause")) if x)
    return [layer, node, why, _g(fd.get("local_err")), _g(fd.get("accumulated_err"))]


def backend_table(result: DriftResult) -> str:
    rows = []
    for b in result.backends:
        mapped = f"{b.mapped}/{b.eager_records} ({b.mapped_pct:.0f}%)" if b.eager_records else ""
        rows.append([b.backend, b.status, b.granularity, mapped, *_first(b), f"{sum(b.seconds.values()):.1f}"])
    return tabulate(rows, headers=BACKEND_COLUMNS, tablefmt="simple")


def layer_table(b: BackendDrift, limit: int = 40) -> str:
    """The layers the backend exposed, in execution order; the others are named in one line."""
    shown = [lr for lr in b.layers if lr.compared]
    hidden = [lr.layer for lr in b.layers if not lr.compared]
    rows = [[lr.layer, lr.compared, lr.worst, lr.born or "",
             f"{_g(lr.local_err)} ({_g(lr.local_floor)})" if lr.local_err is not None else "not measurable",
             _g(lr.isolated_err), _g(lr.accumulated_err)] for lr in shown[:limit]]
    text = tabulate(rows, headers=LAYER_COLUMNS, tablefmt="simple")
    if len(shown) > limit:
        text += f"\n... {len(shown) - limit} more layers in drift.json"
    if hidden:
        text += (f"\nnot exposed by {b.backend} ({len(hidden)} layers): " + ", ".join(hidden[:6])
                 + (" ..." if len(hidden) > 6 else ""))
    return text


def quant_table(b: BackendDrift, limit: int = 40) -> str:
    """A quantized run's layers: accumulated SQNR and relative error, what each layer lost itself,
    its error in int8 steps against its budget, and the verdict; then the layers that cost most."""
    q = b.quant or {}

    def num(v: object) -> str:
        return v if isinstance(v, str) else _g(v)  # type: ignore[arg-type]

    local = any("local_sqnr_db" in lr for lr in q.get("layers", []))
    rows = [[lr["layer"], lr["captured"], lr["verdict"], num(lr["sqnr_db"]), num(lr["rel_err"]), num(lr["cost_db"]),
             *([num(lr.get("local_sqnr_db"))] if local else []), num(lr["rms_steps"]), num(lr["allowed_steps"]),
             lr["node"]] for lr in q.get("layers", [])[:limit]]
    headers = QUANT_HEADERS[:6] + (["local SQNR dB"] if local else []) + QUANT_HEADERS[6:]
    text = tabulate(rows, headers=headers, tablefmt="simple")
    if len(q.get("layers", [])) > limit:
        text += f"\n... {len(q['layers']) - limit} more layers in drift.json"
    beyond = [lr["layer"] for lr in q.get("layers", []) if lr["verdict"].startswith("beyond")]
    text += (f"\n{q.get('scheme')}: output SQNR {num(q.get('output_sqnr_db'))} dB; costs most: "
             f"{', '.join(q.get('worst') or []) or 'none'}; beyond {q.get('scheme')} quantization: "
             f"{', '.join(beyond) if beyond else 'none'}")
    return text


KEEP_FLOAT_HEADERS = ["run", "kept float", "params", "output SQNR dB", "rel err", "beyond", "meets target", "seconds"]


def keep_float_text(s: dict, limit: int = 20) -> str:
    """``--suggest-float``: the layers to keep float, the measured output before and after, and
    every verification run (drift's own run first)."""
    def num(v: object) -> str:
        return v if isinstance(v, str) else _g(v)  # type: ignore[arg-type]

    total = s.get("params_total") or 0
    runs = [s["before"], *s["trials"]]
    rows = [[i if i else "drift's run", "+".join(t["layers"]) or "(none)",
             f"{100 * t['params_float'] / total:.1f}%" if total else "", num(t["output_sqnr_db"]), num(t["rel_err"]),
             "not judged" if t["beyond"] is None else ", ".join(t["beyond"]) or "none", "yes" if t["meets"] else "no",
             num(t["seconds"]) if i else ""] for i, t in enumerate(runs[:limit])]
    before, after = s["before"], s.get("after")
    head = f"keep float ({s['target']}): "
    if s["found"] and not s["layers"]:
        head += (f"nothing: the {s['scheme']} run already meets the target (output SQNR "
                 f"{num(before['output_sqnr_db'])} dB)")
    elif s["found"]:
        n = len(s["layers"])
        head += (f"{', '.join(s['layers'])} ({n} layer{'s' if n > 1 else ''}, {100 * s['param_share']:.1f}% of the "
                 f"parameters): output SQNR {num(before['output_sqnr_db'])} -> {num(after['output_sqnr_db'])} dB, "
                 f"rel err {num(before['rel_err'])} -> {num(after['rel_err'])}; verified by "
                 f"{len(s['trials'])} run{'s' if len(s['trials']) > 1 else ''} ({s['seconds']:.1f} s)\n"
                 f"   run it: -b '{s['rerun']}'")
    else:
        best = f"; best run: {'+'.join(after['layers'])} at {num(after['output_sqnr_db'])} dB" if after else ""
        head += f"not found in {len(s['trials'])} runs ({s['seconds']:.1f} s){best}"
    text = head + "\n" + tabulate(rows, headers=KEEP_FLOAT_HEADERS, tablefmt="simple")
    if len(runs) > limit:
        text += f"\n... {len(runs) - limit} more runs in drift.json"
    return text + "".join(f"\n   note: {n}" for n in s.get("notes", []))


def failure_text(b: BackendDrift, out: object, width: int = 100) -> str:
    """A failed backend's error, whole, wrapped to the terminal; where its traceback is."""
    from .logfile import LOG_NAME

    body = "\n".join(textwrap.fill(part, width, initial_indent="   ", subsequent_indent="     ",
                                   break_long_words=True, break_on_hyphens=False)
                     for part in (b.error or "(no message)").split(" | "))
    return body + f"\n   whole message: drift.json; traceback and third-party output: {out}/{LOG_NAME}"


def terminal_report(result: DriftResult, layers: bool = True) -> str:
    eq = "bitwise equal" if result.eager_equal else f"NOT bitwise equal (max abs diff {result.eager_max_diff:.3g})"
    lines = [f"reference: exported program, {result.program_nodes} op nodes -> {result.eager_records} eager records "
             f"({result.eager_dump}); its outputs vs the model's own eager forward: {eq}",
             *(f"note: {n}" for n in result.notes), "", backend_table(result)]
    for b in result.backends:
        if b.status != OK:
            lines += ["", f"== {b.backend}: {b.status}", failure_text(b, result.out)]
            continue
        if b.compare:
            c = b.compare
            lines += ["", f"== {b.backend}: pass {c['passed']} / warning {c['warned']} / fail {c['failed']} / "
                          f"nan-inf {c['nan_inf']}; deployed outputs vs the program's: max error "
                          f"{_g(b.output_err) or 'n/a'} of their peak; dump {b.dump}"]
        for note in b.notes:
            lines.append(f"   note: {note}")
        if b.quant is not None:
            lines.append(quant_table(b))
            if b.quant.get("keep_float"):
                lines.append(keep_float_text(b.quant["keep_float"]))
        elif layers and b.layers:
            lines.append(layer_table(b))
    lines.append("")
    lines.append(f"total {result.seconds.get('total', 0):.1f} s (export {result.seconds.get('export', 0):.1f} s, "
                 f"eager reference {result.seconds.get('eager_reference', 0):.1f} s; one eager forward "
                 f"{result.eager_s * 1000:.1f} ms); results in {result.out / 'drift.json'}")
    return "\n".join(lines)
