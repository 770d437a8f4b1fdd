"""The one data model every xray tool shares: statistics, tensor metadata, values and records.

Recorder, module debugger, generator, replay and compare all speak these classes. Their JSON
form is the dump format (docs/format.md); ``to_json``/``from_json`` are the only place it is
spelled out, so the format cannot drift between tools.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

FORMAT_NAME = "xray-trace"
FORMAT_VERSION = 3  # 2: tensors name their producer ("src"), module records carry "params"; 3: columnar index

# Non-tensor values are stored as tagged JSON objects so that nothing from a dump is ever
# evaluated: readers map each tag to a constructor explicitly (see xray.gen for rendering).
SCALAR_TAGS = ("dtype", "device", "layout", "memory_format", "str", "float", "complex", "symint", "repr")

# Load-time limits: a dump is untrusted input, and every tool holds, prints and renders what it
# reads. Real dumps stay far below these (the longest module path of a 70B model is ~60 chars).
MAX_NAME = 1024        # op names, module paths, dtype/device names, argument names
MAX_TEXT = 65536       # any other string value (stack frames, a str argument)
MAX_DEPTH = 32         # nesting of list values (Tensor[][] is 2)
MAX_ITEMS = 1 << 16    # arguments, outputs, list items, stack frames, module-stack entries
MAX_DIMS = 64          # tensor rank
ECHO = 120             # characters of a bad value that an error message repeats
MAX_NUMEL = (1 << 63) - 1  # elements of one tensor: torch counts them in int64 (an expand reaches it)
MAX_INT = 1 << 63        # sizes, strides and offsets are int64 in torch
MAX_DIGITS = 20          # digits of an integer literal in a file: int64 and uint64 need at most 20

# torch dtype names a tensor may carry (torch 2.6-2.13); anything else is not a dump's.
DTYPE_NAMES = frozenset(
    "float64 float32 float16 bfloat16 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz float8_e8m0fnu "
    "float4_e2m1fn_x2 complex128 complex64 complex32 int64 int32 int16 int8 uint64 uint32 uint16 uint8 bool "
    "qint8 quint8 qint32 quint4x2 quint2x4 bits8 bits16 bits1x8 bits2x4 bits4x2 int1 int2 int3 int4 int5 int6 "
    "int7 uint1 uint2 uint3 uint4 uint5 uint6 uint7".split())


def echo(value: Any) -> str:
    """``repr(value)`` cut to ECHO characters: error messages never repeat a hostile payload."""
    text = repr(value)
    return text if len(text) <= ECHO else f"{text[:ECHO]}... ({len(text)} chars)"


def printable(text: str, keep: str = "") -> str:
    """``text`` as a terminal, a CSV or a web page may show it: every character Python does not
    call printable (C0/C1 controls such as ESC, which starts ANSI and OSC sequences; the bidi
    overrides and isolates U+202A-U+202E, U+2066-U+2069; other format characters; line
    separators) becomes its backslash escape as ``repr`` spells it; ``keep`` names characters
    left as they are (a report's own newlines). Idempotent: an escape is printable text."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def fit_name(text: str) -> str:
    """``text`` as a writer records a name (a module path, a class name) so that the reader
    accepts it: at most MAX_NAME characters, the one limit both sides share. A longer name keeps
    its head and a digest of the whole, so two long paths with one head stay apart and every
    run cuts a path the same way (a compare still pairs them)."""
    if len(text) <= MAX_NAME:
        return text
    import hashlib

    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{text[:MAX_NAME - 17]}~{digest}"


def _bounded_int(text: str) -> int:
    if len(text) > MAX_DIGITS + 1:  # a sign and 20 digits
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (limit {MAX_DIGITS}): {text[:20]}...")
    return int(text)


def parse_json(text: str | bytes) -> Any:
    """``json.loads`` for every JSON a file gives xray: an integer literal longer than any int64 or
    uint64 (a 5001-digit format_version, a shape of [10**400]) is a JSONDecodeError, as any
    other damage is, instead of a ValueError or OverflowError far from the file. Floats need no
    bound: a float literal of any length parses to a float (inf at worst)."""
    try:
        return json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # the hook's (json gives no position for it)
        raise json.JSONDecodeError(str(e), text if isinstance(text, str) else "", 0) from None


def _int(v: Any, what: str, lo: int = 0) -> int:
    if type(v) is not int or v < lo or v >= MAX_INT:
        raise ValueError(f"{what} must be an int64 >= {lo}, got {echo(v)}")
    return v


def _str(v: Any, what: str, limit: int = MAX_NAME) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what} must be a string, got {type(v).__name__} {echo(v)}")
    if len(v) > limit:
        raise ValueError(f"{what} is {len(v)} characters long (limit {limit}): {echo(v)}")
    return v


def _opt_str(v: Any, what: str, limit: int = MAX_NAME) -> str | None:
    return None if v is None else _str(v, what, limit)


def _list(v: Any, what: str) -> list:
    if not isinstance(v, list):
        raise ValueError(f"{what} must be a list, got {type(v).__name__} {echo(v)}")
    if len(v) > MAX_ITEMS:
        raise ValueError(f"{what} has {len(v)} items (limit {MAX_ITEMS})")
    return v


def _dict(v: Any, what: str) -> dict:
    if not isinstance(v, dict):
        raise ValueError(f"{what} must be an object, got {type(v).__name__} {echo(v)}")
    if len(v) > MAX_ITEMS:
        raise ValueError(f"{what} has {len(v)} entries (limit {MAX_ITEMS})")
    return v


def _ints(v: Any, what: str) -> tuple[int, ...]:
    items = _list(v, what)
    if len(items) > MAX_DIMS:
        raise ValueError(f"{what} has {len(items)} dimensions (limit {MAX_DIMS})")
    for x in items:
        if type(x) is not int or not -MAX_INT <= x < MAX_INT:
            raise ValueError(f"{what} must hold int64 integers, got {echo(x)}")
    return tuple(items)


def encode_float(x: float) -> Any:
    """JSON has no NaN/Inf: encode them as strings, keep finite floats as numbers."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def decode_float(x: Any) -> float | None:
    if x is None:
        return None
    if isinstance(x, str):
        if x not in ("nan", "inf", "-inf"):
            raise ValueError(f"not a float: {echo(x)}")
        return float(x)
    return float(x)


@dataclass
class Stats:
    """Data-range statistics of one tensor.

    min/max/mean/std are taken over the *finite* elements only, so a single NaN does not hide
    the range of everything else; the non-finite elements are counted separately. ``None``
    means there was no finite element (or the tensor was empty).
    """

    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    numel: int = 0
    # The tensor's sample (xray/dump/samples.py): its values at positions drawn from the shape
    # alone, float64, NaN/Inf included; None when not recorded. Taken with the statistics and
    # cached with them; in JSON it is the tensor's "sample" key (TensorMeta.sample). Left out of
    # ==, as the statistics of two runs are compared by tools, not by equality.
    sample: tuple[float, ...] | None = field(default=None, compare=False)
    # A checked op's self-check (xray/record/self_check.py: a matmul's, convolution's, sum's,
    # layer norm backward's or fused attention's): its normwise error against its own inputs,
    # then each precision step's (NaN: not measured);
    # CHECK_SIZE values, or None. In JSON the tensor's "check" key.
    check: tuple[float, ...] | None = field(default=None, compare=False)

    @property
    def inf(self) -> int:
        return self.posinf + self.neginf

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0

    def to_json(self) -> dict:
        return {
            "min": None if self.min is None else encode_float(self.min),
            "max": None if self.max is None else encode_float(self.max),
            "mean": None if self.mean is None else encode_float(self.mean),
            "std": None if self.std is None else encode_float(self.std),
            "nan": self.nan,
            "posinf": self.posinf,
            "neginf": self.neginf,
            "numel": self.numel,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Stats":
        _dict(d, "stats")
        return cls(
            min=_opt_float(d.get("min")),
            max=_opt_float(d.get("max")),
            mean=_opt_float(d.get("mean")),
            std=_opt_float(d.get("std")),
            nan=_int(d.get("nan", 0), "stats.nan"),
            posinf=_int(d.get("posinf", 0), "stats.posinf"),
            neginf=_int(d.get("neginf", 0), "stats.neginf"),
            numel=_int(d.get("numel", 0), "stats.numel"),
        )


SAMPLE_SIZE = 32  # values per tensor sample at most (xray/dump/samples.py; the index's sample_size)
CHECK_SIZE = 3  # a self-check's values: the residual, then the "tf32/fp16" and "bf16" steps'


def _check(v: Any) -> tuple[float, ...]:
    """A tensor's JSON "check": CHECK_SIZE numbers (non-finite ones as the format's strings)."""
    items = _list(v, "tensor check")
    if len(items) != CHECK_SIZE:
        raise ValueError(f"tensor check has {len(items)} values (it has {CHECK_SIZE})")
    if any(type(x) is bool or not isinstance(x, (int, float, str)) for x in items):
        raise ValueError(f"a check value must be a number, got {echo(items)}")
    return tuple(decode_float(x) for x in items)


def _sample(v: Any, limit: int) -> tuple[float, ...]:
    """A tensor's JSON "sample": a list of at most ``limit`` numbers (non-finite ones as the
    format's strings)."""
    items = _list(v, "tensor sample")
    if len(items) > limit:
        raise ValueError(f"tensor sample has {len(items)} values (at most {limit}: min(numel, {SAMPLE_SIZE}))")
    out = []
    for x in items:
        if type(x) is bool or not isinstance(x, (int, float, str)):
            raise ValueError(f"a sample value must be a number, got {echo(x)}")
        out.append(decode_float(x))
    return tuple(out)


def _opt_float(x: Any) -> float | None:
    # Hot in the reader: plain JSON numbers skip decode_float's checks.
    if type(x) is float or type(x) is int:
        return float(x)
    if x is not None and not isinstance(x, str):
        raise ValueError(f"a statistic must be a number, got {echo(x)}")
    return decode_float(x)


# The note of a tensor recorded while (part of) its memory was never written since it was
# allocated (``empty``, ``new_empty``, an ``out=`` buffer before the call): its values are not
# data, so it has no statistics and compare skips it (xray/record/unwritten.py; docs/format.md).
UNWRITTEN = "uninitialised memory: not yet written"


def unwritten(meta: "TensorMeta | None") -> bool:
    """Whether ``meta`` was recorded as uninitialised memory (the ``UNWRITTEN`` note)."""
    return meta is not None and (meta.note or "").startswith(UNWRITTEN)


@dataclass
class TensorMeta:
    """Everything recorded about one tensor argument or result (never the tensor itself)."""

    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    stride: tuple[int, ...] | None = None
    storage_offset: int = 0
    device: str = "cpu"
    requires_grad: bool = False
    stats: Stats | None = None
    data: str | None = None  # "<file relative to the dump folder>:<dataset path>" when saved
    # Where the value came from (format v2; None in v1 dumps): "op:<seq>:<output index>",
    # "param:<qualified name>", "buffer:<qualified name>" or "input". See Source.
    source: str | None = None
    # Why this tensor has no statistics or data (a meta, nested or quantized tensor...).
    note: str | None = None
    # A DTensor: where this rank's local shard (what shape, statistics and data describe) sits
    # in the global tensor. None for a plain tensor.
    sharding: "Sharding | None" = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def sample(self) -> tuple[float, ...] | None:
        """The recorded sample of this tensor (docs/format.md, "Samples"): its values at the
        positions ``xray.dump.samples.positions(shape)``, in that order; None when absent. It
        travels with the statistics (no statistics, no sample)."""
        return None if self.stats is None else self.stats.sample

    @property
    def check(self) -> tuple[float, ...] | None:
        """A checked op's recorded self-check (Stats.check), or None."""
        return None if self.stats is None else self.stats.check

    @sample.setter
    def sample(self, values: tuple[float, ...] | None) -> None:
        if self.stats is None:
            if values:
                raise ValueError("a tensor without statistics has no sample")
            return
        self.stats.sample = None if not values else tuple(float(v) for v in values)

    def to_json(self) -> dict:
        d: dict[str, Any] = {"t": "tensor", "shape": list(self.shape), "dtype": self.dtype}
        if self.stride is not None:
            d["stride"] = list(self.stride)
        if self.storage_offset:
            d["offset"] = self.storage_offset
        d["device"] = self.device
        if self.requires_grad:
            d["requires_grad"] = True
        if self.stats is not None:
            d["stats"] = self.stats.to_json()
            if self.stats.sample:
                d["sample"] = [encode_float(v) for v in self.stats.sample]
            if self.stats.check:
                d["check"] = [encode_float(v) for v in self.stats.check]
        if self.data is not None:
            d["data"] = self.data
        if self.source is not None:
            d["src"] = self.source
        if self.note is not None:
            d["note"] = self.note
        if self.sharding is not None:
            d["sharding"] = self.sharding.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TensorMeta":
        _dict(d, "tensor")
        stride = d.get("stride")
        shape = _ints(d.get("shape"), "tensor shape")
        if any(n < 0 for n in shape):
            raise ValueError(f"tensor shape has a negative size: {echo(list(shape))}")
        if math.prod(shape) > MAX_NUMEL:
            raise ValueError(f"tensor shape {echo(list(shape))} has more than 2**63-1 elements")
        dtype = _str(d.get("dtype"), "tensor dtype")
        if dtype.removeprefix("torch.") not in DTYPE_NAMES:
            raise ValueError(f"unknown tensor dtype {echo(dtype)}")
        stats = Stats.from_json(d["stats"]) if d.get("stats") is not None else None
        if d.get("sample") is not None:
            if stats is None:
                raise ValueError("tensor sample without statistics")
            stats.sample = _sample(d["sample"], min(math.prod(shape), SAMPLE_SIZE)) or None
        if d.get("check") is not None:
            if stats is None:
                raise ValueError("tensor check without statistics")
            stats.check = _check(d["check"])
        return cls(
            shape=shape,
            dtype=dtype,
            stride=None if stride is None else _ints(stride, "tensor stride"),
            storage_offset=_int(d.get("offset", 0), "tensor offset"),
            device=_str(d.get("device", "cpu"), "tensor device"),
            requires_grad=bool(d.get("requires_grad", False)),
            stats=stats,
            data=_opt_str(d.get("data"), "tensor data reference"),
            source=_opt_str(d.get("src"), "tensor source", MAX_TEXT),
            note=_opt_str(d.get("note"), "tensor note"),
            sharding=None if d.get("sharding") is None else Sharding.from_json(d["sharding"]),
        )


@dataclass(frozen=True)
class Sharding:
    """How a DTensor's local shard sits in its global tensor, as this rank saw it
    (docs/format.md, "Sharded tensors"). Placements are written as DTensor prints them per
    mesh dimension: ``S(<dim>)`` sharded, ``R`` replicated, ``P(<op>)`` partial (pending a
    reduction: each rank holds a term)."""

    placements: tuple[str, ...]
    mesh: tuple[int, ...]  # the device mesh's shape
    coordinate: tuple[int, ...]  # this rank's place in the mesh
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]  # where the local shard starts in the global tensor, per dim
    mesh_dims: tuple[str, ...] | None = None  # the mesh's dimension names, when it has them

    def to_json(self) -> dict:
        d: dict[str, Any] = {"placements": list(self.placements), "mesh": list(self.mesh),
                             "coordinate": list(self.coordinate), "global_shape": list(self.global_shape),
                             "global_offset": list(self.global_offset)}
        if self.mesh_dims is not None:
            d["mesh_dims"] = list(self.mesh_dims)
        return d

    @classmethod
    def from_json(cls, d: Any) -> "Sharding":
        _dict(d, "tensor sharding")
        placements = tuple(_str(p, "placement") for p in _list(d.get("placements"), "placements"))
        mesh = _ints(d.get("mesh"), "sharding mesh")
        coordinate = _ints(d.get("coordinate"), "sharding coordinate")
        shape = _ints(d.get("global_shape"), "sharding global_shape")
        offset = _ints(d.get("global_offset"), "sharding global_offset")
        dims = d.get("mesh_dims")
        if len(placements) != len(mesh) or len(coordinate) != len(mesh) or len(offset) != len(shape):
            raise ValueError(f"tensor sharding is inconsistent: {echo(d)}")
        if any(n < 0 for n in shape + offset + coordinate) or any(n < 1 for n in mesh) or math.prod(shape) > MAX_NUMEL:
            raise ValueError(f"tensor sharding out of range: {echo(d)}")
        return cls(placements, mesh, coordinate, shape, offset,
                   None if dims is None else tuple(_str(x, "mesh dim name") for x in _list(dims, "mesh_dims")))


@dataclass(frozen=True)
class Source:
    """A parsed ``TensorMeta.source``: the data edge a value arrived on.

    kind "op": produced by output ``index`` of the call with sequence number ``seq`` in the
    same run (the record may be absent when de-duplication folded that call into an earlier
    one); "param" / "buffer": the module state ``name``; "input": it existed before recording
    or came from outside it (model inputs, tensors built before begin_dump).
    """

    kind: str
    seq: int | None = None
    index: int | None = None
    name: str | None = None

    def __str__(self) -> str:
        if self.kind == "op":
            return f"op:{self.seq}:{self.index}"
        return self.kind if self.name is None else f"{self.kind}:{self.name}"

    @classmethod
    def parse(cls, text: str | None) -> "Source | None":
        """None for None (a v1 dump); ValueError for text that is not a source."""
        if text is None:
            return None
        kind, _, rest = text.partition(":")
        if kind == "op":
            seq, _, index = rest.partition(":")
            if not (seq.isdigit() and index.isdigit()):
                raise ValueError(f"bad op source {text[:80]!r}")
            return cls("op", seq=int(seq), index=int(index))
        if kind in ("param", "buffer") and rest:
            return cls(kind, name=rest)
        if kind == "input" and not rest:
            return cls("input")
        raise ValueError(f"unknown source {text[:80]!r}")


def source_of(meta: Any) -> "Source | None":
    """Where a tensor's value came from (its ``source``), or None when unrecorded or unreadable."""
    try:
        return Source.parse(getattr(meta, "source", None))
    except ValueError:
        return None


@dataclass(frozen=True)
class Scalar:
    """A tagged non-tensor value (dtype, device, string, non-finite float, SymInt...)."""

    tag: str
    value: Any

    def to_json(self) -> dict:
        # JSON has no NaN/Inf: a non-finite float travels as "nan"/"inf"/"-inf" (docs/format.md)
        return {"t": self.tag, "v": encode_float(self.value) if self.tag == "float" else self.value}


def value_to_json(v: Any) -> Any:
    """Encode a decoded value (TensorMeta, Scalar, list, plain scalar) as JSON."""
    if isinstance(v, (TensorMeta, Scalar)):
        return v.to_json()
    if isinstance(v, float):
        return v if math.isfinite(v) else Scalar("float", v).to_json()
    if isinstance(v, (list, tuple)):
        return [value_to_json(x) for x in v]
    return v


def value_from_json(v: Any, depth: int = 0) -> Any:
    """Decode a JSON value of a record argument; unknown tags, over-long strings and lists
    nested deeper than MAX_DEPTH raise ValueError."""
    if isinstance(v, dict):
        tag = v.get("t")
        if tag == "tensor":
            return TensorMeta.from_json(v)
        if tag == "float":
            return Scalar("float", decode_float(v.get("v")))
        if tag in SCALAR_TAGS:
            inner = v.get("v")
            if isinstance(inner, str):
                _str(inner, f"{tag} value", MAX_TEXT)
            elif isinstance(inner, (list, dict)):
                _check_plain(inner, depth + 1)
            return Scalar(tag, inner)
        raise ValueError(f"unknown value tag {echo(tag)}")
    if isinstance(v, list):
        if depth >= MAX_DEPTH:
            raise ValueError(f"lists nested deeper than {MAX_DEPTH} levels")
        return [value_from_json(x, depth + 1) for x in _list(v, "list value")]
    if isinstance(v, str):
        return _str(v, "string value", MAX_TEXT)
    if v is None or isinstance(v, (bool, int, float)):
        return v
    raise ValueError(f"unsupported value {echo(v)}")


def _check_plain(v: Any, depth: int) -> None:
    """A tagged scalar's payload (a symint's hint dict, a complex pair): bounded plain JSON."""
    if depth >= MAX_DEPTH:
        raise ValueError(f"values nested deeper than {MAX_DEPTH} levels")
    items = _dict(v, "value").values() if isinstance(v, dict) else _list(v, "value")
    for x in items:
        if isinstance(x, (list, dict)):
            _check_plain(x, depth + 1)
        elif isinstance(x, str):
            _str(x, "string value", MAX_TEXT)


def iter_tensors(v: Any, prefix: str) -> Iterator[tuple[str, TensorMeta]]:
    """Yield (name, meta) for every tensor in a value, naming list items ``prefix.i``."""
    if isinstance(v, TensorMeta):
        yield prefix, v
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from iter_tensors(x, f"{prefix}.{i}")


def record_name(kind: str, module: str | None, op: str, seq: int, call_index: int, direction: str) -> str:
    """``Record.name`` from its parts (tools that read columns name rows without a Record):
    ``<module>/<op>#<seq>`` for an op, ``<module>.<class>.<call index>.<direction>`` for a module."""
    where = module or "<root>"
    if kind == "module":
        return f"{where}.{op}.{call_index}.{direction}"
    return f"{where}/{op}#{seq}"


@dataclass
class Record:
    """One recorded event: an ATen operator call (kind "op") or an nn.Module call ("module").

    ``module`` is the dotted path of the innermost module the event ran in (or the module
    itself for kind "module"); ``module_stack`` lists (path, class name) pairs outermost first.
    With de-duplication, ``count`` calls shared this signature; ``seq`` is the first of them.
    """

    seq: int
    kind: str  # "op" | "module"
    op: str  # "aten.add.Tensor", or the module class name for kind "module"
    direction: str = "forward"  # "forward" | "backward"
    module: str | None = None
    module_stack: list[tuple[str, str]] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: list[Any] = field(default_factory=list)
    mutates: list[str] = field(default_factory=list)
    count: int = 1
    first_seq: int | None = None
    last_seq: int | None = None
    stack: list[str] | None = None
    call_index: int = 0  # for modules: how many times this module path ran before
    step: int | None = None  # training step, for module-level dumps (PrecisionDebugger)
    # Module dumps: input key -> the keyword argument its tensor came from ("forward_input.3" ->
    # "position_embeddings"); absent keys were positional. (Trace module records need none:
    # they name keyword inputs "<kwarg>.<i>".)
    keywords: dict[str, str] = field(default_factory=dict)
    # Module records (format v2): the module's own parameters and buffers used by this call,
    # by name relative to the module ("weight"); never counted among ``inputs``.
    params: dict[str, "TensorMeta"] = field(default_factory=dict)
    # A call on DTensors: how many records its own kernels made (its redistributions'
    # collectives, the local ops on the shards), the records just before it (docs/format.md,
    # "Sharded tensors"); 0 for every other record.
    kernels: int = 0

    @property
    def name(self) -> str:
        """A readable, mostly-unique name: module path, op and call index."""
        return record_name(self.kind, self.module, self.op, self.seq, self.call_index, self.direction)

    def input_tensors(self) -> Iterator[tuple[str, TensorMeta]]:
        for k, v in self.inputs.items():
            yield from iter_tensors(v, k)

    def output_tensors(self) -> Iterator[tuple[str, TensorMeta]]:
        for i, v in enumerate(self.outputs):
            yield from iter_tensors(v, f"out{i}")

    def to_json(self) -> dict:
        d: dict[str, Any] = {"seq": self.seq, "kind": self.kind, "op": self.op, "direction": self.direction}
        if self.module is not None:
            d["module"] = self.module
        if self.module_stack:
            d["module_stack"] = [list(p) for p in self.module_stack]
        d["inputs"] = {k: value_to_json(v) for k, v in self.inputs.items()}
        d["outputs"] = [value_to_json(v) for v in self.outputs]
        if self.mutates:
            d["mutates"] = list(self.mutates)
        d["count"] = self.count
        d["first_seq"] = self.seq if self.first_seq is None else self.first_seq
        d["last_seq"] = self.seq if self.last_seq is None else self.last_seq
        if self.stack:
            d["stack"] = list(self.stack)
        if self.kind == "module":
            d["call_index"] = self.call_index
        if self.step is not None:
            d["step"] = self.step
        if self.keywords:
            d["keywords"] = dict(self.keywords)
        if self.params:
            d["params"] = {k: v.to_json() for k, v in self.params.items()}
        if self.kernels:
            d["kernels"] = self.kernels
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Record":
        _dict(d, "record")
        kind = d.get("kind")
        if kind not in ("op", "module"):
            raise ValueError(f"kind must be 'op' or 'module', got {echo(kind)}")
        direction = d.get("direction", "forward")
        if direction not in ("forward", "backward"):
            raise ValueError(f"direction must be 'forward' or 'backward', got {echo(direction)}")
        stack = d.get("stack")
        first, last, step = d.get("first_seq"), d.get("last_seq"), d.get("step")
        return cls(
            seq=_int(d.get("seq"), "seq"),
            kind=kind,
            op=_str(d.get("op"), "op"),
            direction=direction,
            module=_opt_str(d.get("module"), "module"),
            module_stack=[_frame(p) for p in _list(d.get("module_stack", []), "module_stack")],
            inputs={_str(k, "input name"): value_from_json(v)
                    for k, v in _dict(d.get("inputs", {}), "inputs").items()},
            outputs=[value_from_json(v) for v in _list(d.get("outputs", []), "outputs")],
            mutates=[_str(m, "mutated argument") for m in _list(d.get("mutates", []), "mutates")],
            count=_int(d.get("count", 1), "count", lo=1),
            first_seq=None if first is None else _int(first, "first_seq"),
            last_seq=None if last is None else _int(last, "last_seq"),
            stack=None if stack is None else [_str(x, "stack frame", MAX_TEXT) for x in _list(stack, "stack")],
            call_index=_int(d.get("call_index", 0), "call_index"),
            step=None if step is None else _int(step, "step"),
            keywords={_str(k, "keyword key"): _str(v, "keyword")
                      for k, v in _dict(d.get("keywords") or {}, "keywords").items()},
            params={_str(k, "parameter name"): TensorMeta.from_json(v)
                    for k, v in _dict(d.get("params") or {}, "params").items()},
            kernels=_int(d.get("kernels", 0), "kernels"),
        )


def _frame(p: Any) -> tuple[str, str]:
    """One module_stack entry: [path, class name]."""
    if not isinstance(p, list) or len(p) != 2:
        raise ValueError(f"module_stack entries must be [path, class] pairs, got {echo(p)}")
    return _str(p[0], "module_stack path"), _str(p[1], "module_stack class")


def shape_only(v: Any, note: str | None = None) -> Any:
    """A recorded value (a TensorMeta, or a list of them) with its shape and dtype only, ``note``
    saying why: what another run held there is unknown. Anything else is returned as it is."""
    if isinstance(v, list):
        return [shape_only(x, note) for x in v]
    if isinstance(v, TensorMeta):
        return TensorMeta(v.shape, v.dtype, v.stride, 0, v.device, source=v.source, note=note)
    return v
