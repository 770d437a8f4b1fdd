"""explain's findings in one sentence: first whether there is anything wrong at all (compare's
judgement of both runs, call by call), then the top place and call, then what is left."""
from __future__ import annotations

import math


def verdict(x) -> str:
    """An ``analysis.Explanation`` in words (typed loosely: analysis imports this module)."""
    if x.error == 0:
        return f"the target ({x.target}) gives the bench's ({x.bench}) output exactly: nothing to explain"
    words = [_born(x) if x.first_nonfinite and not math.isfinite(x.error) else _lead(x)]
    if x.first_nonfinite and math.isfinite(x.error):  # an Inf/NaN the output no longer shows
        words.append(f"; an Inf/NaN the bench does not have first comes out of {x.first_nonfinite}")
    rest = x.rest
    born = [b for b in x.compare.get("born", []) if b != x.top_op]
    # noise only when compare's rules find no other call wrong on its own inputs
    noise = f"{_precision(x)} noise" if not born else "error"
    if rest.get("places"):
        words.append(f". With it grafted the error is {rest['error']:.3g}")
        if rest["spread"]:
            half = (f"{rest['places_for_half']} places make half" if rest["places_for_half"] else
                    "together they do not make half: the rest is made outside the modules' own code, "
                    "such as the rounding of the output itself")
            words.append(f": the rest is {noise} spread over the model "
                         f"(no place explains more than {100 * max(rest['best_share'], 0):.0f}% of it; {half})")
        else:
            words.append(f": {rest['best_place']} makes {100 * rest['best_share']:.0f}% of the rest")
    if x.compare and not _within_precision(x):
        def named(b: str) -> str:
            r = x.row(b)
            return b + (f", {100 * r.share:.0f}% of the final error when grafted" if r and r.share is not None else "")
        words.append(f". compare: {len(born)} other call(s) born wrong"
                     + (f" ({'; '.join(named(b) for b in born[:3])})" if born
                        else f", {x.compare['warning']} within precision (warnings)"))
    return "".join(words)


def _born(x) -> str:
    """An Inf/NaN output: where the first one is born leads (a graft cannot rank an overflow:
    the bench's value cast to the target's dtype is Inf again), then the first graft removing it."""
    producers = x.birth.get("producers") or []
    lead = (f"final error {x.error:.3g}: the first Inf/NaN the bench does not have comes out of {x.first_nonfinite}"
            + (f" (its input made by {producers[0]})" if producers else "")
            + f", a value that does not fit {_precision(x)}: a graft cast to it cannot remove it, an fp32 island "
              "can (xray fix)")
    top = x.row(x.top) if x.top else None
    if top is not None:
        lead += f"; grafting {x.top} ({top.what}) downstream of it removes {100 * top.self_share:.0f}% of the error"
    return lead


def _lead(x) -> str:
    """The first clause: within the run's precision (compare's verdict on every call), or the
    place that makes most of the error, and the call inside it."""
    top = x.row(x.top) if x.top else None
    if _within_precision(x):
        lead = (f"final error {x.error:.3g} is within {_precision(x)}'s precision, no bug: compare finds no call "
                f"wrong on its own inputs ({x.compare.get('verdict') or 'no row fails'})")
        # with --search tree a run of layers left whole can make more than any module measured
        groups = [r for r in x.rows if r.kind == "group"]
        most = max([r for r in [top] if r is not None] + groups, key=lambda r: r.self_share, default=None)
        if most is not None:
            whole = ", not descended" if most.kind == "group" else ""
            lead += (f"; the largest part accumulates in {most.name} ({most.what}{whole}), "
                     f"{100 * most.self_share:.0f}% of it")
        return lead
    if top is None:
        return f"final error {x.error:.3g}: no single module's own code removes any of it when grafted"
    lead = f"final error {x.error:.3g}; {x.top} ({top.what}) makes {100 * top.self_share:.0f}% of it"
    if x.top_op:
        op = x.row(x.top_op)
        lead += (f", in the call {x.top_op} (grafting it leaves {op.error_grafted:.3g}"
                 + (f"; compare: {op.origin}" if op.origin else "")
                 + (f", {op.cause}" if op.origin and op.cause and op.cause != op.origin else "") + ")")
    if not x.compare:
        lead += " (op level off: not judged against the target's precision)"
    return lead


def _within_precision(x) -> bool:
    """compare's own verdict on the two dumps: no row fails (its ``precision``), and the output is finite."""
    return x.compare.get("verdict_kind") == "precision" and math.isfinite(x.error)


def _precision(x) -> str:
    return x.target.partition(":")[2] or x.target
