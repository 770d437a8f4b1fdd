"""The plain values of a sweep spec: checked (untrusted YAML), then turned into the tensor
metadata and statistics replay's ``random`` input factory draws from. Used by ``sweep``."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..dump.model import Scalar, Stats, TensorMeta, echo
from ..dump.tensorio import dtype_name
from ..record.flatten import flatten_tensors

MAX_ELEMENTS = 1 << 26    # elements of one input tensor or of one module's parameters (256 MiB fp32)
MAX_VALUES = 256          # alternatives of one grid axis
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
DEFAULT_RANGE = (-1.0, 1.0)
POSITIVE_RANGE = (0.1, 2.0)  # log, sqrt, rsqrt, pow with a fractional exponent
DEFAULT_INT_RANGE = (0, 9)
_INPUT_KEYS = ("shapes", "dtype", "range", "positive", "param")
MAX_NODES = 1 << 18        # YAML values of one spec once its aliases are expanded (a billion laughs is 10^9)
_FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")  # YAML 1.1 reads 1e-5 as text


def read_yaml_file(path: str | Path, kind: str, what: str, error: type[Exception], max_bytes: int,
                   missing: str = "") -> Any:
    """A small YAML file a person wrote (a sweep spec, a matrix), read and parsed by ``load_yaml``:
    every way it can be wrong (absent, too large, not UTF-8, not YAML) is ``error`` with one line
    naming the file. ``kind`` names it in the YAML message ("sweep"), ``what`` in the size one
    ("sweep spec"), ``missing`` is appended to "no such ... file"."""
    name, p = str(path), Path(path)
    if not p.is_file():
        raise error(f"{name}: no such {kind} file{missing}")
    if p.stat().st_size > max_bytes:
        raise error(f"{name}: {p.stat().st_size} bytes; a {what} is at most {max_bytes}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{name}: cannot read it as UTF-8 text: {e}") from None
    return parse_yaml(text, name, kind, error)


def parse_yaml(text: str, name: str, kind: str, error: type[Exception]) -> Any:
    """``load_yaml`` of a document named ``name``; a YAML error is ``error`` with one line."""
    import yaml

    try:
        return load_yaml(text)  # safe_load's rules, sized first; never yaml.load: no python/object tags
    except (yaml.YAMLError, RecursionError) as e:
        raise error(f"{name}: not a valid {kind} (YAML): {' '.join(str(e).split())[:300]}") from None


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` with the size of the document checked before it is built.

    safe_load builds an alias as one shared object, so a 600-byte "billion laughs" costs
    nothing to load; but anything that walks or prints it (``str()`` of a value in a message)
    expands it: 9^depth. Its values are counted with every alias expanded, on the composed
    nodes (memoized, so the count itself stays cheap), and more than MAX_NODES is refused."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}

        def expanded(n) -> int:
            got = sizes.get(id(n))
            if got is None:
                if isinstance(n, yaml.SequenceNode):
                    got = 1 + sum(expanded(x) for x in n.value)
                elif isinstance(n, yaml.MappingNode):
                    got = 1 + sum(expanded(k) + expanded(v) for k, v in n.value)
                else:
                    got = 1
                sizes[id(n)] = got = min(got, MAX_NODES + 1)
            return got

        if expanded(node) > MAX_NODES:
            raise yaml.YAMLError(f"more than {MAX_NODES} values once its aliases (*name) are expanded; "
                                 "a sweep spec is a page of YAML")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _alternatives(value: Any, what: str) -> list[Any]:
    """A grid axis: a list of alternatives, or one value as shorthand for a list of one."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError(f"{what}: empty list of values")
    if len(values) > MAX_VALUES:
        raise ValueError(f"{what}: {len(values)} values (limit {MAX_VALUES})")
    return values


def _plain(v: Any, what: str, depth: int = 0) -> Any:
    """Numbers, booleans, short strings, null and lists of them; nothing else from YAML."""
    if v is None or isinstance(v, (bool, int)):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 1 << 62:
            raise ValueError(f"{what}: integer {echo(v)} out of range")
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{what}: {v} is not a finite number")
        return v
    if isinstance(v, str):
        if len(v) > 64:
            raise ValueError(f"{what}: string {echo(v)} is longer than 64 characters")
        return v
    if isinstance(v, list) and depth < 2:
        if len(v) > 64:
            raise ValueError(f"{what}: list of {len(v)} items (limit 64)")
        return [_plain(x, what, depth + 1) for x in v]
    raise ValueError(f"{what}: {echo(v)} is not a plain value (numbers, booleans, strings, null, lists of them)")


def _is_plain(v: Any) -> bool:
    try:
        _plain(v, "default")
        return True
    except ValueError:
        return False


def _number(v: Any, what: str) -> float:
    if isinstance(v, str) and _FLOAT_TEXT.match(v):  # YAML 1.1: "1e-5" without a dot is a string
        return float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{what}: expected a number, got {echo(v)}")
    return float(v) if isinstance(v, float) else v


def _range(v: Any, what: str) -> tuple[float, float]:
    if not (isinstance(v, list) and len(v) == 2):
        raise ValueError(f"{what}: expected [lo, hi], got {echo(v)}")
    lo, hi = (_number(x, what) for x in v)
    if lo > hi:
        raise ValueError(f"{what}: lo {lo} is above hi {hi}")
    return float(lo), float(hi)


def _dtype(v: Any, what: str) -> str:
    if not isinstance(v, str) or v.removeprefix("torch.") not in DTYPES:
        raise ValueError(f"{what}: unknown dtype {echo(v)} (one of {', '.join(DTYPES)})")
    return v.removeprefix("torch.")


def _shape(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > 8 or not all(type(n) is int and 0 <= n for n in v):
        raise ValueError(f"{what}: a shape is a list of at most 8 sizes >= 0, got {echo(v)}")
    if math.prod(v) > MAX_ELEMENTS:
        raise ValueError(f"{what}: shape {v} has {math.prod(v)} elements (limit {MAX_ELEMENTS})")
    return tuple(v)


def _keys(d: Any, allowed: tuple[str, ...], what: str) -> dict:
    if not isinstance(d, dict):
        raise ValueError(f"{what}: expected a mapping, got {type(d).__name__} {echo(d)}")
    for k in d:
        if k not in allowed:
            raise ValueError(f"{what}: unknown key {echo(k)} (allowed: {', '.join(allowed)})")
    return d


@dataclass
class _Input:
    """How one tensor argument is drawn: its shapes (one per case), fixed dtype, value range."""

    shapes: list[Any]  # tuple[int, ...] per case, or list of them for Tensor[] arguments
    dtype: str | None  # None: follows the entry's dtypes grid
    range: tuple[float, float] | None
    param: bool = False  # a model parameter: baked in as a constant, as in an exported model


def _parse_input(value: Any, what: str, is_list: bool, entry_range: tuple[float, float] | None) -> _Input:
    spec = {"shapes": value} if isinstance(value, list) else _keys(value, _INPUT_KEYS, what)
    shapes = spec.get("shapes")
    if not isinstance(shapes, list) or not shapes:
        raise ValueError(f"{what}: expected a list of shapes, e.g. [[64, 128]] (or a mapping with 'shapes')")
    if all(type(n) is int for n in shapes):
        raise ValueError(f"{what}: {echo(shapes)} is one shape; give a list of shapes, e.g. [{shapes}]")
    if len(shapes) > MAX_VALUES:
        raise ValueError(f"{what}: {len(shapes)} shapes (limit {MAX_VALUES})")
    if is_list:
        for s in shapes:
            if not isinstance(s, list) or not s:
                raise ValueError(f"{what}: a tensor-list argument takes a list of shapes per case, got {echo(s)}")
        parsed = [[_shape(x, what) for x in s] for s in shapes]
    else:
        parsed = [_shape(s, what) for s in shapes]
    rng = entry_range
    if "range" in spec:
        rng = _range(spec["range"], f"{what}.range")
    if spec.get("positive") is True:
        rng = POSITIVE_RANGE
    dtype = _dtype(spec["dtype"], f"{what}.dtype") if "dtype" in spec else None
    return _Input(parsed, dtype, rng, param=spec.get("param") is True)


def _meta(shape: tuple[int, ...], dtype: str, rng: tuple[float, float] | None, param: bool) -> TensorMeta:
    """Metadata and statistics from which the ``random`` input factory draws this tensor."""
    dt = getattr(torch, dtype)
    n = math.prod(shape)
    if dt == torch.bool:
        stats = Stats(0.0, 1.0, 0.5, 0.5, numel=n)
    else:
        lo, hi = rng or (DEFAULT_RANGE if dt.is_floating_point else DEFAULT_INT_RANGE)
        stats = Stats(lo, hi, (lo + hi) / 2, (hi - lo) / math.sqrt(12), numel=n)
    from ..ops.rebuild import contiguous_stride

    return TensorMeta(shape, dtype, contiguous_stride(shape), requires_grad=param, stats=stats)


def _on_meta(m: TensorMeta) -> torch.Tensor:
    return torch.empty(m.shape, dtype=getattr(torch, m.dtype), device="meta")


def _output_metas(result: Any) -> list[TensorMeta]:
    """Output metadata of a meta-device call; outputs too large to compare are refused (a small
    input can ask for a huge one: expand, repeat, a size argument)."""
    metas = [TensorMeta(tuple(t.shape), dtype_name(t.dtype)) for t in flatten_tensors(result)]
    for m in metas:
        if m.numel > MAX_ELEMENTS:
            raise ValueError(f"output of shape {list(m.shape)} has {m.numel} elements (limit {MAX_ELEMENTS})")
    return metas


def _fmt(v: Any) -> str:
    if isinstance(v, TensorMeta):
        return "x".join(map(str, v.shape)) or "scalar"
    if isinstance(v, list) and v and all(isinstance(x, TensorMeta) for x in v):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, Scalar):
        return str(v.value)
    return str(v).replace(" ", "")


def _short(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:200]
