"""Op classes whose verdicts follow their nature, not their numbers.

- Value-preserving ops (views, transposes, reshapes, clones, detach, expand, same-dtype copies)
  move numbers without computing: they are never where an error is born on their own.
- Gathers (an embedding, ``index_select``, ``gather``) copy each output element from one input
  element chosen by an index: no arithmetic, so nothing summed, however much larger the table.
- A cast to a lower precision loses precision by design: labelled with its class, never a bug.
- Discontinuous ops (masks, indices, comparisons, sorting) turn a tiny input difference into a
  whole-unit output difference where the input lies at the decision boundary: there a
  disagreement is precision loss carried through the boundary, not a bug of the op.
"""
from __future__ import annotations

from ..numerics.kernel_families import kernel_specific, packet

VALUE_PRESERVING = frozenset(f"aten.{n}" for n in (
    "view", "_unsafe_view", "reshape", "_reshape_alias", "alias", "transpose", "t", "permute", "clone", "contiguous",
    "detach", "expand", "expand_as", "squeeze", "unsqueeze", "flatten", "unflatten", "unfold", "select", "slice",
    "narrow", "split", "split_with_sizes", "chunk", "unbind", "as_strided", "view_as", "lift_fresh", "lift_fresh_copy",
    "movedim", "swapaxes", "numpy_T", "mT", "mH", "adjoint", "diagonal", "_unsafe_split", "unsafe_split",
    "_unsafe_split_with_sizes", "unsafe_split_with_sizes", "repeat", "cat", "stack", "expand_copy", "view_copy",
    "permute_copy", "transpose_copy", "t_copy", "unsqueeze_copy", "squeeze_copy", "alias_copy", "detach_copy",
    "slice_copy", "select_copy", "split_copy", "_to_copy", "to", "copy", "_copy_from"))
# Of those, the ops whose output holds every element of their tensor inputs (an expand repeats
# them, a cat joins them): a difference anywhere in an input is somewhere in the output. Not a
# slice, a select or a split: a part need not hold the elements that differ.
_PARTS = frozenset(f"aten.{n}" for n in (
    "select", "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind", "as_strided", "diagonal", "unfold",
    "_unsafe_split", "unsafe_split", "_unsafe_split_with_sizes", "unsafe_split_with_sizes", "slice_copy",
    "select_copy", "split_copy"))
_CASTS = frozenset(("aten._to_copy", "aten.to", "aten.copy", "aten._copy_from"))

# Forward and backward ops whose output jumps where the input crosses a boundary. Which outputs of
# a selection (sort, topk, argmax, max pooling) are indices, and how ties are judged: replay needs
# that too, so it lives on the ground floor (numerics/selections.py).
DISCONTINUOUS = frozenset(f"aten.{n}" for n in (
    "relu", "threshold", "threshold_backward", "hardtanh", "hardtanh_backward", "relu6", "leaky_relu_backward",
    "max", "min", "amax", "amin", "argmax", "argmin", "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
    "max_pool1d_with_indices", "max_pool3d_with_indices", "sort", "topk", "argsort", "kthvalue", "median", "mode",
    "eq", "ne", "lt", "le", "gt", "ge", "where", "masked_fill", "sign", "floor", "ceil", "round", "trunc",
    "native_dropout", "native_dropout_backward", "bernoulli", "clamp", "clamp_min", "clamp_max", "heaviside",
    "logical_and", "logical_or", "logical_not", "isin", "bucketize", "searchsorted", "nonzero"))


# Module classes (module-level dumps) that apply such a decision: their backward passes the
# gradient where the forward input was on one side of the boundary.
DISCONTINUOUS_MODULES = frozenset(("relu", "relu6", "hardtanh", "threshold", "leakyrelu", "rrelu", "dropout"))
# the boundary value of each kind, where it is not 0 (threshold's is an argument)
THRESHOLD_ARG = "threshold"


# torch.optim's fused steps (fused=True): one kernel over every parameter's tensors
FUSED_OPTIMIZER_STEPS = frozenset(f"aten._fused_{n}" for n in ("adam", "adamw", "sgd", "adagrad"))


def is_multi_tensor(op: str) -> bool:
    """A multi-tensor kernel: item j of each list result is made from item j of each list
    argument alone (torch.optim's ``_foreach_*`` steps and its fused steps)."""
    return bool(op) and (packet(op).startswith("aten._foreach_") or packet(op) in FUSED_OPTIMIZER_STEPS)


# In-place ops that write every element of ``self`` from their other arguments alone
_OVERWRITE_SELF = frozenset(f"aten.{n}_" for n in ("copy", "fill", "zero", "_copy_from"))


def overwritten_inputs(op: str) -> frozenset[str]:
    """Arguments whose values the op never reads, only writes whole: ``copy_``'s ``self`` (an
    ``empty`` buffer, often), an out= variant's ``out``. Their differences cause nothing."""
    if not op:
        return frozenset()
    parts = op.split(".")
    name = ".".join(parts[:2])
    written = {"self"} if name in _OVERWRITE_SELF else set()
    if len(parts) > 2 and parts[2].startswith("out"):
        written.add("out")
    return frozenset(written)


# Ops whose output elements are each one element of their first tensor argument, picked by an index
# tensor: an embedding's row lookup, index_select, gather. (Not embedding_bag: it sums a bag.)
GATHERS = frozenset(f"aten.{n}" for n in (
    "embedding", "index_select", "gather", "index", "_unsafe_index", "take", "take_along_dim", "masked_select"))


def is_gather(op: str) -> bool:
    """Copies each output element from one input element an index picks: sums nothing."""
    return bool(op) and packet(op) in GATHERS


def is_value_preserving(op: str) -> bool:
    """Moves its input's numbers (a same-dtype copy at most): never an origin on its own."""
    return bool(op) and packet(op) in VALUE_PRESERVING


def is_discontinuous(op: str, kind: str = "op") -> bool:
    """An op (or, ``kind="module"``, a module class) whose output jumps at a decision boundary."""
    if not op:
        return False
    return op.lower() in DISCONTINUOUS_MODULES if kind == "module" else packet(op) in DISCONTINUOUS


_ORDER = ("float8_e5m2", "float8_e4m3fn", "bfloat16", "float16", "float32", "float64")


def is_cast(op: str) -> bool:
    """A dtype conversion (``_to_copy``, ``to``, ``copy``): its values move unchanged but for
    the rounding of the coarser dtype."""
    return packet(op) in _CASTS


def cast_class(op: str, from_dtype: str, to_dtype: str) -> str | None:
    """``"cast to bfloat16"`` when ``op`` casts to a float dtype of lower precision, else None."""
    if packet(op) not in _CASTS or from_dtype not in _ORDER or to_dtype not in _ORDER:
        return None
    return f"cast to {to_dtype}" if _ORDER.index(to_dtype) < _ORDER.index(from_dtype) else None


def skip_kernel_specific(rows: list) -> None:
    """Mark the rows of outputs two family members do not share as SKIP, with the reason (both
    compare paths call this before attribution)."""
    from .result import PairStatus

    for r in rows:
        if r.bench_op and r.target_op:
            why = kernel_specific(r.bench_op, r.target_op, r.tensor, (r.bench_shape, r.target_shape))
            if why:
                r.status, r.note = PairStatus.SKIP.value, why


def keeps_every_element(op: str) -> bool:
    """A value-preserving op whose output holds every element of its tensor inputs (``_PARTS``)."""
    return bool(op) and packet(op) in VALUE_PRESERVING and packet(op) not in _PARTS
