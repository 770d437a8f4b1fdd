"""Plain results of a compare: the PairStatus enum, one CompareRow per tensor pair, the Summary.

Rows serialise to CSV (columns declared once, in ``COMPARE_COLUMNS``) and the summary to JSON, so a compare
run on one machine can be read anywhere with pandas or json.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any


# The note of a row made from random draws that differ between the runs (compare skips it: seed
# both runs alike to compare it)
RANDOM_DRAWS = "values not compared: made from random draws that differ between the runs"


# Failing rows attributed (origin, cause, culprit), the earliest in execution order first: later
# ones keep status and metrics only (attribution_bound.py says why this many)
ATTRIBUTED = 16384


class PairStatus(str, enum.Enum):
    """Outcome of one compared tensor pair. The rules are ``xray.numerics.rules.Rules`` (docs/compare.md)."""

    PASS = "pass"  #: every element close (assert_close rule), or statistics within tolerance
    WARNING = "warning"  #: error spread like rounding (or measured precision loss), not a bug
    FAIL = "fail"  #: beyond the warning rule (a few wrong elements fail), or shapes that cannot be compared
    NAN_INF = "nan/inf"  #: NaN/Inf where the other side has a finite value (or different counts)
    UNMATCHED = "unmatched"  #: present on one side only (fused, decomposed, or not recorded)
    SKIP = "skip"  #: nothing to compare: no saved data and no statistics on one side, or random values


FAILING = (PairStatus.FAIL, PairStatus.NAN_INF)


@dataclass(slots=True)  # slots: a million rows take 0.4 GB, not 1.7 (tools/bench_bigdump.py)
class CompareRow:
    """One compared pair of output tensors (or one unmatched tensor). Empty numbers are None."""

    rank: str = ""
    index: int = 0  # position in execution order (bench order, unmatched target rows in between)
    status: str = ""
    origin: str = ""  # failing rows: "born" (the error enters here) or "inherited" (an input already differs)
    inputs_agree: str = ""  # "yes", "no", "unknown"
    cause: str = ""  # why: parameter / target-only op / bench-only op / model input / argument / local error / precision loss / inherited
    culprit: str = ""  # what the cause names: the parameter, the target-only op, the producing record
    # target seq of the call the error enters at, where no matched record is: a target-only op
    # (cause "target-only op"), or a call de-dup folded (inherited from it: the dump holds no record of it)
    culprit_target_seq: int | None = None
    culprit_bench_seq: int | None = None  # bench seq of the bench-only op the target skipped (cause "bench-only op")
    local_err: float | None = None  # max|target - fp64 recomputation on the target's inputs| / max|recomputation|
    local_floor: float | None = None  # the same error of CPU at the target's dtype (the op's own noise)
    accumulated_err: float | None = None  # max|target - bench| / max|bench|
    bench_name: str = ""
    target_name: str = ""
    kind: str = ""
    module: str = ""  # module path (wrapper prefixes stripped) of the bench record, else the target's
    bench_op: str = ""
    target_op: str = ""
    tensor: str = ""  # output name, e.g. out0
    bench_seq: int | None = None
    target_seq: int | None = None
    bench_shape: str = ""
    target_shape: str = ""
    bench_dtype: str = ""
    target_dtype: str = ""
    mode: str = ""  # "data" (saved tensors) or "stats" (statistics only)
    cosine: float | None = None
    rmse: float | None = None
    rel_rmse: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    isclose_pct: float | None = None
    gt_num: int | None = None
    numel: int | None = None
    stats_err: float | None = None
    # statistics rows with a sample on both sides: max |t - b| over the sampled elements / max |bench|
    sample_err: float | None = None
    ref_err_bench: float | None = None
    ref_err_target: float | None = None
    bench_nan: int | None = None
    target_nan: int | None = None
    bench_inf: int | None = None
    target_inf: int | None = None
    rtol: float | None = None
    atol: float | None = None
    layout: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The CSV columns, in order. docs/compare.md documents each one.
COMPARE_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(CompareRow))


@dataclass
class Summary:
    """Totals. Records are counted per side; statuses are counted per row (tensor pair)."""

    bench: str
    target: str
    bench_records: int = 0
    target_records: int = 0
    matched: int = 0
    match_pct: float = 0.0
    rows: int = 0
    passed: int = 0
    warned: int = 0
    failed: int = 0
    nan_inf: int = 0
    skipped: int = 0
    random_draws: int = 0  # rows not compared: made from random draws that differ between the runs
    unmatched: int = 0
    unmatched_bench: int = 0
    unmatched_target: int = 0
    first_divergence: dict | None = None
    # compare's one-line verdict (verdict.py): "bug", "precision" or "cannot tell", and why
    verdict_kind: str = ""
    verdict: str = ""
    dedup: list[str] = field(default_factory=list)  # de-duplicated sides and what that hides
    # sides whose backward ran but was not recorded (dump.json summary.unrecorded): "target: 42 calls"
    unrecorded_backward: list[str] = field(default_factory=list)
    # sides whose recording stopped early (dump.json summary.stopped or error): "target (rank_1): at seq 2 ..."
    stopped: list[str] = field(default_factory=list)
    # a multi-rank target whose ranks disagree where they must agree (cross_rank.py), first first
    cross_rank: list[str] = field(default_factory=list)
    bytes_compared: int = 0
    seconds: float = 0.0
    ranks: dict[str, dict] = field(default_factory=dict)
    divergence_order: list[str] = field(default_factory=list)  # diverging ranks, first first (by collectives)
    errors: dict[str, str] = field(default_factory=dict)  # torchrun compare: ranks whose inputs were unusable
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompareResult:
    rows: list[CompareRow]
    summary: Summary

    def status_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out
