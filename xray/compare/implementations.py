"""Records that cannot pair because the two runs chose other implementations of one step.

Why: torch.optim runs a step as per-tensor ops (``foreach=False``: the default on CPU), as
multi-tensor ``_foreach_*`` kernels (the default on CUDA and other accelerators) or as one
``_fused_adam(w)_``/``_fused_sgd_`` kernel (``fused=True``). The three compute the same update in
other orders and groupings of calls, so none of one run's optimizer records pairs with the
other's: the step is left unmatched and a wrong update would be found only in the next forward.
Both implementations run on CPU, so the remedy is to choose one for both runs; this says so.
"""
from __future__ import annotations

from ..numerics.kernel_families import packet
from .op_classes import FUSED_OPTIMIZER_STEPS, is_multi_tensor
from .result import CompareRow, PairStatus

_CHOICE = {"foreach": "multi-tensor _foreach_* kernels (foreach=True)",
           "fused": "one fused kernel (fused=True)", "loop": "per-tensor ops (foreach=False)"}
# the per-tensor ops that only an optimizer's for-loop step runs (Adam(W), RMSprop, Adagrad)
_LOOP_STEP_OPS = frozenset(("aten.addcdiv", "aten.addcmul", "aten.lerp"))


def _implementation(ops: set[str]) -> str | None:
    """How the step ran, by its unmatched records: None when they show no optimizer step."""
    kernels = {packet(op) for op in ops}
    if kernels & FUSED_OPTIMIZER_STEPS:
        return "fused"
    if any(is_multi_tensor(op) for op in kernels):
        return "foreach"
    return "loop" if kernels & _LOOP_STEP_OPS else None


def optimizer_note(rows: list[CompareRow], label: str = "") -> str | None:
    """A warning when the two runs' unmatched records show optimizer steps implemented two ways
    (per-tensor ops, ``_foreach_*`` kernels, a fused kernel), else None."""
    unmatched: dict[str, dict[int, str]] = {"bench": {}, "target": {}}
    for r in rows:
        if r.status != PairStatus.UNMATCHED.value:
            continue
        for side, seq, op in (("bench", r.bench_seq, r.bench_op), ("target", r.target_seq, r.target_op)):
            if seq is not None and op:
                unmatched[side][seq] = op
    kinds = {side: _implementation(set(ops.values())) for side, ops in unmatched.items()}
    if None in kinds.values() or kinds["bench"] == kinds["target"]:
        return None
    where = f" ({label})" if label else ""
    sides = "; ".join(f"{side} ran {_CHOICE[kinds[side]]}, {len(unmatched[side])} unmatched records"
                      for side in ("bench", "target"))
    return (f"optimizer step{where}: the two runs implement it differently, so its records cannot pair ({sides}). "
            "torch.optim defaults to foreach on accelerators and to a for-loop on CPU: construct the optimizer "
            "with the same foreach= (or fused=) in both runs (each runs on CPU too) to compare the step kernel "
            "by kernel")
