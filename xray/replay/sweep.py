"""Declarative sweeps: a YAML spec of ATen ops and ``torch.nn`` modules with grids of shapes,
dtypes and arguments, expanded into records of xray's data model and written as a trace dump.

Replay then runs that dump exactly as it runs a recording (same workers, statuses, matrix,
heatmap, per-backend dumps): the spec is only another way to produce records. The YAML is
untrusted input: ``yaml.safe_load`` only, op names through ``xray.ops.rebuild.resolve_op`` (which
applies ``xray.ops.safety``), module classes by name from ``torch.nn`` only, argument values plain
scalars and lists checked against the op's schema. Schema and examples: docs/replay.md, "Sweeps".
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..dump.model import Record, Scalar, Stats, TensorMeta, echo
from ..dump.stats import tensor_stats
from ..dump.tensorio import dtype_name
from .nn_layers import _IDENT_RE, INIT_PREFIX, TORCH_NN, build_nn_module, nn_class
from .sweep_values import (POSITIVE_RANGE, _alternatives, _dtype, _fmt, _Input, _is_plain, _keys,
                           _meta, _number, _on_meta, _output_metas, _parse_input, _plain, _range, _short,
                           parse_yaml, read_yaml_file)

if TYPE_CHECKING:
    from .matrix import MatrixRow, ReplayResult
    from .runner import ReplayConfig

MAX_CASES = 2000          # combinations of one spec (--max-cases raises it)
MAX_SPEC_BYTES = 1 << 20  # a spec is a page of YAML, not a data file
BUILTIN = ("common",)     # --spec common: xray/replay/sweeps/common.yaml

# Dtypes a sweep may name (inputs' `dtypes` grid or an input's fixed `dtype`).

_OP_KEYS = ("op", "inputs", "args", "dtypes", "range", "positive")
_MODULE_KEYS = ("module", "init", "inputs", "dtypes", "range", "positive", "params")


class SweepError(ValueError):
    """The spec cannot be run as written; the message names the file, the entry and the fault."""


@dataclass
class Case:
    """One combination of an entry: an op call or a module call, as record material."""

    entry: int
    kind: str  # "op" | "module"
    op: str  # "aten.mm.default" or the torch.nn class name
    label: str  # the grid values that make this case, e.g. "self=64x128 mat2=128x64 float32"
    inputs: dict[str, Any]
    outputs: list[TensorMeta]
    params: dict[str, TensorMeta] = field(default_factory=dict)


@dataclass
class Sweep:
    """An expanded spec: its cases, and the combinations left out because their shapes do not fit."""

    name: str
    cases: list[Case]
    left_out: list[str]
    entries: int

    def records(self) -> list[Record]:
        out = []
        for seq, c in enumerate(self.cases):
            out.append(Record(seq=seq, kind=c.kind, op=c.op, module=c.label, inputs=dict(c.inputs),
                              outputs=list(c.outputs), params=dict(c.params), call_index=0,
                              stack=[f"{self.name}: entry {c.entry}"]))
        return out


# -- loading ---------------------------------------------------------------------------------------

def load_sweep(spec: str | Path, *, max_cases: int = MAX_CASES, dtypes: list[str] | None = None) -> Sweep:
    """Read, validate and expand ``spec`` (a YAML file, or a built-in name such as ``common``).
    ``dtypes`` replaces the dtype grid of every entry that has one (a configuration matrix's axis)."""
    name, data = _read(spec)
    if not isinstance(data, dict):
        raise SweepError(f"{name}: expected a mapping with 'ops' and/or 'modules' lists, got {type(data).__name__}")
    unknown = [k for k in data if k not in ("ops", "modules")]
    if unknown:
        raise SweepError(f"{name}: unknown top-level key {echo(unknown[0])} (expected 'ops' and/or 'modules')")
    entries: list[tuple[str, Any]] = []
    for key in data:  # file order, so "entry N" counts as the reader of the file does
        items = data[key]
        if items is None:
            continue
        if not isinstance(items, list):
            raise SweepError(f"{name}: '{key}' must be a list of entries, got {type(items).__name__}")
        entries += [(key, item) for item in items]
    if not entries:
        raise SweepError(f"{name}: no entries under 'ops' or 'modules'")
    parsed = []
    total = 0
    for i, (key, item) in enumerate(entries, 1):
        entry = (_OpEntry if key == "ops" else _ModuleEntry)(name, i, item)
        if dtypes:
            entry.set_dtypes(dtypes)
        total += entry.count
        if total > max_cases:
            raise SweepError(f"{name}: entry {i} ({entry.title}): the spec expands to more than {max_cases} "
                             f"combinations (this entry alone: {entry.count}); shrink the grids or raise --max-cases")
        parsed.append(entry)
    cases, left_out = [], []
    for entry in parsed:
        got, bad = entry.expand()
        if not got:
            raise SweepError(f"{entry.where}: none of its {entry.count} combinations runs: {bad[0]}")
        cases += got
        left_out += [f"{entry.where}: {b}" for b in bad]
    return Sweep(name, cases, left_out, len(parsed))


def _read(spec: str | Path) -> tuple[str, Any]:
    name = str(spec)
    if name in BUILTIN and not Path(spec).is_file():  # a file of that name wins over the built-in
        text = (resources.files("xray.replay") / "sweeps" / f"{spec}.yaml").read_text(encoding="utf-8")
        return name, parse_yaml(text, name, "sweep", SweepError)
    return name, read_yaml_file(spec, "sweep", "sweep spec", SweepError, MAX_SPEC_BYTES,
                                missing=f" (built-in sweeps: {', '.join(BUILTIN)})")


# -- op entries --------------------------------------------------------------------------------------

def _resolve(name: Any) -> torch._ops.OpOverload:
    """``aten.<op>.<overload>`` (or ``aten.<op>`` for its default overload) of this torch, safe to run."""
    from ..ops.rebuild import resolve_op

    if not isinstance(name, str):
        raise ValueError(f"'op' must be a name like aten.mm.default, got {echo(name)}")
    parts = name.split(".")
    if parts[0] != "aten":
        raise ValueError(f"only ATen ops can be swept (aten.<op>.<overload>), got {echo(name)}")
    if len(parts) == 2:
        ok = _IDENT_RE.match(parts[1]) and not parts[1].startswith("__")  # never a Python attribute of torch.ops
        packet = getattr(torch.ops.aten, parts[1], None) if ok else None
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            packet = None
        if packet is None or "default" not in packet.overloads():
            hint = f"; overloads: {', '.join(packet.overloads()[:12])}" if packet is not None else ""
            raise ValueError(f"unknown op {echo(name)}: give aten.<op>.<overload>{hint}")
        name = f"{name}.default"
    return resolve_op(name)


class _Entry:
    """One spec entry; ``key`` names the field that says what it runs ("op" or "module")."""

    key: str
    title: str
    count: int

    def __init__(self, spec_name: str, index: int, item: Any) -> None:
        self.spec_name, self.index = spec_name, index
        self.title = str(item.get(self.key))[:80] if isinstance(item, dict) else "?"
        try:
            self._parse(item)
        except ValueError as e:
            raise self.fail(str(e)) from None

    def _parse(self, item: Any) -> None:
        raise NotImplementedError

    def set_dtypes(self, dtypes: list[str]) -> None:
        """Replace the dtype grid (entries whose inputs all have a fixed dtype keep theirs)."""
        if not self.has_grid:
            return
        try:
            new = [_dtype(d, "dtypes") for d in dtypes]
        except ValueError as e:
            raise self.fail(str(e)) from None
        self.count = self.count // len(self.dtypes) * len(new)
        self.dtypes = new

    @property
    def where(self) -> str:
        return f"{self.spec_name}: entry {self.index} ({self.title})"

    def fail(self, message: str) -> SweepError:
        return SweepError(f"{self.where}: {message}")


class _OpEntry(_Entry):
    """``op`` with ``inputs`` (shapes zipped case by case), ``args`` and ``dtypes`` (crossed)."""

    key = "op"

    def _parse(self, item: Any) -> None:
        _keys(item, _OP_KEYS, "entry")
        self.func = _resolve(item.get("op"))
        self.title = str(self.func)  # aten.mm.default
        schema = {a.name: a for a in self.func._schema.arguments}
        rng = _range(item["range"], "range") if "range" in item else None
        if item.get("positive") is True:
            rng = POSITIVE_RANGE
        raw_inputs = _keys(item.get("inputs"), tuple(schema), "inputs") if "inputs" in item else {}
        self.inputs: dict[str, _Input] = {}
        for k, v in raw_inputs.items():
            kind = _tensor_kind(schema[k])
            if kind is None:
                raise ValueError(f"inputs.{k}: not a tensor argument of {self.title} "
                                 f"(tensor arguments: {', '.join(n for n, a in schema.items() if _tensor_kind(a))})")
            self.inputs[k] = _parse_input(v, f"inputs.{k}", kind == "list", rng)
        lengths = {len(i.shapes) for i in self.inputs.values()} - {1}
        if len(lengths) > 1:
            raise ValueError(f"inputs: shape lists are zipped case by case, so they need equal lengths "
                             f"(or one shape), got {sorted(lengths)}")
        self.positions = max([len(i.shapes) for i in self.inputs.values()] or [1])
        raw_args = _keys(item.get("args") or {}, tuple(schema), "args")
        self.args: dict[str, list[Any]] = {}
        for k, v in raw_args.items():
            if k in self.inputs or _tensor_kind(schema[k]):
                raise ValueError(f"args.{k}: a tensor argument; give its shapes under 'inputs'")
            self.args[k] = [_arg_value(schema[k], x, f"args.{k}") for x in _alternatives(v, f"args.{k}")]
        unset = [n for n, a in schema.items() if not a.has_default_value() and n not in self.inputs
                 and n not in self.args]
        self.nulls = {n for n in unset if str(schema[n].real_type).startswith("Optional")}
        missing = [n for n in unset if n not in self.nulls]
        # Defaults are recorded as the recorder records them (xray.record.encode.bind_inputs), so a
        # record reads the same either way: SDPA's dropout_p=0.0 marks it deterministic.
        self.defaults = {n: a.default_value for n, a in schema.items() if n not in self.inputs and n not in self.args
                         and a.has_default_value() and _is_plain(a.default_value)}
        if missing:
            raise ValueError(f"argument {missing[0]!r} of {self.title} has no default; give it under "
                             f"{'inputs' if _tensor_kind(schema[missing[0]]) else 'args'}")
        self.dtypes = [_dtype(d, "dtypes") for d in _alternatives(item.get("dtypes", "float32"), "dtypes")]
        if all(i.dtype is not None for i in self.inputs.values()) and "dtypes" in item and len(self.dtypes) > 1:
            raise ValueError("'dtypes' given, but every input has a fixed dtype")
        self.has_grid = any(i.dtype is None for i in self.inputs.values())
        if not self.has_grid:
            self.dtypes = self.dtypes[:1]
        self.count = self.positions * len(self.dtypes) * math.prod(len(v) for v in self.args.values())

    def expand(self) -> tuple[list[Case], list[str]]:
        from ..ops.rebuild import split_args

        cases, bad = [], []
        order = [a.name for a in self.func._schema.arguments]
        for pos, dtype, combo in itertools.product(range(self.positions), self.dtypes,
                                                   itertools.product(*self.args.values())):
            values: dict[str, Any] = {}
            for name in order:
                if name in self.inputs:
                    spec = self.inputs[name]
                    shape = spec.shapes[pos if len(spec.shapes) > 1 else 0]
                    dt = spec.dtype or dtype
                    values[name] = ([_meta(s, dt, spec.range, spec.param) for s in shape]
                                    if isinstance(shape, list) else _meta(shape, dt, spec.range, spec.param))
                elif name in self.args:
                    values[name] = dict(zip(self.args, combo))[name]
                elif name in self.nulls:
                    values[name] = None  # Tensor? weight without a default: the call needs an explicit None
                elif name in self.defaults:
                    values[name] = self.defaults[name]
            label = " ".join([f"{k}={_fmt(v)}" for k, v in values.items() if k in self.inputs]
                             + ([dtype] if any(i.dtype is None for i in self.inputs.values()) else [])
                             + [f"{k}={_fmt(v)}" for k, v in values.items() if k in self.args])
            try:
                live = {k: _live(v) for k, v in values.items()}
                args, kwargs = split_args(self.func, live, self.title)
                outputs = _output_metas(self.func(*args, **kwargs))
            except Exception as e:  # noqa: BLE001 - a combination whose shapes do not fit is left out
                bad.append(f"{label}: {_short(e)}")
                continue
            if not outputs:
                bad.append(f"{label}: returns no tensor, nothing to compare")
                continue
            cases.append(Case(self.index, "op", self.title, label, values, outputs))
        return cases, bad


def _tensor_kind(arg: Any) -> str | None:
    t = str(arg.real_type)
    if t in ("Tensor", "Optional[Tensor]"):
        return "tensor"
    if t in ("List[Tensor]", "List[Optional[Tensor]]"):
        return "list"
    return None


def _arg_value(arg: Any, v: Any, what: str) -> Any:
    """One alternative of a non-tensor argument, checked against its schema type."""
    t = str(arg.real_type)
    if v is None:
        if t.startswith("Optional") or (arg.has_default_value() and arg.default_value is None):
            return None
        raise ValueError(f"{what}: null, but {arg.name!r} is not optional")
    base = t.removeprefix("Optional[").removesuffix("]") if t.startswith("Optional[") else t
    if base in ("int", "SymInt"):
        if type(v) is not int:
            raise ValueError(f"{what}: expected an integer, got {echo(v)}")
        return _plain(v, what)
    if base == "float":
        return float(_number(v, what))
    if base == "number":
        return v if isinstance(v, bool) else _number(v, what)
    if base == "bool":
        if not isinstance(v, bool):
            raise ValueError(f"{what}: expected true or false, got {echo(v)}")
        return v
    if base == "str":
        if not isinstance(v, str):
            raise ValueError(f"{what}: expected a string, got {echo(v)}")
        return _plain(v, what)
    if base == "ScalarType":
        return Scalar("dtype", _dtype(v, what))
    if base in ("List[int]", "List[SymInt]"):
        if type(v) is int and arg.N:  # int[2] takes one int for every dimension, as in Python
            return _plain(v, what)
        if not isinstance(v, list) or not all(type(x) is int for x in v):
            raise ValueError(f"{what}: expected a list of integers, e.g. [[1, 0]] for one alternative, got {echo(v)}")
        return _plain(v, what)
    if base == "List[float]":
        if not isinstance(v, list):
            raise ValueError(f"{what}: expected a list of numbers, got {echo(v)}")
        return [float(_number(x, what)) for x in v]
    if base == "List[bool]":
        if not isinstance(v, list) or not all(isinstance(x, bool) for x in v):
            raise ValueError(f"{what}: expected a list of booleans, got {echo(v)}")
        return _plain(v, what)
    raise ValueError(f"{what}: arguments of type {t} cannot be set in a sweep")


def _live(v: Any) -> Any:
    """A case value as the meta-device call that checks its shapes needs it."""
    if isinstance(v, TensorMeta):
        return _on_meta(v)
    if isinstance(v, Scalar):
        return getattr(torch, v.value)
    if isinstance(v, list):
        return [_live(x) for x in v]
    return v


# -- module entries ----------------------------------------------------------------------------------

def _init_names(cls: type) -> list[str]:
    params = inspect.signature(cls.__init__).parameters
    return [n for n, p in params.items() if n not in ("self", "device", "dtype")
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _forward_names(cls: type) -> list[str]:
    params = inspect.signature(cls.forward).parameters
    return [n for n, p in params.items() if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)]


class _ModuleEntry(_Entry):
    """``module`` with ``init`` (crossed), ``inputs`` (zipped) and ``dtypes`` (crossed)."""

    key = "module"

    def _parse(self, item: Any) -> None:
        _keys(item, _MODULE_KEYS, "entry")
        self.cls = nn_class(item.get("module"))
        self.title = f"torch.nn.{self.cls.__name__}"
        names = _init_names(self.cls)
        raw_init = _keys(item.get("init") or {}, tuple(names), "init")
        self.init = {k: [_plain(x, f"init.{k}") for x in _alternatives(v, f"init.{k}")] for k, v in raw_init.items()}
        rng = _range(item["range"], "range") if "range" in item else None
        if item.get("positive") is True:
            rng = POSITIVE_RANGE
        forward = _forward_names(self.cls)
        raw = item.get("inputs")
        if isinstance(raw, list):
            raw = {forward[0] if forward else "input": raw}
        raw = _keys(raw, tuple(forward), "inputs")
        if not raw:
            raise ValueError("inputs: give the shapes of the module's input, e.g. inputs: [[1, 3, 32, 32]]")
        self.inputs = {k: _parse_input(v, f"inputs.{k}", False, rng) for k, v in raw.items()}
        given = [forward.index(k) for k in self.inputs]
        if sorted(given) != list(range(len(given))):
            raise ValueError(f"inputs: forward takes {', '.join(forward)}; give its first {len(given)} "
                             "arguments (tensors are passed by position)")
        self.inputs = dict(sorted(self.inputs.items(), key=lambda kv: forward.index(kv[0])))
        lengths = {len(i.shapes) for i in self.inputs.values()} - {1}
        if len(lengths) > 1:
            raise ValueError(f"inputs: shape lists are zipped case by case, so they need equal lengths "
                             f"(or one shape), got {sorted(lengths)}")
        self.positions = max(len(i.shapes) for i in self.inputs.values())
        raw_params = item.get("params") or {}
        if not isinstance(raw_params, dict):
            raise ValueError(f"params: expected a mapping of parameter or buffer name to [lo, hi], "
                             f"got {echo(raw_params)}")
        self.params = {str(k)[:64]: _range(v, f"params.{k}") for k, v in raw_params.items()}
        self.dtypes = [_dtype(d, "dtypes") for d in _alternatives(item.get("dtypes", "float32"), "dtypes")]
        self.has_grid = True
        if any(getattr(torch, d).is_floating_point is False for d in self.dtypes):
            raise ValueError(f"dtypes: a module runs in a floating dtype, got {self.dtypes}")
        self.count = self.positions * len(self.dtypes) * math.prod(len(v) for v in self.init.values())

    def expand(self) -> tuple[list[Case], list[str]]:
        cases, bad = [], []
        for init_values in itertools.product(*self.init.values()):
            init = dict(zip(self.init, init_values))
            init_label = " ".join(f"{k}={_fmt(v)}" for k, v in init.items())
            try:
                with torch.device("meta"):
                    shell = build_nn_module(self.cls.__name__, init)
                unknown = [k for k in self.params if k not in shell.state_dict()]
                if unknown:
                    raise ValueError(f"params: {unknown[0]!r} is not a parameter or buffer of it "
                                     f"({', '.join(shell.state_dict())})")
                with torch.random.fork_rng(devices=[]):  # the caller's random stream stays untouched
                    torch.manual_seed(0)  # statistics of the default initialisation; replay draws within them
                    real = build_nn_module(self.cls.__name__, init)
            except Exception as e:  # noqa: BLE001 - an init that torch.nn rejects is left out
                bad += [f"{init_label}: {_short(e)}"] * (self.positions * len(self.dtypes))
                continue
            for pos, dtype in itertools.product(range(self.positions), self.dtypes):
                tensors = {f"input.{i}": _meta(spec.shapes[pos if len(spec.shapes) > 1 else 0], spec.dtype or dtype,
                                               spec.range, False)
                           for i, spec in enumerate(self.inputs.values())}
                label = " ".join(filter(None, [init_label, " ".join(
                    f"{k}={_fmt(m)}" for k, m in zip(self.inputs, tensors.values())), dtype]))
                try:
                    shell.to(getattr(torch, dtype))
                    outputs = _output_metas(shell(*[_on_meta(m) for m in tensors.values()]))
                except Exception as e:  # noqa: BLE001 - shapes that do not fit the module are left out
                    bad.append(f"{label}: {_short(e)}")
                    continue
                if not outputs:
                    bad.append(f"{label}: returns no tensor, nothing to compare")
                    continue
                params = {}
                for k, t in real.state_dict().items():
                    t = t.to(getattr(torch, dtype)) if t.is_floating_point() else t
                    st = tensor_stats(t)
                    if k in self.params:
                        lo, hi = self.params[k]
                        st = Stats(lo, hi, (lo + hi) / 2, (hi - lo) / math.sqrt(12), numel=t.numel())
                    params[k] = TensorMeta(tuple(t.shape), dtype_name(t.dtype), tuple(t.stride()), stats=st)
                inputs = dict(tensors)
                inputs.update({f"{INIT_PREFIX}{k}": v for k, v in init.items()})
                cases.append(Case(self.index, "module", self.cls.__name__, label, inputs, outputs, params))
        return cases, bad


# -- the dump ----------------------------------------------------------------------------------------

def write_sweep_dump(sweep: Sweep, folder: Path) -> Path:
    """The sweep as an xray trace dump (records only: inputs are drawn from their statistics)."""
    import platform

    from ..dump.writer import DumpWriter

    header = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch_version": torch.__version__,
              "python_version": platform.python_version(), "host": platform.node(), "pid": None, "rank": None,
              "config": {}, "sweep": {"spec": sweep.name, "entries": sweep.entries, "cases": len(sweep.cases),
                                      "left_out": len(sweep.left_out)}}
    writer = DumpWriter(Path(folder), header)
    for rec in sweep.records():
        writer.add(rec)
    n = len(sweep.cases)
    return writer.close({"op_calls": n, "records": n, "tensors_saved": 0, "seconds": 0.0, "error": None})


def replay_sweep(spec: str | Path, cfg: "ReplayConfig", *, max_cases: int = MAX_CASES,
                 on_row: Callable[["MatrixRow"], None] | None = None,
                 dtypes: list[str] | None = None) -> tuple[Sweep, "ReplayResult"]:
    """Expand ``spec`` into ``cfg.out/spec-dump`` and replay that dump as configured; inputs are
    drawn from the spec's ranges (the random factory), modules built by the torch.nn factory."""
    from .runner import replay_dump

    if cfg.factory == "load":
        raise SweepError(f"{spec}: a sweep has no saved tensors to load; its inputs are drawn at random "
                         "(drop --factory load)")
    sweep = load_sweep(spec, max_cases=max_cases, dtypes=dtypes)
    folder = write_sweep_dump(sweep, Path(cfg.out) / "spec-dump")
    return sweep, replay_dump(folder, dataclasses.replace(cfg, factory="random", model=TORCH_NN), on_row)
