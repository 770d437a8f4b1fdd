"""Which recorded calls produce values their inputs do not determine: replay and compare check
only their shapes and dtypes.

Random ops: torch tags the ATen ops that draw from a generator ``Tag.nondeterministic_seeded``
(randn, rand, randint, randperm, normal_, uniform_, bernoulli, multinomial, exponential_, dropout,
rrelu, RNNs, SDPA...; in torch 2.13 every ATen op taking a Generator has it, except the seed
getters and setters). Some draw nothing for the recorded arguments: eval mode (``train=False``)
or a zero dropout probability, as in inference attention (SDPA at ``dropout_p=0``). Those are
compared as usual.

Uninitialized memory: no tag marks ``empty`` and friends, whose values are whatever the allocator
returned; a training dropout records ``empty_like`` before ``bernoulli_``. They are listed by name.
"""
from __future__ import annotations

import functools

import torch

from ..dump.model import Record
from .rebuild import UnknownOpError, resolve_op

# Recorded False: dropout, rrelu and RNNs run in eval mode and draw nothing.
_TRAIN_FLAGS = ("train", "training")
# Recorded 0: nothing is dropped or drawn (dropout's p, bernoulli's p, SDPA's dropout_p, RNN dropout).
_PROBABILITIES = ("p", "dropout_p", "dropout")
# Ops returning uninitialized memory (aten op names; every overload); resize_ grows a tensor
# with it (and compare re-runs in-place ops, so it must know).
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                            "new_empty_strided", "resize_", "resize_as_"})


def nondeterministic(record: Record) -> str | None:
    """Why the record's output values are not a function of its inputs, or None when they are."""
    if record.kind != "op" or all(m.numel == 0 for _, m in record.output_tensors()):
        return None  # no values to differ
    kind = op_kind(record.op)
    if kind == "uninitialized":
        return f"{record.op} returns uninitialized memory"
    if kind == "random" and not _draws_nothing(record):
        return f"{record.op} draws random numbers (tagged nondeterministic_seeded)"
    return None


@functools.lru_cache(maxsize=4096)
def op_kind(name: str) -> str | None:
    """"uninitialized", "random" or None for an op name; once per name (compare asks for every
    record of a dump)."""
    try:
        op = resolve_op(name)
    except UnknownOpError:
        return None
    if op._schema.name.split("::")[-1] in _UNINITIALIZED:
        return "uninitialized"
    return "random" if torch.Tag.nondeterministic_seeded in op.tags else None


def _draws_nothing(record: Record) -> bool:
    args = record.inputs
    if any(args.get(name) is False for name in _TRAIN_FLAGS):
        return True
    return any(_is_zero(args.get(name)) for name in _PROBABILITIES)


def _is_zero(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
