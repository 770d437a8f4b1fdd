"""Statistics verdicts over a compare's columns: tolerances, which output pairs they cover, and
the judge (numerics/stats_judge.py, the one rule) applied to all of them at once.

Why: judging pair by pair would be most of compare's cost at a million rows.
"""
from __future__ import annotations

import numpy as np

from ..dump.columns import ABSENT_MAX, ABSENT_MEAN, ABSENT_MIN, ABSENT_STD
from ..numerics import stats_judge
from ..numerics.rules import Rules, Tolerance
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
    saved data, same shape, not empty, not a random op's, and the same known dtype or two real
    floating ones (a bf16 target of a float32 bench: half of an autocast compare's pairs). The
    rest go through PairComparer.compare."""
    fast = np.zeros(len(plan), dtype=bool)
    rows = np.flatnonzero((plan.ao >= 0) & (plan.bo >= 0))
    ao, bo = plan.ao[rows], plan.bo[rows]
    dtypes = [torch_dtype(d) for d in vocab.dtype.tolist()]
    known = np.array([d is not None for d in dtypes], dtype=bool)
    real_float = np.array([d is not None and d.is_floating_point for d in dtypes], dtype=bool)
    numel = np.array([n > 0 for n in vocab.numel.tolist()], dtype=bool)
    ok = (ta.stat("has_stats", ao) != 0) & (tb.stat("has_stats", bo) != 0)
    ok &= (ta.stat("data", ao) < 0) | (tb.stat("data", bo) < 0)
    da, db = ta.out_dtype[ao], tb.out_dtype[bo]
    ok &= ((da == db) & known[da]) | (real_float[da] & real_float[db])
    ok &= (ta.out_shape[ao] == tb.out_shape[bo]) & numel[ta.out_shape[ao]]
    if random_of:
        ok &= ~np.isin(plan.a[rows], np.fromiter(random_of, dtype=np.int64, count=len(random_of)))
    fast[rows[ok]] = True
    return fast


# Status texts by verdict code, indexed so every row holds the one str object (np.where on texts
# and astype(object) would make a new str per row: 50 MB at a million rows).
_STATUS_OBJECTS = np.array([PairStatus.PASS.value, PairStatus.WARNING.value, PairStatus.FAIL.value,
                            PairStatus.NAN_INF.value], dtype=object)
_ABSENT_BITS = {"min": ABSENT_MIN, "max": ABSENT_MAX, "mean": ABSENT_MEAN, "std": ABSENT_STD}


def judge_stats(b: dict, t: dict, rtol: np.ndarray, atol: np.ndarray, rules: Rules,
                stand_in: np.ndarray | None = None, tiny: np.ndarray | float = 0.0) -> dict[str, np.ndarray]:
    """numerics.stats_judge over columns of output pairs (bench ``b``, target ``t``: statistics
    and their ``absent`` bit masks, as the dump stores them; ``stand_in`` as there)."""
    def present(side: dict) -> dict:
        return {**side, **{"has_" + k: (side["absent"] & bit) == 0 for k, bit in _ABSENT_BITS.items()}}
    judged = stats_judge.judge(present(b), present(t), rtol, atol, rules, stand_in, tiny)
    return {"status": _STATUS_OBJECTS[judged["verdict"]], "stats_err": judged["stats_err"], "code": judged["verdict"]}
