"""Read a mindstudio-probe (msprobe) PyTorch dump as an xray ``Dump``.

msprobe writes ``<dump_path>/step<N>/<proc<pid>|rank<r>>/`` holding ``dump.json`` (one entry per
API or module call, in execution order, with Max/Min/Mean/Norm statistics), ``construct.json``
(each call's enclosing module), ``stack.json`` and, in tensor mode, ``dump_tensor_data/*.pt``.
Levels: L0 module calls (``Module.<path>.<Class>.<forward|backward>.<call>`` and
``Module.<path>.<Class>.parameters_grad.<call>``), L1 API calls
(``<Functional|Tensor|Torch|...>.<api>.<call>.<forward|backward>``), mix both.

Mapping: a module call is a ``module`` record (op = class, module = path) as PrecisionDebugger's
own dumps have, so an msprobe L0 run compares with an xray module-level run; an API call is an
``op`` record named by msprobe's API name (``Functional.linear``), its module taken from
construct.json. msprobe keeps no std and no NaN/Inf counts: std is derived from Norm and Mean
(population std), and a non-finite Max/Min/Mean marks the tensor non-finite with a count of 1
("at least one"). A dump is untrusted: sizes are capped as for xray's own dumps, tensor files
must be plain names inside ``dump_tensor_data``, and ``.pt`` files are read with
``torch.load(weights_only=True)`` (torch's restricted unpickler: tensors only).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

import torch

from .errors import DumpFormatError
from .model import DTYPE_NAMES, MAX_ITEMS, MAX_NAME, Record, Scalar, Stats, TensorMeta, echo

FORMAT_NAME = "msprobe"
#: the module-level xray format whose records an msprobe L0 dump shares (compare pairs them)
COMPARABLE_WITH = ("xray-module",)
_DATA_DIR = "dump_tensor_data"
_SNIFF_BYTES = 4096
_MAX_INDEX_BYTES = 4 << 30


def is_msprobe_dump(folder: Path) -> bool:
    """A ``dump.json`` that opens with msprobe's header keys (task, level, framework)."""
    index = folder / "dump.json"
    try:
        with open(index, "rb") as f:
            head = f.read(_SNIFF_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    return '"task"' in head and '"level"' in head and '"data"' in head and '"format"' not in head.split('"data"')[0]


def read_msprobe_dump(folder: Path) -> "MsprobeDump":
    index = folder / "dump.json"
    if index.stat().st_size > _MAX_INDEX_BYTES:
        raise DumpFormatError(f"{index}: {index.stat().st_size} bytes, larger than any msprobe index xray reads")
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise DumpFormatError(f"{index}: corrupt msprobe dump.json ({str(e)[:200]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
        raise DumpFormatError(f"{index}: not an msprobe dump (no 'data' object)")
    if data.get("framework", "pytorch") != "pytorch":
        raise DumpFormatError(f"{index}: an msprobe {echo(data.get('framework'))} dump; xray reads PyTorch ones")
    parents = _read_optional(folder / "construct.json")
    step = folder.parent.name.removeprefix("step")
    try:
        records = _merge_param_grads(list(_records(data["data"], parents if isinstance(parents, dict) else {})))
    except ValueError as e:
        raise DumpFormatError(f"{index}: {e}") from None
    for r in records:
        r.step = int(step) if step.isdigit() else None
    header = {"format": FORMAT_NAME, "format_version": None, "task": data.get("task"), "level": data.get("level"),
              "framework": "pytorch", "tool": "mindstudio-probe"}
    return MsprobeDump(folder, header, records)


def _read_optional(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def split_name(key: str) -> tuple[str, str, str, str, int]:
    """msprobe's call name -> (kind, module path, op, direction, call index)."""
    if not isinstance(key, str) or len(key) > MAX_NAME:
        raise ValueError(f"bad call name {echo(key)}")
    parts = key.split(".")
    if parts[0] == "Module" and len(parts) >= 5:
        if parts[-2] == "parameters_grad" and parts[-1].isdigit():  # Module.<path>.<Class>.parameters_grad.<n>
            return "module", ".".join(parts[1:-3]), parts[-3] + ".parameters_grad", "backward", int(parts[-1])
        if parts[-2] in ("forward", "backward") and parts[-1].isdigit():  # Module.<path>.<Class>.<dir>.<n>
            return "module", ".".join(parts[1:-3]), parts[-3], parts[-2], int(parts[-1])
    if len(parts) >= 4 and parts[-1] in ("forward", "backward") and parts[-2].isdigit():  # <api>.<n>.<dir>
        return "op", "", ".".join(parts[:-2]), parts[-1], int(parts[-2])
    raise ValueError(f"call name {echo(key)} is neither Module.<path>.<Class>.<dir>.<n> nor <api>.<n>.<dir>")


def _records(data: dict, parents: dict) -> Iterator[Record]:
    if len(data) > MAX_ITEMS * 64:
        raise ValueError(f"{len(data)} calls (limit {MAX_ITEMS * 64})")
    for seq, (key, entry) in enumerate(data.items()):
        kind, path, op, direction, call = split_name(key)
        if not isinstance(entry, dict):
            raise ValueError(f"{key}: entry must be an object, got {echo(entry)}")
        if kind == "op":
            parent = parents.get(key)
            path = split_name(parent)[1] if isinstance(parent, str) and parent.startswith("Module.") else None
        rec = Record(seq=seq, kind=kind, op=op, direction=direction, module=path, call_index=call)
        if op.endswith(".parameters_grad"):  # {param name: [grad]}: the grads are the call's outputs
            rec.inputs = {str(k)[:MAX_NAME]: None for k in entry}  # the names, for _merge_param_grads
            rec.outputs = [_value(v[0] if isinstance(v, list) and v else v, f"{key}.{k}") for k, v in entry.items()]
        elif direction == "forward":
            for i, v in enumerate(_items(entry.get("input_args"), key)):
                rec.inputs[f"forward_input.{i}"] = _value(v, key)
            kwargs = entry.get("input_kwargs") or {}
            for k, v in (kwargs.items() if isinstance(kwargs, dict) else ()):
                rec.inputs[str(k)[:MAX_NAME]] = _value(v, key)
            rec.outputs = [_value(v, key) for v in _items(entry.get("output"), key)]
            params = entry.get("parameters") or {}
            for k, v in (params.items() if isinstance(params, dict) else ()):
                meta = _value(v, key)
                if isinstance(meta, TensorMeta):
                    rec.params[str(k)[:MAX_NAME]] = meta
        else:
            for i, v in enumerate(_items(entry.get("input"), key)):
                rec.inputs[f"backward_input.{i}"] = _value(v, key)
            rec.outputs = [_value(v, key) for v in _items(entry.get("output"), key)]
        yield rec


def _merge_param_grads(records: list[Record]) -> list[Record]:
    """A module's ``parameters_grad`` entry becomes its backward call's ``params_grad.<name>``
    inputs, as in xray's module dumps; one with no backward record stays a record of its own."""
    backward = {(r.module, r.op, r.call_index): r for r in records if r.kind == "module" and r.direction == "backward"}
    out = []
    for r in records:
        owner = backward.get((r.module, r.op.removesuffix(".parameters_grad"), r.call_index))
        if r.op.endswith(".parameters_grad") and owner is not None:
            owner.inputs.update((f"params_grad.{k}", v) for k, v in zip(r.inputs, r.outputs))
        else:
            out.append(r)
    for seq, r in enumerate(out):
        r.seq = seq
    return out


def _items(v: Any, key: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        return [v]
    if len(v) > MAX_ITEMS:
        raise ValueError(f"{key}: {len(v)} values (limit {MAX_ITEMS})")
    return v


def _value(v: Any, key: str, depth: int = 0) -> Any:
    """One msprobe value -> TensorMeta, a plain scalar, a list, or a tagged repr."""
    if depth > 32:
        raise ValueError(f"{key}: values nested deeper than 32 levels")
    if isinstance(v, list):
        return [_value(x, key, depth + 1) for x in _items(v, key)]
    if not isinstance(v, dict):
        return None
    if v.get("type") == "torch.Tensor":
        return _tensor(v, key)
    value = v.get("value")
    if value is None or isinstance(value, (bool, int, str)) or isinstance(value, float) and math.isfinite(value):
        return value if not isinstance(value, str) else value[:MAX_NAME]
    return Scalar("repr", echo(value))


def _tensor(v: dict, key: str) -> TensorMeta:
    dtype = str(v.get("dtype", "")).removeprefix("torch.")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"{key}: unknown tensor dtype {echo(v.get('dtype'))}")
    shape = v.get("shape")
    if not isinstance(shape, list) or len(shape) > 64 or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"{key}: bad tensor shape {echo(shape)}")
    numel = math.prod(shape)
    data = v.get("data_name")
    if data is not None:
        if not isinstance(data, str) or "/" in data or "\\" in data or data in ("", ".", "..") or len(data) > MAX_NAME:
            raise ValueError(f"{key}: tensor file name {echo(data)} is not a plain file name")
        data = f"{_DATA_DIR}/{data}"
    return TensorMeta(shape=tuple(shape), dtype=dtype, requires_grad=bool(v.get("requires_grad", False)),
                      stats=_stats(v, numel), data=data)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and x.lower() in ("nan", "inf", "-inf", "+inf"):
        return float(x)
    return None


def _stats(v: dict, numel: int) -> Stats | None:
    mx, mn, mean, norm = (_num(v.get(k)) for k in ("Max", "Min", "Mean", "Norm"))
    if mx is None and mn is None and mean is None:
        return None
    values = [x for x in (mx, mn, mean, norm) if x is not None]
    nan = int(any(math.isnan(x) for x in values))
    posinf = int(mx is not None and mx == math.inf)
    neginf = int(mn is not None and mn == -math.inf)
    finite = not (nan or posinf or neginf)
    std = None
    if finite and numel and norm is not None and mean is not None:
        std = math.sqrt(max(norm * norm / numel - mean * mean, 0.0))
    return Stats(min=mn if finite else None, max=mx if finite else None, mean=mean if finite else None, std=std,
                 nan=nan, posinf=posinf, neginf=neginf, numel=numel)


class MsprobeDump:
    """An msprobe dump folder with the ``Dump`` protocol: records in execution order, tensors
    on demand (tensor mode)."""

    format = FORMAT_NAME
    comparable_with = COMPARABLE_WITH

    def __init__(self, folder: Path, header: dict[str, Any], records: list[Record]) -> None:
        self.folder = folder
        self.header = header
        self.complete = True  # msprobe writes dump.json whole at stop()/step()
        self._records = records

    @property
    def records(self) -> list[Record]:
        return self._records

    def __iter__(self):
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return (f"MsprobeDump({str(self.folder)!r}, task {self.header.get('task')}, level {self.header.get('level')},"
                f" {len(self._records)} calls)")

    def _path(self, meta: TensorMeta | str) -> Path:
        ref = meta if isinstance(meta, str) else meta.data
        if not ref:
            raise KeyError("this tensor's data was not saved (an msprobe statistics dump: use task 'tensor')")
        return self.folder / ref

    def has_data(self, meta: TensorMeta) -> bool:
        return meta.data is not None and self._path(meta).is_file()

    def load_tensor(self, meta: TensorMeta | str) -> torch.Tensor:
        path = self._path(meta)
        if not path.is_file():
            raise KeyError(f"{path}: no saved tensor (deleted, or the dump was cut short)")
        try:
            t = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is one clear error
            raise DumpFormatError(f"{path}: not a tensor file torch.load(weights_only=True) reads ({e})") from None
        if not isinstance(t, torch.Tensor):
            raise DumpFormatError(f"{path}: holds a {type(t).__name__}, not a tensor")
        return t

    def close(self) -> None:
        pass

    def __enter__(self) -> "MsprobeDump":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
