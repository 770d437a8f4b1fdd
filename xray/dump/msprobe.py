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
construct.json. msprobe writes a call when it ends (a decoder layer after the modules inside it);
xray's records are in the order calls begin, so each call is put before the first call inside it
(construct.json names every call's enclosing call): compare then pairs module for module.
msprobe keeps no std and no NaN/Inf counts: std is derived from Norm and Mean (population std),
and a non-finite Max/Min/Mean marks the tensor non-finite with a count of 1 ("at least one").
A dump is untrusted and held to the native reader's rules: sizes and numbers
are capped as for xray's own dumps (``parse_json``; ``MAX_INDEX_BYTES`` of JSON), a tensor file
is a plain name that resolves to a regular file directly in the dump's own ``dump_tensor_data``
(no symlink out of the dump), a ``.pt`` archive is checked before it is read (stored
uncompressed, its storage no larger than the declared shape and dtype need: no zip bomb), read
with ``torch.load(weights_only=True)`` (torch's restricted unpickler: tensors only), and the
tensor read must hold the declared element count and dtype.
"""
from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any, Iterator

import torch

from .errors import DumpFormatError
from .model import (DTYPE_NAMES, MAX_DIMS, MAX_INT, MAX_ITEMS, MAX_NAME, MAX_NUMEL, Record, Scalar, Stats, TensorMeta,
                    echo, parse_json)
from .tensorio import dtype_from_name, file_inside

FORMAT_NAME = "msprobe"
#: the module-level xray format whose records an msprobe L0 dump shares (compare pairs them)
COMPARABLE_WITH = ("xray-module",)
_DATA_DIR = "dump_tensor_data"
_SNIFF_BYTES = 4096
#: dump.json and construct.json are parsed whole, and Python's JSON tree takes about 14 times the
#: file's bytes: 512 MiB (about 7 GiB of memory) is far above a real step's index (a 7B model's
#: mix-level step writes tens of MB) and keeps a crafted one from taking the machine.
MAX_INDEX_BYTES = 512 << 20
_MAX_PICKLE_BYTES = 1 << 20  # a .pt archive's data.pkl: one tensor's pickle is a few hundred bytes
_MAX_NESTING = 1024  # calls inside calls: far beyond any model's module tree


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
    try:
        data = parse_json(_read_capped(index))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise DumpFormatError(f"{index}: corrupt msprobe dump.json ({str(e)[:200]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
        raise DumpFormatError(f"{index}: not an msprobe dump (no 'data' object)")
    if data.get("framework", "pytorch") != "pytorch":
        raise DumpFormatError(f"{index}: an msprobe {echo(data.get('framework'))} dump; xray reads PyTorch ones")
    parents = _read_optional(folder / "construct.json")
    parents = parents if isinstance(parents, dict) else {}
    step = folder.parent.name.removeprefix("step")
    try:
        records = list(_records(data["data"], parents))
        records = _merge_param_grads(in_call_order(records, list(data["data"]), parents))
    except ValueError as e:
        raise DumpFormatError(f"{index}: {e}") from None
    for r in records:
        r.step = int(step) if step.isdigit() else None
    header = {"format": FORMAT_NAME, "format_version": None, "task": data.get("task"), "level": data.get("level"),
              "framework": "pytorch", "tool": "mindstudio-probe"}
    return MsprobeDump(folder, header, records)


def _read_capped(path: Path) -> bytes:
    """The text of an index file of at most MAX_INDEX_BYTES (checked on the open file, so a
    file that grows after the check is still read only that far)."""
    with open(path, "rb") as f:
        raw = f.read(MAX_INDEX_BYTES + 1)
    if len(raw) > MAX_INDEX_BYTES:
        raise DumpFormatError(f"{path}: larger than {MAX_INDEX_BYTES >> 20} MiB, the most xray reads of an msprobe "
                              "index (it is parsed whole: about 14 times its size in memory)")
    return raw


def _read_optional(path: Path) -> Any:
    """construct.json, or None where it is missing or unreadable (calls then carry no module);
    one larger than the cap is refused as dump.json is."""
    try:
        raw = _read_capped(path)
    except OSError:
        return None
    try:
        return parse_json(raw)
    except (ValueError, RecursionError):
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


def in_call_order(records: list[Record], keys: list[str], parents: dict) -> list[Record]:
    """``records`` (msprobe's order: each call when it ends, ``keys`` their names) in the order the
    calls began: a call just before the first call inside it, by construct.json's ``parents``
    (call name -> enclosing call's name). Calls whose enclosing call is not recorded keep their
    place; the walk up stops after ``_MAX_NESTING`` calls (a cycle in a crafted construct.json)."""
    at = {k: i for i, k in enumerate(keys)}
    up = [at.get(parents.get(k)) if isinstance(parents.get(k), str) else None for k in keys]
    begin = list(range(len(keys)))  # where each call's first enclosed call (or itself) ended
    depth = [0] * len(keys)
    for i in range(len(keys)):
        j = up[i]
        while j is not None and j != i and depth[i] < _MAX_NESTING:
            begin[j] = min(begin[j], begin[i])
            depth[i] += 1
            j = up[j]
    order = sorted(range(len(records)), key=lambda i: (begin[i], depth[i], i))
    return [records[i] for i in order]


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
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(type(n) is int and 0 <= n < MAX_INT
                                                                       for n in shape):
        raise ValueError(f"{key}: bad tensor shape {echo(shape)}")
    numel = math.prod(shape)
    if numel > MAX_NUMEL:
        raise ValueError(f"{key}: tensor shape {echo(shape)} has more than 2**63-1 elements")
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
        std = math.sqrt(max(norm * norm / numel - mean * mean, 0.0))  # inf - inf near 1e308: nan
        std = std if math.isfinite(std) else None
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

    def _path(self, meta: TensorMeta | str) -> Path | None:
        """The tensor file, resolved: a regular file directly in the dump's own
        ``dump_tensor_data`` (not a symlink to another folder), or None where it is missing; a
        file or folder that leads out of the dump is refused, as the native reader refuses it."""
        ref = meta if isinstance(meta, str) else meta.data
        if not ref:
            raise KeyError("this tensor's data was not saved (an msprobe statistics dump: use task 'tensor')")
        folder, _, name = ref.rpartition("/")
        if folder != _DATA_DIR:
            raise DumpFormatError(f"{self.folder}: refusing tensor file reference {echo(ref)} outside {_DATA_DIR}")
        data_dir = self.folder / _DATA_DIR
        if not data_dir.exists() and not data_dir.is_symlink():
            return None
        try:
            real_dir, home = data_dir.resolve(strict=True), self.folder.resolve(strict=True)
        except (OSError, RuntimeError) as e:
            raise DumpFormatError(f"{data_dir}: cannot open ({getattr(e, 'strerror', None) or e})") from None
        if data_dir.is_symlink() or real_dir != home / _DATA_DIR or not real_dir.is_dir():
            raise DumpFormatError(f"{data_dir}: refused: it leads to {real_dir}, not a folder of the dump itself")
        if not (data_dir / name).exists() and not (data_dir / name).is_symlink():
            return None
        return file_inside(real_dir, name)

    def has_data(self, meta: TensorMeta) -> bool:
        return meta.data is not None and self._path(meta) is not None

    def load_tensor(self, meta: TensorMeta | str) -> torch.Tensor:
        path = self._path(meta)
        if path is None:
            raise KeyError(f"{self.folder / (meta if isinstance(meta, str) else meta.data)}: no saved tensor "
                           "(deleted, or the dump was cut short)")
        declared = None if isinstance(meta, str) else meta
        _check_archive(path, declared)
        try:
            t = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is one clear error
            raise DumpFormatError(f"{path}: not a tensor file torch.load(weights_only=True) reads ({e})") from None
        if not isinstance(t, torch.Tensor):
            raise DumpFormatError(f"{path}: holds a {type(t).__name__}, not a tensor")
        if declared is not None:
            numel, dtype = math.prod(declared.shape), declared.dtype.removeprefix("torch.")
            if t.numel() != numel:
                raise DumpFormatError(f"{path}: holds {t.numel()} elements {list(t.shape)}, dump.json declares "
                                      f"{numel} {list(declared.shape)}")
            if str(t.dtype).removeprefix("torch.") != dtype:
                raise DumpFormatError(f"{path}: holds {t.dtype}, dump.json declares {dtype}")
        return t

    def close(self) -> None:
        pass

    def __enter__(self) -> "MsprobeDump":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_archive(path: Path, meta: TensorMeta | None) -> None:
    """Refuse a ``.pt`` archive whose read could take more than its declared tensor: torch.save
    stores every record uncompressed, so a compressed one (a DEFLATE'd storage of 2**28 floats in a
    1 MB file) is refused, and the storages together may hold no more bytes than the declared
    shape and dtype need (``meta``; without one, no more than the file holds)."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise DumpFormatError(f"{path}: not a tensor file torch.save writes (not a zip archive: {e})") from None
    size = path.stat().st_size
    storage = 0
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise DumpFormatError(f"{path}: refused: {echo(info.filename)} is compressed; torch.save stores "
                                  "its records uncompressed")
        if info.file_size > size:
            raise DumpFormatError(f"{path}: refused: {echo(info.filename)} declares {info.file_size} bytes "
                                  f"in a file of {size}")
        parts = info.filename.split("/")
        if parts[-1] == "data.pkl" and info.file_size > _MAX_PICKLE_BYTES:
            raise DumpFormatError(f"{path}: refused: a {info.file_size}-byte pickle (one tensor's is a few hundred)")
        if len(parts) >= 3 and parts[-2] == "data" and parts[-1].isdigit():
            storage += info.file_size
    if meta is not None:
        try:
            need = math.prod(meta.shape) * torch.empty((), dtype=dtype_from_name(meta.dtype)).element_size()
        except (ValueError, TypeError, RuntimeError):
            need = size
        if storage > need:
            raise DumpFormatError(f"{path}: refused: {storage} bytes of storage for a declared "
                                  f"{meta.dtype} {list(meta.shape)} ({need} bytes)")
