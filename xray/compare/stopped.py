"""Whether a dump's recording ran to its end: what it holds is then all the run did."""
from __future__ import annotations


def stopped_at(dump) -> str | None:
    """Where and why a dump's recording stopped early (dump.json ``summary.stopped``, or only
    ``summary.error`` from an older recorder), as one line; None when it ran to the end."""
    if getattr(dump, "complete", True) is False:  # read from its journal: the run never reached end_dump
        return ("recording did not finish (no end_dump: the program died or was killed); only what its journal "
                "held was compared")
    summary = getattr(dump, "summary", None) or {}
    if not isinstance(summary, dict):
        return None
    stop, error = summary.get("stopped"), summary.get("error")
    if not isinstance(stop, dict):
        return f"recording stopped ({str(error)[:300]})" if error else None
    what = " in ".join(str(x) for x in (stop.get("op"), stop.get("module")) if x)
    reason = str(stop.get("reason") or error or "")[:300].replace("\n", " ")
    return f"recording stopped at seq {stop.get('seq')}" + (f" ({what})" if what else "") + (f": {reason}" if reason else "")
