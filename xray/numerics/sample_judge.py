"""The sample verdict: a pair's sampled elements (xray.dump.samples) judged as saved data is.

Statistics are blind to a bug that leaves min, max, mean and std alone (a permuted or negated
half, a dropped mask); the sample sees it element by element. The rule is the saved data's, not
a second one: each element within ``Tolerance.floor(rms) + rtol * |b|`` passes, else
``Rules.spread_like_rounding`` (relative RMSE, worst element in floors, cosine) says warning or
fail; NaN/Inf at positions where the other side is finite is NAN_INF. Over arrays of pairs (a
million rows: numpy only) or one pair (``judge_one``), as stats_judge does.

``sample_err`` is the worst sampled difference over the bench's largest magnitude (the unit of
``stats_err``), so the statistics-only rules can weigh a row the sample decided.
"""
from __future__ import annotations

import numpy as np

from .rules import Rules, floor_of
from .stats_judge import FAIL, NAN_INF, PASS, WARNING

NOT_JUDGED = -1  # no sample on one side, or samples of different lengths


def judge(b: np.ndarray, t: np.ndarray, nb: np.ndarray, nt: np.ndarray, rtol: np.ndarray, atol: np.ndarray,
          scale: np.ndarray, peak: np.ndarray, rules: Rules, stand_in: np.ndarray | None = None,
          tiny: np.ndarray | float = 0.0) -> dict[str, np.ndarray]:
    """Verdict codes (``PASS`` ... ``NAN_INF``, ``NOT_JUDGED``) and ``sample_err`` per pair.

    ``b``, ``t``: float64 (pairs x k) samples, the first ``nb``/``nt`` of each row valid;
    ``scale``: the RMS the element floor scales with (the larger side's, as for saved data);
    ``peak``: the bench's largest magnitude (stats_err's unit; NaN: the sample's own);
    ``stand_in``: ``metrics.infinity_stand_in`` per pair (NaN: none), as saved data uses it."""
    m, k = b.shape if b.ndim == 2 else (len(rtol), 0)
    nb, nt = np.asarray(nb, dtype=np.int64), np.asarray(nt, dtype=np.int64)
    judged = (nb == nt) & (nb > 0)
    valid = np.arange(k)[None, :] < np.where(judged, nb, 0)[:, None]
    with np.errstate(all="ignore"):
        fb, ft = np.isfinite(b), np.isfinite(t)
        both = valid & fb & ft
        same = valid & ~fb & ~ft & ((np.isnan(b) & np.isnan(t)) | (b == t))  # equal NaN/±Inf agree (masks)
        if stand_in is not None:  # -3.40e38 on one side, -Inf on the other: one mask value
            si = np.asarray(stand_in, dtype=np.float64)[:, None]
            held = (fb & np.isinf(t) & (np.abs(b) >= si)) | (ft & np.isinf(b) & (np.abs(t) >= si))
            same |= valid & held & (np.sign(b) == np.sign(t))
            scale, peak = _without_stand_ins(b, t, valid & fb & ft, si, scale, peak)
        mismatch = (valid & ~both & ~same).sum(axis=1)
        bz, tz = np.where(both, b, 0.0), np.where(both, t, 0.0)
        # scaled by the row's largest magnitude: squares of 1e200 stay finite
        s = np.maximum(np.abs(bz).max(axis=1, initial=0.0), np.abs(tz).max(axis=1, initial=0.0))
        s = np.where(s > 0, s, 1.0)[:, None]
        bs, ts = bz / s, tz / s
        d = np.abs(tz - bz)
        allowed = np.asarray(floor_of(rtol, atol, scale, tiny))[:, None] + rtol[:, None] * np.abs(bz)
        beyond = both & (d > allowed)
        not_close = beyond.sum(axis=1)
        ratio = np.where(allowed > 0, d / allowed, np.where(d > 0, np.inf, 0.0))
        max_ratio = np.where(both, ratio, 0.0).max(axis=1, initial=0.0)
        ds = np.abs(ts - bs)
        sse, bb, tt, bt = ((x * y).sum(axis=1) for x, y in ((ds, ds), (bs, bs), (ts, ts), (bs, ts)))
        rel_rmse = np.where(bb > 0, np.sqrt(sse / bb), np.where(sse == 0, 0.0, np.inf))
        denom = np.sqrt(bb) * np.sqrt(tt)
        cosine = np.where(denom > 0, np.clip(bt / denom, -1.0, 1.0), np.where((bb == 0) & (tt == 0), 1.0, 0.0))
        top = np.where(np.isfinite(peak) & (peak > 0), peak, s[:, 0])
        worst = d.max(axis=1, initial=0.0)
        sample_err = np.where(mismatch > 0, np.inf, np.where(top > 0, worst / top, worst))
    exact = (rtol == 0) & (atol == 0)
    spread = rules.spread_like_rounding(rel_rmse, max_ratio, cosine, rtol)
    verdict = np.where(not_close == 0, PASS, np.where(exact | ~spread, FAIL, WARNING))
    verdict = np.where(mismatch > 0, NAN_INF, verdict)
    verdict = np.where(judged, verdict, NOT_JUDGED)
    return {"verdict": verdict, "sample_err": np.where(judged, sample_err, np.nan), "not_close": not_close,
            "judged": judged}


def _without_stand_ins(b: np.ndarray, t: np.ndarray, both: np.ndarray, si: np.ndarray, scale: np.ndarray,
                       peak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``scale`` and ``peak`` where the bench's statistics reach a value that stands for infinity
    (a mask's ``finfo.min`` fill): the RMS and the bench's largest magnitude of the sampled elements
    below it, which are the tensor's values; elsewhere as given. From statistics, a masked score's
    RMS is the fill's, 1e38, and every element of its finite part passes whatever it holds (as
    ``PairComparer.scale`` leaves stand-ins out of saved data's RMS)."""
    peak = np.asarray(peak, dtype=np.float64)
    filled = np.isfinite(si[:, 0]) & (peak >= si[:, 0])
    if not filled.any():
        return scale, peak
    keep = both & (np.abs(b) < si) & (np.abs(t) < si)
    count = keep.sum(axis=1)
    squares = np.where(keep, np.maximum(b * b, t * t), 0.0).sum(axis=1)
    rms = np.sqrt(squares / np.maximum(count, 1))
    top = np.where(keep, np.abs(b), 0.0).max(axis=1, initial=0.0)
    use = filled & (count > 0)
    return np.where(use, rms, scale), np.where(use, top, peak)


def judge_one(bench: tuple[float, ...] | None, target: tuple[float, ...] | None, rtol: float, atol: float,
              scale: float, peak: float, rules: Rules) -> tuple[int, float | None, int]:
    """(verdict code, sample_err, elements beyond their floor) of one pair's samples: ``judge``,
    one row. ``NOT_JUDGED`` and None without a sample on both sides of one length."""
    if not bench or not target or len(bench) != len(target):
        return NOT_JUDGED, None, 0
    got = judge(np.array([bench], dtype=np.float64), np.array([target], dtype=np.float64), np.array([len(bench)]),
                np.array([len(target)]), np.array([rtol]), np.array([atol]), np.array([scale]),
                np.array([peak]), rules)
    return int(got["verdict"][0]), float(got["sample_err"][0]), int(got["not_close"][0])


__all__ = ["judge", "judge_one", "NOT_JUDGED", "PASS", "WARNING", "FAIL", "NAN_INF"]
