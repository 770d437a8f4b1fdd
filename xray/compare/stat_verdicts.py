"""Statistics verdicts in numpy: tolerances, which output pairs they cover, and the judge.

Why: ``stats_compare`` + ``Rules.judge_stats`` once per pair would be most of compare's cost.
Here they run over arrays, with Python's ``max``/``min`` (NaN) semantics written out and
``x ** 2`` taken in Python, so statuses and errors equal ``PairComparer.compare``'s to the bit.
"""
from __future__ import annotations

import math

import numpy as np

from ..dump.columns import ABSENT_MAX, ABSENT_MEAN, ABSENT_MIN, ABSENT_STD
from ..numerics.rules import ATOL_PER_RTOL, Rules, Tolerance
from .entry_table import EntryTable, Vocab
from .pair_judge import dtype_floor, dtype_tolerance, torch_dtype
from .result import PairStatus
from .row_plan import RowPlan


def tolerances(ta: EntryTable, tb: EntryTable, plan: RowPlan, rules: Rules,
               vocab: Vocab) -> tuple[Tolerance | None, dict]:
    """The mixed-precision floor (pair_judge.dtype_floor) over the matched outputs, and the tolerance of each dtype pair
    (``PairComparer.tolerance``), by (bench dtype code, target dtype code)."""
    both = (plan.ao >= 0) & (plan.bo >= 0)
    pairs = set(zip(ta.out_dtype[plan.ao[both]].tolist(), tb.out_dtype[plan.bo[both]].tolist()))
    text = vocab.dtype  # dtype names by code, both sides (their codes are shared)
    floor = dtype_floor(((text[db], text[dt]) for db, dt in pairs), rules)
    return floor, {(db, dt): dtype_tolerance(rules, floor, text[db], text[dt]) for db, dt in pairs}


def covered_by_stats(ta: EntryTable, tb: EntryTable, plan: RowPlan, random_of: dict[int, str],
                     vocab: Vocab) -> np.ndarray:
    """Which plan rows the statistics judge covers: both outputs with statistics, not both with
    saved data, same dtype (a known one) and shape, not empty, not a random op's. The rest go
    through PairComparer.compare."""
    fast = np.zeros(len(plan), dtype=bool)
    rows = np.flatnonzero((plan.ao >= 0) & (plan.bo >= 0))
    ao, bo = plan.ao[rows], plan.bo[rows]
    known = np.array([torch_dtype(d) is not None for d in vocab.dtype.tolist()], dtype=bool)
    numel = np.array([n > 0 for n in vocab.numel.tolist()], dtype=bool)
    ok = (ta.stat("has_stats", ao) != 0) & (tb.stat("has_stats", bo) != 0)
    ok &= (ta.stat("data", ao) < 0) | (tb.stat("data", bo) < 0)
    ok &= (ta.out_dtype[ao] == tb.out_dtype[bo]) & (ta.out_shape[ao] == tb.out_shape[bo])
    ok &= numel[ta.out_shape[ao]] & known[ta.out_dtype[ao]]
    if random_of:
        ok &= ~np.isin(plan.a[rows], np.fromiter(random_of, dtype=np.int64, count=len(random_of)))
    fast[rows[ok]] = True
    return fast


# Status texts by verdict code, indexed so every row holds the one str object (np.where on texts
# and astype(object) would make a new str per row: 50 MB at a million rows).
_STATUS_OBJECTS = np.array([PairStatus.PASS.value, PairStatus.WARNING.value, PairStatus.FAIL.value,
                            PairStatus.NAN_INF.value], dtype=object)


def _pymax(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Python's ``max(x, y)``: y only when y > x (NaN never wins against the first)."""
    return np.where(y > x, y, x)


def _pymin(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(y < x, y, x)


def _hypot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``math.hypot`` element by element, for results equal to stats_rms's to the bit."""
    return np.array([math.hypot(a, b) for a, b in zip(x.tolist(), y.tolist())], dtype=np.float64)


def judge_stats(b: dict, t: dict, rtol: np.ndarray, atol: np.ndarray, rules: Rules) -> dict[str, np.ndarray]:
    """``stats_compare`` + the status ``PairComparer._compare_stats`` gives, over arrays of
    output pairs (bench ``b``, target ``t``: columns of statistics, ``absent`` masks)."""
    present_b = [(b["absent"] & bit) == 0 for bit in (ABSENT_MIN, ABSENT_MAX, ABSENT_MEAN, ABSENT_STD)]
    present_t = [(t["absent"] & bit) == 0 for bit in (ABSENT_MIN, ABSENT_MAX, ABSENT_MEAN, ABSENT_STD)]
    keys = ("min", "max", "mean", "std")
    lo, hi = np.abs(b["min"]), np.abs(b["max"])
    scale = np.where(present_b[0], np.where(present_b[1], _pymax(lo, hi), lo), np.where(present_b[1], hi, 0.0))
    worst = np.zeros(len(rtol))
    with np.errstate(all="ignore"):
        for key, pb, pt in zip(keys, present_b, present_t):
            # halves, as stats_compare: t/2 - b/2 never overflows where t - b would
            worst = np.where(pb != pt, np.inf, np.where(pb, _pymax(worst, np.abs(t[key] * 0.5 - b[key] * 0.5)), worst))
        std = np.where(present_b[3], b["std"], 0.0)
        std = np.where(std != 0, std, 0.0)  # ``std or 0.0``: -0.0 counts as 0.0 too
        rms = _hypot(b["mean"], std)
        base = np.where(present_b[2], rms, scale)  # tol.floor(scale if rms is None else rms)
        exact = (rtol == 0) & (atol == 0)
        floor = np.where(exact, 0.0, _pymax(atol * _pymin(base, np.ones_like(base)), ATOL_PER_RTOL * rtol * base))
        allowed = floor + rtol * scale
        within = np.where(allowed > 0, worst / (allowed * 0.5), np.where(worst == 0, 0.0, np.inf))
        stats_err = np.where(scale > 0, (worst / scale) * 2, worst * 2)
    verdict = np.where(within <= 1.0, 0, np.where(exact, 2, np.where(within <= rules.stats_warn_factor, 1, 2)))
    verdict[(b["nan"] != t["nan"]) | (b["inf"] != t["inf"])] = 3
    return {"status": _STATUS_OBJECTS[verdict], "stats_err": stats_err}
