"""explain's findings in one sentence: the top place and call, what is left, compare's word on it."""
from __future__ import annotations


def verdict(x) -> str:
    """An ``analysis.Explanation`` in words (typed loosely: analysis imports this module)."""
    if x.error == 0:
        return f"the target ({x.target}) gives the bench's ({x.bench}) output exactly: nothing to explain"
    if x.top is None:
        return f"final error {x.error:.3g}: no single module's own code removes any of it when grafted"
    top = x.row(x.top)
    words = [f"final error {x.error:.3g}; {x.top} ({top.what}) makes {100 * top.self_share:.0f}% of it"]
    if x.top_op:
        op = x.row(x.top_op)
        words.append(f", in the call {x.top_op} (grafting it leaves {op.error_grafted:.3g}"
                     + (f"; compare: {op.origin}, {op.cause}" if op.origin else "") + ")")
    if x.first_nonfinite:
        words.append(f"; the first Inf/NaN the bench does not have comes out of {x.first_nonfinite} "
                     f"(a value that does not fit the target's dtype: a graft cast to it cannot remove it, "
                     f"an fp32 island can)")
    rest = x.rest
    born = [b for b in x.compare.get("born", []) if b != x.top_op]
    # noise only when compare's rules find no other call wrong on its own inputs
    noise = f"{x.target.partition(':')[2] or x.target} noise" if not born else "error"
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
    if x.compare:
        def named(b: str) -> str:
            r = x.row(b)
            return b + (f", {100 * r.share:.0f}% of the final error when grafted" if r and r.share is not None else "")
        words.append(f". compare: {len(born)} other call(s) born wrong"
                     + (f" ({'; '.join(named(b) for b in born[:3])})" if born
                        else f", {x.compare['warning']} within precision (warnings)"))
    return "".join(words)
