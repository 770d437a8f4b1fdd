"""Turn live ATen arguments into the dump's data model, and into de-duplication keys."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..dump.model import Scalar, Stats, TensorMeta
from ..dump.tensorio import dtype_name
from .flatten import PLAIN_TENSORS


@dataclass(frozen=True, eq=False)
class OpInfo:
    """Per-OpOverload facts taken from its schema once, then cached. Compared and hashed by
    identity: there is one per OpOverload, so it keys an op in the recorder's tables at C speed
    (an OpOverload's own ``__hash__`` is Python code)."""

    name: str
    arg_names: tuple[str, ...]
    mutates: tuple[str, ...]
    stats_preserving: bool  # output holds exactly the input's elements (view/copy ops)
    # Outputs recorded: the schema's returns (a single Tensor[] return is one output), or, for a
    # call that returns nothing but writes arguments (``_foreach_add_``, ``_fused_adamw_``), one
    # per written argument: ``written_results`` names them, read after the kernel ran.
    returns: int
    defaults: tuple[tuple[str, Any], ...]  # (name, default) of arguments that have one
    # The first output aliases the first input (view, slice, t...): it shares that input's
    # version counter, which autograd attaches only after the kernel has returned.
    view: bool = False
    # c10d.* and the functional collectives (_c10d_functional.*): return before their tensors
    # are final (a Work, or a tensor that wait_tensor completes)
    collective: bool = False
    written_results: tuple[str, ...] = ()
    # The role of each recorded output in a consumer's de-dup key (Producers.roles): the op's
    # name for the first, "<name>:<i>" for output i (an attention backward's grad_k is not its
    # grad_v); a Tensor[] output's items all take their output's (unbind's slices are one role).
    roles: tuple[str, ...] = ()

    @property
    def writes(self) -> bool:
        """A call may write a tensor argument (collectives declare no writes but do)."""
        return bool(self.mutates) or self.collective


# Ops whose first output holds the same multiset of values as their first input, so the
# input's statistics can be reused instead of recomputed (when dtype and numel also agree).
_SAME_VALUES = {
    "view", "_unsafe_view", "_reshape_alias", "reshape", "t", "transpose", "permute", "unsqueeze",
    "squeeze", "alias", "detach", "clone", "contiguous", "_to_copy", "to", "lift_fresh",
    "numpy_T", "flatten", "unflatten", "movedim", "swapaxes", "mT",
}


# Arguments a kernel writes that its schema does not mark as written (``Tensor(a!)``): a batch
# norm in training updates its running statistics in place. torch marks them on
# _native_batch_norm_legit, not on these; without the mark the statistics cache (keyed by version
# counters, which an unmarked write does not bump) would describe the old values at later reads.
_UNDECLARED_WRITES = {name: ("running_mean", "running_var")
                      for name in ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm")}
# ...and only in training: an eval call reads them and writes nothing
_WRITES_IN_TRAINING = {f"aten.{name}.default": written for name, written in _UNDECLARED_WRITES.items()}


def writes_now(info: "OpInfo", args: tuple, kwargs: dict) -> bool:
    """Whether this call of ``info``'s op writes (``OpInfo.writes``), for the queued statistics
    that must be read before a write (``DeferredStats.before_write``): a batch norm's undeclared
    write of its running statistics happens only in training, with running statistics given."""
    if not info.writes:
        return False
    written = _WRITES_IN_TRAINING.get(info.name)
    if written is None:
        return True
    bound = bind_inputs(info, args, kwargs)
    return bool(bound.get("training")) and any(bound.get(n) is not None for n in written)


# id(func) -> (func, its OpInfo): keyed by id because OpOverload.__hash__ is Python code and
# this runs for every recorded call; func is held, so its id is never reused while it is here.
_OP_INFOS: dict[int, tuple[Any, OpInfo]] = {}


def op_info(func: torch._ops.OpOverload) -> OpInfo:
    """Schema facts of ``func``, computed once per process (schemas never change)."""
    hit = _OP_INFOS.get(id(func))
    if hit is not None and hit[0] is func:
        return hit[1]
    info = _op_info(func)
    _OP_INFOS[id(func)] = (func, info)
    return info


def _op_info(func: torch._ops.OpOverload) -> OpInfo:
    schema = func._schema
    names = tuple(a.name for a in schema.arguments)
    mutates = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    packet = func._schema.name.split("::")[-1]
    mutates += tuple(n for n in _UNDECLARED_WRITES.get(packet, ()) if n in names and n not in mutates)
    defaults = tuple((a.name, a.default_value) for a in schema.arguments if a.has_default_value())
    view = bool(schema.returns) and schema.returns[0].alias_info is not None and not mutates
    written = mutates if not schema.returns else ()
    name, returns = str(func), len(schema.returns) or len(written)
    roles = tuple(name if i == 0 else f"{name}:{i}" for i in range(max(returns, 1)))
    return OpInfo(name, names, mutates, packet in _SAME_VALUES and not mutates,
                  returns, defaults, view, _is_collective(name), written, roles)


# Functional collectives' helpers that exchange nothing (wait_tensor completes one).
_NOT_EXCHANGES = ("wait_tensor", "_wrap_tensor_autograd")


def _is_collective(name: str) -> bool:
    namespace, _, rest = name.partition(".")
    if namespace == "c10d":
        return True
    return namespace in ("_c10d_functional", "_c10d_functional_autograd") and rest.split(".")[0] not in _NOT_EXCHANGES


def recorded_result(info: OpInfo, out: Any, bound: dict[str, Any]) -> Any:
    """What a call's outputs are recorded from: its result, or for a call that returns nothing
    but writes (``info.written_results``), the written arguments, so a wrong in-place update of a
    list of tensors (an optimizer's ``_foreach_*_`` or fused step) is seen where it happens."""
    if not info.written_results:
        return out
    written = tuple(bound.get(n) for n in info.written_results)
    return written if len(written) > 1 else written[0]


def bind_inputs(info: OpInfo, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = {}
    names = info.arg_names
    for i, a in enumerate(args):
        bound[names[i] if i < len(names) else f"arg{i}"] = a
    bound.update(kwargs)
    for name, default in info.defaults:  # the dispatcher drops arguments equal to their default
        if name not in bound:
            bound[name] = default
    return bound


def signature_key(op: OpInfo, args: tuple, kwargs: dict) -> tuple:
    """Hashable identity of a call of ``op``: tensor shapes/dtypes/strides/devices, other values.
    One item per positional argument, then (name, key) per keyword. Runs for every call under
    de-dup, so plain tensors and atoms are keyed inline. The recorder's C path
    (xray/record/_fastpath.c) builds the same keys for the same table: change both together."""
    parts = [op]
    for a in args:
        kind = type(a)
        if kind in PLAIN_TENSORS:
            parts.append((a.shape, a.dtype, a.stride(), a.device))
        elif kind in ATOMS:
            parts.append((kind, a))
        else:
            parts.append(_key(a))
    if kwargs:
        parts += [(k, _key(v)) for k, v in kwargs.items()]
    return tuple(parts)


def dedup_key(signature: tuple, frames: list, roles: tuple) -> tuple:
    """De-dup's identity of a call: its signature, the innermost module running it (None outside
    any) and the roles of its tensor arguments (Producers.roles: which op, or a parameter, a
    buffer, a model input, produced each). Each module keeps a record of each signature it calls
    with each kind of inputs, so a fault in layer 17 of 32 has a record of its own, and so has a
    ``masked_fill`` after a softmax beside one of the same shapes before it; later calls (the
    next step, the next token) fold into it. Roles name kinds of producers, not calls, so a
    loop's later steps still fold. The C path (_fastpath.c: dedup_key) builds the same key."""
    return (signature, frames[-1][0] if frames else None, roles)


def _key(a: Any) -> Any:
    if type(a) in PLAIN_TENSORS or isinstance(a, torch.Tensor):
        return (a.shape, a.dtype, a.stride(), a.device)
    if isinstance(a, (list, tuple)):
        return tuple([_key(x) for x in a])
    if isinstance(a, float):  # 1 == 1.0 == True in a dict; NaN != NaN: key floats by repr
        return ("f", repr(a))
    if isinstance(a, (bool, int, str)) or a is None:
        return (type(a), a)
    return (type(a).__name__, stable_repr(a))


# Argument values kept as they are (and keyed by type and value: 1 == True in a dict).
ATOMS = frozenset({type(None), bool, int, str})


def encode_value(v: Any, meta_of: Callable[[torch.Tensor], TensorMeta]) -> Any:
    """Convert one argument or result into JSON-able model values (TensorMeta, Scalar...).
    Exact types first: ``isinstance(x, torch.Tensor)`` costs ~250 ns for a non-tensor."""
    kind = type(v)
    if kind in PLAIN_TENSORS:
        return meta_of(v)
    if kind in ATOMS:
        return v
    if kind is list or kind is tuple:
        return [encode_value(x, meta_of) for x in v]
    if isinstance(v, torch.Tensor):
        return meta_of(v)
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else Scalar("float", v)
    if isinstance(v, (list, tuple)):
        return [encode_value(x, meta_of) for x in v]
    if isinstance(v, torch.dtype):
        return Scalar("dtype", dtype_name(v))
    if isinstance(v, torch.device):
        return Scalar("device", str(v))
    if isinstance(v, torch.layout):
        return Scalar("layout", str(v).removeprefix("torch."))
    if isinstance(v, torch.memory_format):
        return Scalar("memory_format", str(v).removeprefix("torch."))
    if isinstance(v, complex):
        return Scalar("complex", [v.real, v.imag])
    if isinstance(v, torch.SymInt):
        hint = getattr(v.node, "hint", None)
        return Scalar("symint", {"expr": str(v), "hint": hint if type(hint) is int else None})
    if isinstance(v, (torch.SymFloat, torch.SymBool)):
        return Scalar("repr", str(v))
    return Scalar("repr", stable_repr(v)[:200])


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def stable_repr(v: Any) -> str:
    """``repr(v)`` without object addresses (``<torch._C.Generator object at 0x7f..>``): the text
    keys de-duplication and plans, and an address would make every call of the op a new one."""
    return _ADDRESS.sub("", repr(v))


def unsupported(t: torch.Tensor) -> str | None:
    """Why ``t`` cannot be described by statistics and saved data, or None when it can."""
    if t.is_meta:
        return "meta tensor"
    if t.is_nested:
        return f"nested tensor ({str(t.layout).removeprefix('torch.')} layout)"
    if t.is_quantized:
        return "quantized tensor"
    return None


# An expanded view is saved as a contiguous copy: above this, that copy (2**32 elements from one
# value) would take the host's memory, so it keeps its statistics only.
MAX_EXPANDED_SAVE = 1 << 28


def not_saved(t: torch.Tensor) -> str | None:
    """Why ``t``'s values are not copied into the dump (the note its row gets), or None.

    A wrapper subclass (TwoTensor, DTensor) holds no storage of its own: its data lives in inner
    tensors whose meaning only the subclass knows, so it keeps its statistics only."""
    if is_traceable_wrapper_subclass(t):
        return f"not saved: a {type(t).__name__} (a tensor subclass) holds no data of its own (statistics only)"
    if 0 in t.stride() and t.numel() * t.element_size() > MAX_EXPANDED_SAVE:
        return f"not saved: an expand of {t.numel()} elements (statistics only)"
    return None


def noted_meta(t: torch.Tensor, why: str) -> TensorMeta:
    """The description of a tensor the recorder cannot read: what is known, and why no more.
    A symbolic size (a jagged dimension) leaves the shape empty; the note spells it out."""
    try:
        sizes = list(t.shape)
    except RuntimeError:  # a strided nested tensor has no single shape
        sizes = []
    text = ", ".join(str(s) for s in sizes) if sizes else "?"
    shape = tuple(sizes) if all(type(s) is int for s in sizes) else ()
    return TensorMeta(shape=shape, dtype=dtype_name(t.dtype), device=str(t.device),
                      requires_grad=bool(t.requires_grad),
                      note=f"{why}, shape ({text}): no statistics or data recorded")


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def tensor_meta(t: torch.Tensor, stats: Stats | None, with_layout: bool, source: str | None = None) -> TensorMeta:
    """Hot (every described tensor): positional construction, names of dtypes cached."""
    dtype = _DTYPE_NAMES.get(t.dtype)
    if dtype is None:
        dtype = _DTYPE_NAMES[t.dtype] = dtype_name(t.dtype)
    if not with_layout:
        return TensorMeta(tuple(t.shape), dtype, None, 0, "cpu", False, stats, None, source)
    try:
        stride, offset = t.stride(), t.storage_offset()
    except RuntimeError:  # sparse and other layouts have no strides
        stride, offset = None, 0
    return TensorMeta(tuple(t.shape), dtype, stride, offset, "cpu" if t.is_cpu else str(t.device),
                      t.requires_grad, stats, None, source)
