"""Rebuild a recorded op call: resolve its OpOverload safely and materialize its inputs.

Shared by ``xray-gen`` (generated tests) and ``xray-replay``. Nothing from a dump is evaluated:
op names go through a strict regex and an attribute walk on ``torch.ops``; dtypes, layouts and
memory formats are looked up by validated name and type-checked.

Inputs are built on CPU with a seeded CPU generator and only then moved to the target device, so
two devices given the same seed see bit-identical inputs.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable

import torch

from ..dump.model import Record, Scalar, TensorMeta
from ..dump.protocol import Dump
from ..dump.tensorio import dtype_from_name, dtype_name, stored_dtype_name
from .safety import refusal

FACTORIES = ("load", "random", "auto")

# namespace.op.overload; each part a plain identifier, never a dunder (which would reach Python
# internals of the torch.ops objects instead of operators).
_OP_RE = re.compile(r"^(?!__)[A-Za-z_][A-Za-z0-9_]*\.(?!__)[A-Za-z_][A-Za-z0-9_]*\.(?!__)[A-Za-z_][A-Za-z0-9_]*$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEVICE_RE = re.compile(r"^[a-z_][a-z0-9_]*(:[0-9]+)?$")


class UnknownOpError(ValueError):
    """The recorded op name is malformed or names no operator in this torch build."""


class UnsafeOpError(UnknownOpError):
    """The recorded op could touch files or the process (xray.ops.safety): never run it."""


class MissingTensorError(KeyError):
    """``--factory load`` was asked for a tensor whose data is not in the dump."""

    def __str__(self) -> str:  # KeyError would repr() the message, quotes and all
        return str(self.args[0]) if self.args else "missing tensor"


class UnsupportedValueError(ValueError):
    """A recorded argument that cannot be rebuilt (an opaque ``repr`` value, e.g. a Generator)."""


def resolve_op(name: str) -> torch._ops.OpOverload:
    """The OpOverload for ``aten.add.Tensor``-style names; raise UnknownOpError otherwise."""
    if not isinstance(name, str) or not _OP_RE.match(name):
        raise UnknownOpError(f"invalid op name {name!r}: expected namespace.op.overload made of identifiers")
    ns, op, overload = name.split(".")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        func = getattr(packet, overload)
    except (AttributeError, RuntimeError) as e:
        raise UnknownOpError(f"unknown op {name!r}: not found in torch.ops of torch {torch.__version__}") from e
    if not isinstance(func, torch._ops.OpOverload):
        raise UnknownOpError(f"{name!r} is not an operator overload")
    why = refusal(func)
    if why is not None:
        raise UnsafeOpError(f"refused op {name!r}: {why}")
    return func


def is_pointwise(func: torch._ops.OpOverload) -> bool:
    """Torch's ``Tag.pointwise`` on a functional overload (not ``out=``): each output element is
    made from the input elements at its own position (broadcast)."""
    return torch.Tag.pointwise in func.tags and "out" not in func._overloadname


@functools.lru_cache(maxsize=4096)  # a million records name a few hundred ops
def is_pointwise_op(name: str) -> bool:
    """``is_pointwise`` by a recorded op name; False for a name torch does not resolve."""
    try:
        return is_pointwise(resolve_op(name))
    except (UnknownOpError, UnsafeOpError):
        return False


def dtype_of(name: str) -> torch.dtype:
    """A recorded dtype name (``bfloat16``) as a torch.dtype; anything else raises ValueError."""
    if not isinstance(name, str) or not _NAME_RE.match(name.removeprefix("torch.")):
        raise ValueError(f"invalid dtype name {name!r}")
    return dtype_from_name(name)


def _named_attr(name: Any, kind: type, what: str) -> Any:
    if not isinstance(name, str) or not _NAME_RE.match(name.removeprefix("torch.")):
        raise ValueError(f"invalid {what} name {name!r}")
    v = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(v, kind):
        raise ValueError(f"unknown {what} {name!r}")
    return v


def materialize_value(value: Any, dump: Dump, *, factory: str = "load", generator: torch.Generator | None = None,
                      device: str | torch.device = "cpu", ignored: int | None = None) -> Any:
    """Turn one recorded value (TensorMeta, Scalar, list, plain) into a live argument
    (``ignored``: see ``ignored_index``).

    Recorded ``device`` arguments are mapped to the target ``device``: a test rebuilt for
    another machine must allocate there, not on the recording machine's device.
    """
    _check_factory(factory)
    return _walk(value, lambda meta: _tensor(meta, dump, factory, generator, torch.device(device), ignored),
                 device)


def _check_factory(factory: str) -> None:
    if factory not in FACTORIES:
        raise ValueError(f"unknown factory {factory!r}; use one of {', '.join(FACTORIES)}")


def _walk(value: Any, tensor: Callable[[TensorMeta], Any], device: str | torch.device) -> Any:
    """``value`` with each TensorMeta replaced by ``tensor(meta)`` and each Scalar made live."""
    if isinstance(value, TensorMeta):
        return tensor(value)
    if isinstance(value, Scalar):
        return scalar_value(value, device)
    if isinstance(value, (list, tuple)):
        return [_walk(v, tensor, device) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise UnsupportedValueError(f"cannot rebuild value of type {type(value).__name__}")


def scalar_value(s: Scalar, device: str | torch.device = "cpu") -> Any:
    """The live value of a recorded tagged scalar, validated (the generator renders this value,
    never the raw JSON); a recorded device becomes ``device``."""
    tag, v = s.tag, s.value
    if tag == "dtype":
        return dtype_of(v)
    if tag == "device":
        if not isinstance(v, str) or not _DEVICE_RE.match(v):
            raise ValueError(f"invalid device {v!r}")
        return torch.device(device)
    if tag == "layout":
        return _named_attr(v, torch.layout, "layout")
    if tag == "memory_format":
        return _named_attr(v, torch.memory_format, "memory_format")
    if tag == "float":
        if isinstance(v, str):
            if v not in ("nan", "inf", "-inf"):
                raise ValueError(f"invalid float {v!r}")
            return float(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        raise ValueError(f"invalid float {v!r}")
    if tag == "complex":
        if (isinstance(v, (list, tuple)) and len(v) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            return complex(float(v[0]), float(v[1]))
        raise ValueError(f"invalid complex {v!r}")
    if tag == "str":
        if not isinstance(v, str):
            raise ValueError(f"invalid string {v!r}")
        return v
    if tag == "symint":
        hint = v.get("hint") if isinstance(v, dict) else None
        if isinstance(hint, int) and not isinstance(hint, bool):
            return hint
        raise UnsupportedValueError(f"symbolic int {v!r} has no concrete hint")
    raise UnsupportedValueError(f"cannot rebuild a {tag!r} value ({str(v)[:60]!r})")


# -- tensors --------------------------------------------------------------------------------------

def _check_meta(meta: TensorMeta) -> torch.dtype:
    dtype = dtype_of(meta.dtype)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in meta.shape):
        raise ValueError(f"invalid shape {meta.shape!r}")
    return dtype


def _tensor(meta: TensorMeta, dump: Dump, factory: str, generator: torch.Generator | None,
            device: torch.device, ignored: int | None = None) -> torch.Tensor:
    dtype, saved = _source(meta, dump, factory)
    if saved:
        data = dump.load_tensor(meta)
        _check_saved(meta, dtype, data.shape, data.dtype)
    else:
        data = random_like_meta(meta, dtype, generator, ignored=ignored)
    return place(data, meta.stride, device)


def _check_tensor(meta: TensorMeta, dump: Dump, factory: str) -> None:
    """``_tensor``'s checks, with the saved data's shape and dtype taken from its dataset header."""
    dtype, saved = _source(meta, dump, factory)
    if saved:
        ds = dump.dataset(meta)
        _check_saved(meta, dtype, ds.shape, dtype_from_name(stored_dtype_name(ds)))


def _source(meta: TensorMeta, dump: Dump, factory: str) -> tuple[torch.dtype, bool]:
    """The tensor's validated dtype, and whether its data is loaded from the dump (else random)."""
    dtype = _check_meta(meta)
    saved = dump is not None and meta.data is not None and dump.has_data(meta)
    if factory == "load" and not saved:
        where = f"{meta.data!r} in {getattr(dump, 'folder', 'the dump')}" if meta.data else "in the dump"
        raise MissingTensorError(
            f"tensor {list(meta.shape)} {meta.dtype} was not saved ({where}); "
            "use --factory random to regenerate it from its statistics (or record with a larger X_DUMP_NUM)")
    return dtype, saved and factory != "random"


def _check_saved(meta: TensorMeta, dtype: torch.dtype, shape: tuple[int, ...], saved_dtype: torch.dtype) -> None:
    if tuple(shape) != tuple(meta.shape) or saved_dtype != dtype:
        raise ValueError(f"saved tensor {meta.data!r} is {tuple(shape)} {saved_dtype}, "
                         f"but the record says {tuple(meta.shape)} {meta.dtype}")


def ignored_index(inputs: dict, arg: str) -> int | None:
    """The negative sentinel that argument ``arg`` of a call with ``inputs`` may hold besides its
    valid class indices, or None.

    A class-index ``target`` (nll_loss and its 2-D and n-D forms, cross_entropy) holds classes in
    [0, C) and, where a sample is ignored, ``ignore_index`` (-100 by default). Its recorded range
    spans both, so drawing uniformly in it yields negative classes that no kernel accepts.
    """
    value = inputs.get("ignore_index")
    if arg != "target" or type(value) is not int or value >= 0:
        return None
    return value


def random_like_meta(meta: TensorMeta, dtype: torch.dtype, generator: torch.Generator | None,
                     device: str | torch.device = "cpu", ignored: int | None = None) -> torch.Tensor:
    """Random data of ``meta``'s shape that follows its recorded statistics, made on ``device``
    (``generator`` must live on that device).

    ``ignored`` (see ``ignored_index``): an integer tensor whose recorded minimum is this sentinel
    holds it, at the share that keeps the recorded mean, and valid indices in [0, max] elsewhere.
    """
    shape = tuple(meta.shape)
    dev = torch.device(device)
    st = meta.stats
    if st is None or st.min is None or st.max is None:
        return torch.zeros(shape, dtype=dtype, device=dev)
    lo, hi = float(st.min), float(st.max)
    if dtype == torch.bool:
        p = min(max(float(st.mean if st.mean is not None else 0.5), 0.0), 1.0)
        return torch.bernoulli(torch.full(shape, p, dtype=torch.float64, device=dev), generator=generator).to(torch.bool)
    if dtype.is_floating_point or dtype.is_complex:
        def uniform() -> torch.Tensor:
            return torch.rand(shape, generator=generator, dtype=torch.float64, device=dev) * (hi - lo) + lo
        if dtype.is_complex:  # stats cover real and imaginary parts together
            return torch.complex(uniform(), uniform()).to(dtype)
        return uniform().to(dtype)
    if ignored is not None and lo == ignored and hi >= 0:
        return _with_ignored(shape, dtype, generator, dev, ignored, int(hi), st.mean)
    info = torch.iinfo(dtype)
    low = max(int(math.floor(lo)), info.min)
    high = min(int(math.ceil(hi)), info.max - 1)  # randint's bound is exclusive
    if high < low:
        high = low
    return torch.randint(low, high + 1, shape, generator=generator, dtype=torch.int64, device=dev).to(dtype)


def _with_ignored(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator | None,
                  dev: torch.device, ignored: int, hi: int, mean: float | None) -> torch.Tensor:
    """``ignored`` at share p, uniform in [0, hi] elsewhere: p * ignored + (1 - p) * hi / 2 is the
    recorded mean (p = 1/2 when no mean was recorded)."""
    p = 0.5 if mean is None else (hi / 2 - float(mean)) / (hi / 2 - ignored)
    p = min(max(p, 0.0), 1.0)
    values = torch.randint(0, hi + 1, shape, generator=generator, dtype=torch.int64, device=dev)
    mask = torch.rand(shape, generator=generator, dtype=torch.float64, device=dev) < p
    return values.masked_fill(mask, ignored).to(dtype)


def contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _storage_size(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride))


def place(data: torch.Tensor, stride: tuple[int, ...] | None, device: torch.device) -> torch.Tensor:
    """Move ``data`` to ``device`` with the recorded strides when they are valid and non-contiguous.

    Works through a flat storage and ``as_strided`` so that overlapping layouts (expanded
    tensors, stride 0) are reproduced too; where elements alias, they hold equal values anyway.
    """
    shape = tuple(data.shape)
    if (stride is None or len(stride) != len(shape) or data.numel() == 0
            or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in stride)
            or contiguous_stride(shape) == tuple(stride)):
        return data.contiguous().to(device)
    stride = tuple(stride)
    size = _storage_size(shape, stride)
    index = torch.arange(size).as_strided(shape, stride).reshape(-1)
    base = torch.zeros(size, dtype=data.dtype)
    base[index] = data.reshape(-1)
    return base.to(device).as_strided(shape, stride)


# -- whole calls ----------------------------------------------------------------------------------

def split_args(func: torch._ops.OpOverload, values: dict[str, Any], where: str = "record") -> tuple[tuple, dict]:
    """Positional args and kwargs in schema order (kwarg-only arguments, and any argument after
    a skipped one, go to kwargs)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    schema_names = set()
    positional = True
    for a in func._schema.arguments:
        schema_names.add(a.name)
        if a.name not in values:
            positional = False
            continue
        if positional and not a.kwarg_only:
            args.append(values[a.name])
        else:
            kwargs[a.name] = values[a.name]
    extra = [k for k in values if k not in schema_names]
    if extra:
        raise ValueError(f"{where}: arguments {extra} are not in the schema of {func}")
    return tuple(args), kwargs


def named_args(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``split_args`` undone: the call's arguments by their schema names (``self``, ``dim``...)."""
    return {**dict(zip((a.name for a in func._schema.arguments), args)), **kwargs}


def build_call(record: Record, dump: Dump, *, factory: str = "auto", seed: int = 0,
               device: str | torch.device = "cpu") -> tuple[torch._ops.OpOverload, tuple, dict]:
    """(op, args, kwargs) to re-run ``record``; the same seed gives the same inputs on any device."""
    gen = torch.Generator().manual_seed(int(seed))
    return _call(record, lambda v, ignored: materialize_value(v, dump, factory=factory, generator=gen,
                                                               device=device, ignored=ignored))


def rebuild_with(record: Record, tensor: Callable[[TensorMeta], torch.Tensor]) -> tuple[torch._ops.OpOverload, tuple, dict]:
    """(op, args, kwargs) of ``record`` on CPU, each tensor argument made by ``tensor(meta)``."""
    return _call(record, lambda v, ignored: _walk(v, tensor, "cpu"))


def load_tensor(meta: TensorMeta, dump: Dump) -> torch.Tensor:
    """A saved tensor argument as ``build_call`` loads it (checked against its meta, at its stride)."""
    return _tensor(meta, dump, "load", None, torch.device("cpu"))


def check_call(record: Record, dump: Dump, *, factory: str = "auto") -> None:
    """Raise what ``build_call`` would for ``record``, without reading or generating tensor data.

    Lets a caller vet many records cheaply and leave materializing to whoever runs them; only
    faults in the data itself (an unreadable dataset, statistics that random generation rejects)
    are left for ``build_call`` to raise.
    """
    def check(value: Any, ignored: int | None) -> None:
        _check_factory(factory)
        _walk(value, lambda meta: _check_tensor(meta, dump, factory), "cpu")

    _call(record, check)


def _call(record: Record, convert: Callable[[Any, int | None], Any]) -> tuple[torch._ops.OpOverload, tuple, dict]:
    """Resolve ``record``'s op and convert its inputs (each with its ``ignored_index``) in schema
    order (random materialization consumes the generator in that order); errors name the record
    and argument."""
    func = resolve_op(record.op)
    where = f"record seq={record.seq} ({record.op})"
    values = {}
    for a in func._schema.arguments:
        if a.name in record.inputs:
            try:
                values[a.name] = convert(record.inputs[a.name], ignored_index(record.inputs, a.name))
            except MissingTensorError as e:
                raise MissingTensorError(f"{where}, argument {a.name!r}: {e}") from None
            except ValueError as e:
                raise type(e)(f"{where}, argument {a.name!r}: {e}") from None
    for k in record.inputs:
        if k not in values:
            raise ValueError(f"{where}: argument {k!r} is not in the schema of {func}")
    args, kwargs = split_args(func, values, where)
    return func, args, kwargs


# -- outputs against the record ---------------------------------------------------------------------

def _meta_tensor(meta: TensorMeta) -> torch.Tensor:
    dtype = _check_meta(meta)
    stride = meta.stride
    if stride is not None and len(stride) == len(meta.shape) and all(type(s) is int and s >= 0 for s in stride):
        return torch.empty_strided(meta.shape, stride, dtype=dtype, device="meta")
    return torch.empty(meta.shape, dtype=dtype, device="meta")


def predicted_outputs(record: Record) -> list[tuple[tuple[int, ...], str]] | None:
    """(shape, dtype) of each tensor ``record``'s call returns, from torch's meta kernels: its
    arguments as they are written (sizes, repeat counts, expand sizes), without allocating or
    computing anything. None where that cannot be told (no meta kernel, a data-dependent shape)."""
    try:
        func, args, kwargs = _call(record, lambda v, ignored: _walk(v, _meta_tensor, "meta"))
        with torch.no_grad():
            out = func(*args, **kwargs)
    except Exception:  # noqa: BLE001 - no prediction; the call's own checks still apply
        return None
    from torch.utils._pytree import tree_leaves

    return [(tuple(t.shape), dtype_name(t.dtype)) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def output_mismatch(record: Record, outputs: list[tuple[tuple[int, ...], str]] | None = None) -> str | None:
    """Why ``record``'s outputs (``outputs``: (shape, dtype) of each tensor a run returned; by
    default those its meta kernels predict) are not the recorded ones, or None when they agree
    or cannot be told. A dump whose arguments were edited (``torch.ones(4, 4)`` made
    ``size=[14000, 14000]``, a larger repeat count) is caught before it allocates, by the
    record's own output shapes: the bound is what the recording computed."""
    recorded = [(tuple(m.shape), m.dtype.removeprefix("torch.")) for _, m in record.output_tensors()]
    if outputs is None:
        outputs = predicted_outputs(record)
    if outputs is None or not recorded:
        return None
    if len(outputs) != len(recorded):
        return None  # a record may leave outputs out (or hold them in lists): judged pairwise only
    from ..numerics.kernel_families import primary_outputs

    # a kernel's non-primary outputs (saved statistics, workspaces) may be placeholders whose
    # shape the meta kernel does not predict: CPU's eval-mode batch norm saves an empty mean
    primary = primary_outputs(record.op or "")
    for i, ((shape, dtype), (want, want_dtype)) in enumerate(zip(outputs[:primary], recorded[:primary])):
        if shape != want or dtype != want_dtype:
            return (f"its arguments give output {i} as {list(shape)[:8]} {dtype}, the record says "
                    f"{list(want)[:8]} {want_dtype} (an edited size or count?)")
    return None


class OutputMismatchError(ValueError):
    """A record's arguments give outputs of another shape or dtype than it records."""


def check_outputs(record: Record) -> None:
    """Raise OutputMismatchError where ``output_mismatch`` finds one (compare's recomputation and
    xray-gen refuse such a record before running it)."""
    why = output_mismatch(record)
    if why is not None:
        raise OutputMismatchError(f"record seq={record.seq} ({record.op}): {why}")
