"""Compare's one-line verdict: a bug born at a named call, precision only, or cannot tell, with why.

Read from the summary alone (first divergence, counts, de-dup notes, warnings), so the terminal,
the summary JSON, the HTML report and the demo say the same sentence. A verdict claims only what
the rows support:

- ``bug``: the first divergence is born at a call that was judged there (its inputs agree, or
  its local error on its own inputs is beyond what the run's precision allows, or an argument
  differs), so the call named is where to look; or, with no failing row, the target's ranks
  disagree on a value they must hold alike (cross_rank.py);
- ``precision``: no row fails and no divergence was found among what was compared (a run whose
  backward ran unrecorded, or a de-duplicated one, says what that leaves out);
- ``cannot tell``: a row fails, but where it was born could not be judged (inherited from a
  call the dumps cannot place, or a target-only op that could not be recomputed), or nothing
  could be compared, or no row fails but a recording stopped early (the calls after the stop
  were never compared). Each says what recording would settle it.
"""
from __future__ import annotations

from dataclasses import dataclass

BUG, PRECISION, CANNOT_TELL = "bug", "precision", "cannot tell"

# causes under which a born row was not judged on its own inputs: the row fails, but no
# call has been shown wrong (causality writes these in the cause's detail)
_UNJUDGED = ("is not judged", "cannot be recomputed", "not measurable", "could not be judged")


@dataclass(frozen=True)
class Verdict:
    kind: str  # BUG, PRECISION or CANNOT_TELL
    sentence: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.sentence}"


def verdict_of(summary) -> Verdict:
    """The verdict a ``Summary`` supports (docs/compare.md, "The verdict")."""
    fd = summary.first_divergence
    failing = summary.failed + summary.nan_inf
    hidden = "; a dump is de-duplicated, so calls it folded away were not compared" if summary.dedup else ""
    unseen = getattr(summary, "unrecorded_backward", None)
    if unseen:  # a backward bug leaves no row: what was compared is the forward
        hidden += (f"; backward ran but was not recorded ({', '.join(unseen)}), so this covers the forward "
                   "only: record with X_DEBUG=0x10A (BACKWARD) to compare it")
    stopped = getattr(summary, "stopped", None)
    if stopped:  # a truncated recording: its missing calls cannot have diverged in the rows
        hidden = f"; {'; '.join(stopped)}" + hidden
    cross = getattr(summary, "cross_rank", None)
    if not fd and cross:  # a value every rank must hold alike does not agree: a bug, found without the bench
        return Verdict(BUG, f"ranks disagree where they must agree: {cross[0].removeprefix('target: ')}{hidden}")
    if not fd:
        if stopped:
            return Verdict(CANNOT_TELL, f"{'; '.join(stopped)}, so the calls after it were not compared"
                                        + (f" ({failing} rows fail before it, none placed)" if failing else
                                           " (no row fails before it)"))
        if failing:
            return Verdict(CANNOT_TELL, f"{failing} rows fail but none could be placed as the first divergence"
                                        f"{hidden}")
        drawn = getattr(summary, "random_draws", 0)
        if drawn:
            return Verdict(CANNOT_TELL, f"{drawn} rows are made from random draws that differ between the runs, so "
                                        "they were not compared: seed both runs alike (torch.manual_seed) to "
                                        f"compare them{hidden}")
        if summary.rows - summary.unmatched - summary.skipped <= 0:
            return Verdict(CANNOT_TELL, "no record pair could be compared (unmatched or skipped)")
        warned = f"; {summary.warned} rows differ within the run's precision (warnings)" if summary.warned else ""
        return Verdict(PRECISION, f"no row fails{warned}{hidden}")
    where = _where(fd)
    detail = f"{fd.get('cause') or ''}: {fd.get('culprit') or ''}".strip(": ")
    if fd.get("origin") != "born":
        return Verdict(CANNOT_TELL, f"the first failing row, {where}, inherits an error whose origin the dumps "
                                    f"cannot place ({fd.get('culprit') or fd.get('origin')}); record every call "
                                    "(X_DEDUP=0) and its tensors (X_DUMP_NUM) to find it")
    if any(marker in detail for marker in _UNJUDGED):
        return Verdict(CANNOT_TELL, f"the error appears at {where}, but the op that made it was not judged: "
                                    f"{detail}")
    return Verdict(BUG, f"born at {where}" + (f" ({detail})" if detail else ""))


def settle_verdict(summary) -> None:
    """Write the verdict into ``summary`` (its JSON, the terminal and the HTML read it there)."""
    v = verdict_of(summary)
    summary.verdict_kind, summary.verdict = v.kind, v.sentence


def _where(fd: dict) -> str:
    bench = str(fd.get("bench") or fd.get("target") or "")
    module = bench.rsplit("/", 1)[0] if "/" in bench else ""
    rank = f" on rank {fd['rank']}" if fd.get("rank") else ""
    seq = fd.get("bench_seq")
    return (f"{fd.get('op') or fd.get('target_op') or '?'}" + (f" in {module}" if module else "")
            + (f" (bench record #{seq})" if seq not in (None, "") else "") + rank)
