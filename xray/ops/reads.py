"""Which ATen ops read no value of their tensor arguments: only sizes, dtypes and metadata.

The recorder needs it to know which calls read memory (``record/unwritten.py``: reading an
unwritten buffer's shape is not reading its values); a sharded compare needs it to know which
outputs every rank makes alike whatever its inputs hold (``compare/unshard.py``: each rank's
``ones_like`` of its own loss seeds the same backward).
"""
from __future__ import annotations

# Filled from their arguments alone: the same output wherever the sizes agree.
FILLS = frozenset({"zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full"})
# Every op that reads only its arguments' sizes and dtypes (random draws included).
SHAPE_ONLY = FILLS | frozenset({"rand_like", "randn_like", "randint_like", "resize_", "resize_as_", "set_",
                                "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
                                "_has_same_storage_numel"})


def op_name(op: str) -> str:
    """``aten.ones_like.default`` -> ``ones_like`` (the name these sets hold)."""
    parts = op.split(".")
    return parts[1] if len(parts) > 1 else op


def fills(op: str) -> bool:
    """Whether ``op`` (a recorded op name) is a fill: its values come from its arguments alone."""
    return op.startswith("aten.") and op_name(op) in FILLS
