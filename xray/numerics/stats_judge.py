"""The statistics verdict: one rule, over arrays of output pairs, for a million rows or for one.

A pair recorded with statistics only (min, max, mean, std, NaN and Inf counts) is judged by its
worst statistic, relative to the bench's range, against the tolerance's floor at the bench's RMS:
within the floor passes; within ``Rules.stats_warn_factor`` floors warns (spread the dtype can
make); beyond fails. A NaN/Inf count that differs is NAN_INF, whatever the values.

Compare's columnar judge (compare/stat_verdicts.py) calls it over all rows at once and
``PairComparer`` over a single pair (``judge_one``): there is no second copy to keep equal.
Python's ``max``/``min`` semantics around NaN are written out (``_pymax``), so a row's error is
the same whichever caller asked.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .rules import Rules, Tolerance, floor_of

KEYS = ("min", "max", "mean", "std")
PASS, WARNING, FAIL, NAN_INF = 0, 1, 2, 3  # verdict codes, in PairStatus's order
VERDICT_TEXT = ("pass", "warning", "fail", "nan/inf")  # PairStatus values


def _pymax(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Python's ``max(x, y)``: y only when y > x (NaN never wins against the first)."""
    return np.where(y > x, y, x)


def judge(b: dict[str, np.ndarray], t: dict[str, np.ndarray], rtol: np.ndarray, atol: np.ndarray,
          rules: Rules, stand_in: np.ndarray | None = None, tiny: np.ndarray | float = 0.0) -> dict[str, np.ndarray]:
    """Verdict codes (``PASS`` ... ``NAN_INF``), ``stats_err`` and ``within`` per pair.

    ``b`` and ``t`` hold arrays per statistic (``min`` ... ``std``, ``nan``, ``inf``) and a
    boolean ``has_<stat>`` per statistic (a statistic the recorder could not take, as for
    an empty or non-float tensor); ``rtol``/``atol`` are each pair's tolerance. ``stand_in``:
    each pair's ``metrics.infinity_stand_in`` (NaN: none). Where one side's range reaches it and
    the other side has more Infs (a float32 ``finfo.min`` mask that bf16 holds as -Inf), the
    statistics mix mask values with data and cannot be compared: the pair passes on them, its
    ``stats_err`` NaN, and its sample (which holds each element) judges it."""
    lo, hi = np.abs(b["min"]), np.abs(b["max"])
    has_lo, has_hi = b["has_min"], b["has_max"]
    scale = np.where(has_lo, np.where(has_hi, _pymax(lo, hi), lo), np.where(has_hi, hi, 0.0))
    worst = np.zeros(len(rtol))  # half the worst difference: t/2 - b/2 never overflows where t - b would
    with np.errstate(all="ignore"):
        for key in KEYS:
            pb, pt = b["has_" + key], t["has_" + key]
            worst = np.where(pb != pt, np.inf, np.where(pb, _pymax(worst, np.abs(t[key] * 0.5 - b[key] * 0.5)), worst))
        std = np.where(b["has_std"], b["std"], 0.0)
        std = np.where(std != 0, std, 0.0)  # a missing or -0.0 std counts as 0.0
        # the bench's RMS (hypot scales inside: finite for 1e200, where mean ** 2 overflows), else its range
        base = np.where(b["has_mean"], np.hypot(b["mean"], std), scale)
        allowed = floor_of(rtol, atol, base, tiny) + rtol * scale
        within = np.where(allowed > 0, worst / (allowed * 0.5), np.where(worst == 0, 0.0, np.inf))
        stats_err = np.where(scale > 0, (worst / scale) * 2, worst * 2)
    exact = (rtol == 0) & (atol == 0)
    verdict = np.where(within <= 1.0, PASS, np.where(exact, FAIL, np.where(within <= rules.stats_warn_factor, WARNING, FAIL)))
    verdict[(b["nan"] != t["nan"]) | (b["inf"] != t["inf"])] = NAN_INF
    if stand_in is not None:
        masked = _holds_stand_ins(b, t, stand_in)
        verdict[masked] = PASS
        stats_err = np.where(masked, np.nan, stats_err)
    return {"verdict": verdict, "stats_err": stats_err, "within": within}


def _holds_stand_ins(b: dict[str, np.ndarray], t: dict[str, np.ndarray], stand_in: np.ndarray) -> np.ndarray:
    """Pairs whose extra Infs on one side are the other side's infinity stand-ins (``judge``)."""
    def reaches(side: dict) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (side["has_min"] & (side["min"] <= -stand_in)) | (side["has_max"] & (side["max"] >= stand_in))
    return (b["nan"] == t["nan"]) & (((t["inf"] > b["inf"]) & reaches(b)) | ((b["inf"] > t["inf"]) & reaches(t)))


def columns_of(stats: Sequence[Any]) -> dict[str, np.ndarray]:
    """``judge``'s arrays for one side of a list of ``Stats`` (a missing statistic: ``has_<key>`` False)."""
    out: dict[str, np.ndarray] = {"nan": np.array([s.nan for s in stats]), "inf": np.array([s.inf for s in stats])}
    for key in KEYS:
        values = [getattr(s, key) for s in stats]
        out[key] = np.array([0.0 if v is None else float(v) for v in values], dtype=np.float64)
        out["has_" + key] = np.array([v is not None for v in values], dtype=bool)
    return out


def judge_one(bench: Any, target: Any, tol: Tolerance, rules: Rules) -> tuple[str, float]:
    """(status text, stats_err) of one pair of ``Stats``: the same rule as ``judge``, one row."""
    got = judge(columns_of([bench]), columns_of([target]), np.array([tol.rtol]), np.array([tol.atol]), rules,
                tiny=np.array([tol.tiny]))
    return VERDICT_TEXT[int(got["verdict"][0])], float(got["stats_err"][0])


def stats_error(bench: Any, target: Any) -> float | None:
    """``stats_err`` of two tensors' statistics (``TensorMeta``s), whatever judged their row, or
    None where either has none: a saved-data row belongs to its kind's population on the run
    (compare/statistics_only.kind_outliers) as much as a statistics-only row."""
    b, t = getattr(bench, "stats", None), getattr(target, "stats", None)
    if b is None or t is None:
        return None
    return judge_one(b, t, Tolerance(0.0, 0.0), Rules())[1]
