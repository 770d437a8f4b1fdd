"""Score tables and the per-scenario CSV of an accuracy benchmark run.

Fault scenarios: exact hit = compare's first divergence names the corrupted call (or, for a
changed parameter, an op reading it before any other op; for a module dump, the innermost
module record the fault ran in); right module = it names a record in that module. A crash
or no divergence at all is a miss. Noise-only scenarios: every fail or nan/inf row is false.
Harness errors (the scenario itself broke) are listed and left out of every percentage.
"""
from __future__ import annotations

import csv
from pathlib import Path

from .runner import Outcome, false_divergence

CSV_COLUMNS = ("name", "cls", "arch", "dump", "data", "backward", "injected", "truth_bench_seqs", "truth_target_seqs",
               "truth_module", "fd_bench_seq", "fd_target_seq", "fd_op", "fd_origin", "fd_module", "exact",
               "right_module", "rows", "fail_rows", "false_divergence", "crash", "harness_error", "seconds")


def fail_rows(o: Outcome) -> int:
    return (o.summary.get("failed") or 0) + (o.summary.get("nan_inf") or 0) if o.summary else 0


def _pct(n: int, d: int) -> str:
    return f"{100.0 * n / d:.1f}" if d else "-"


def _row(o: Outcome) -> dict:
    s, fd = o.scenario, (o.summary or {}).get("first_divergence") or {}
    t = o.truth
    return {"name": s.name, "cls": s.cls, "arch": s.arch, "dump": s.dump, "data": s.data, "backward": s.backward,
            "injected": s.describe(),
            "truth_bench_seqs": " ".join(map(str, sorted(t.bench))) if t else "",
            "truth_target_seqs": " ".join(map(str, sorted(t.target))) if t else "",
            "truth_module": (t.bench_module or t.target_module or "") if t else "",
            "fd_bench_seq": fd.get("bench_seq"), "fd_target_seq": fd.get("target_seq"),
            "fd_op": fd.get("op") or fd.get("target_op"), "fd_origin": fd.get("origin"), "fd_module": o.fd_module,
            "exact": o.exact, "right_module": o.right_module, "rows": (o.summary or {}).get("rows"),
            "fail_rows": fail_rows(o) if o.summary else None,
            "false_divergence": false_divergence(fd or None) if s.noise_only and o.summary else None,
            "crash": o.crash or "", "harness_error": o.harness_error or "", "seconds": round(o.seconds, 3)}


def write_csv(outcomes: list[Outcome], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for o in outcomes:
            w.writerow(_row(o))


def totals(outcomes: list[Outcome]) -> dict:
    """The headline figures (bench.py's table reads these)."""
    scored = [o for o in outcomes if o.harness_error is None]
    faults = [o for o in scored if not o.scenario.noise_only]
    noise = [o for o in scored if o.scenario.noise_only]
    noise_ok = [o for o in noise if o.summary]
    rows = sum(o.summary["rows"] for o in noise_ok)
    return {"scenarios": len(outcomes), "fault_scenarios": len(faults),
            "architectures": len({o.scenario.arch for o in outcomes}),
            "exact_pct": 100.0 * sum(bool(o.exact) for o in faults) / max(len(faults), 1),
            "right_module_pct": 100.0 * sum(bool(o.right_module) for o in faults) / max(len(faults), 1),
            "noise_scenarios": len(noise), "noise_rows": rows,
            "noise_fail_rows_pct": 100.0 * sum(fail_rows(o) for o in noise_ok) / max(rows, 1),
            "noise_scenarios_failing": sum(fail_rows(o) > 0 for o in noise_ok),
            "noise_false_divergences": sum(false_divergence(o.summary.get("first_divergence")) for o in noise_ok),
            "crashes": sum(o.crash is not None for o in outcomes),
            "harness_errors": sum(o.harness_error is not None for o in outcomes)}


def tables(outcomes: list[Outcome]) -> tuple[list[list], list[list]]:
    """(fault rows per class, noise rows per kind), each with an overall row last."""
    def group(pred):
        out: dict[str, list[Outcome]] = {}
        for o in outcomes:
            if pred(o):
                out.setdefault(o.scenario.cls, []).append(o)
        return out

    fault_rows = []
    for cls, os_ in list(group(lambda o: not o.scenario.noise_only).items()) + [
            ("overall", [o for o in outcomes if not o.scenario.noise_only])]:
        n = [o for o in os_ if o.harness_error is None]
        fault_rows.append([cls, len(n), _pct(sum(bool(o.exact) for o in n), len(n)),
                           _pct(sum(bool(o.right_module) for o in n), len(n)),
                           sum(bool(o.summary) and not o.summary.get("first_divergence") for o in n),
                           sum(o.crash is not None for o in n), len(os_) - len(n)])
    noise_rows = []
    for cls, os_ in list(group(lambda o: o.scenario.noise_only).items()) + [
            ("overall", [o for o in outcomes if o.scenario.noise_only])]:
        ok = [o for o in os_ if o.summary]
        rows = sum(o.summary["rows"] for o in ok)
        noise_rows.append([cls, len(os_), rows, _pct(sum(fail_rows(o) for o in ok), rows),
                           sum(fail_rows(o) > 0 for o in ok),
                           sum(false_divergence(o.summary.get("first_divergence")) for o in ok),
                           sum(o.crash is not None for o in os_)])
    return fault_rows, noise_rows


FAULT_HEADERS = ["fault class", "scenarios", "exact hit %", "right module %", "no divergence", "crashes",
                 "harness errors"]
NOISE_HEADERS = ["noise only", "scenarios", "rows", "false-fail rows %", "scenarios with FAIL", "false first divergence",
                 "crashes"]
