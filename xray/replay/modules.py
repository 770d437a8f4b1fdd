"""Module replay: rebuild a recorded nn.Module call (PrecisionDebugger or X_DEBUG MODULES dump).

The user names a factory (``pkg.module:factory``, called without arguments) that builds the
model; the recorded module is found by its dotted path. Positional tensor inputs are passed in
their recorded order (``forward_input.<i>`` / ``input.<i>``); recorded parameters and buffers
(``Record.params``) are loaded into the module, so the replay uses the recorded weights
even when the factory's differ. Keyword tensors are passed by name: a trace dump names them
``<kwarg>.<i>``; a module dump (format 2) notes each one's keyword in its index. Non-tensor
arguments (flags, caches) are not recorded, so the module runs with their defaults; a module
dump of format 1 has no keyword column, and its keyword tensors are passed positionally.
"""
from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Iterable

import numpy as np

import torch

from ..backends.base import flatten_tensors
from ..dump.model import Record, TensorMeta
from ..dump.protocol import Dump
from .nn_layers import TORCH_NN, build_nn_module, init_args

_SPEC_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_POSITIONAL = ("forward_input", "input")


class ModelSpecError(ValueError):
    """``--model`` is not ``pkg.module:factory`` or does not build an nn.Module."""


def factory_spec(factory: str | Callable[[], torch.nn.Module]) -> str:
    """``pkg.module:name`` for a spec string or an importable top-level function."""
    if callable(factory) and not isinstance(factory, str):
        spec = f"{factory.__module__}:{factory.__qualname__}"
    else:
        spec = str(factory)
    if not _SPEC_RE.match(spec) or "<" in spec:
        raise ModelSpecError(f"model factory {spec!r}: expected an importable 'pkg.module:factory' "
                             "(a top-level function that takes no arguments and returns the model)")
    return spec


def load_model(spec: str) -> torch.nn.Module:
    """Import the factory named by ``spec`` and call it; the result must be an nn.Module."""
    spec = factory_spec(spec)
    mod_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ModelSpecError(f"model factory {spec!r}: {e}") from e
    model = obj()
    if not isinstance(model, torch.nn.Module):
        raise ModelSpecError(f"model factory {spec!r} returned {type(model).__name__}, not an nn.Module")
    return model.eval()


class ModuleCall(torch.nn.Module):
    """Calls ``inner`` with tensors in recorded slots: positional first, then named keywords."""

    def __init__(self, inner: torch.nn.Module, n_positional: int, keywords: list[tuple[str, int]]) -> None:
        super().__init__()
        self.inner = inner
        self.n_positional = n_positional
        self.keywords = keywords  # (name, how many tensors): 1 -> the tensor, >1 -> a tuple

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = tensors[: self.n_positional]
        kwargs, i = {}, self.n_positional
        for name, n in self.keywords:
            kwargs[name] = tensors[i] if n == 1 else tuple(tensors[i:i + n])
            i += n
        return tuple(flatten_tensors(self.inner(*args, **kwargs)))


def _split_key(key: str) -> tuple[str, str]:
    head, _, tail = key.rpartition(".")
    return (head, tail) if head else (key, "")


def input_order(record: Record) -> tuple[list[str], int, list[tuple[str, int]]]:
    """Input keys in the order ModuleCall takes its tensors: positional by index, then keywords;
    plus the positional count and (keyword, tensor count) pairs. Parameters are not inputs.
    Keyword tensors are named ``<kwarg>.<i>`` in trace dumps and listed in ``record.keywords``
    in module dumps."""
    positional: dict[int, str] = {}
    keywords: dict[str, dict[int, str]] = {}
    for key, value in record.inputs.items():
        if not isinstance(value, TensorMeta):
            continue
        head, tail = _split_key(key)
        if not tail.isdigit():
            continue
        if key in record.keywords:
            keywords.setdefault(record.keywords[key], {})[int(tail)] = key
        elif head in _POSITIONAL:
            positional[int(tail)] = key
        else:
            keywords.setdefault(head, {})[int(tail)] = key
    keys = [positional[i] for i in sorted(positional)]
    for items in keywords.values():
        keys += [items[i] for i in sorted(items)]
    return keys, len(positional), [(name, len(items)) for name, items in keywords.items()]


def module_call(record: Record, dump: Dump, model_spec: str | None, models: dict[str, torch.nn.Module], *,
                factory: str = "auto", seed: int = 0) -> tuple[ModuleCall, tuple[torch.Tensor, ...]]:
    """(module, tensor inputs) replaying ``record``; ``models`` caches built models per spec."""
    from ..ops.rebuild import materialize_value

    if model_spec == TORCH_NN:
        return _nn_call(record, factory, seed)
    if not model_spec:
        raise ModelSpecError(f"record seq={record.seq} is a module call ({record.op}); pass --model pkg.module:factory")
    if model_spec not in models:
        models[model_spec] = load_model(model_spec)
    root = models[model_spec]
    try:
        inner = root.get_submodule(record.module or "")
    except AttributeError as e:
        raise ModelSpecError(f"record seq={record.seq}: the model from {model_spec} has no module "
                             f"{record.module!r} ({e})") from e
    if type(inner).__name__ != record.op:
        raise ModelSpecError(f"record seq={record.seq}: module {record.module!r} is a {type(inner).__name__}, "
                             f"the dump recorded a {record.op}")
    gen = torch.Generator().manual_seed(int(seed))
    keys, n_positional, keywords = input_order(record)
    tensors = tuple(materialize_value(record.inputs[k], dump, factory=factory, generator=gen,
                                      ignored=ignored_input(inner, record, k)) for k in keys)
    _load_recorded_params(inner, record, dump, factory, seed)
    return ModuleCall(inner, n_positional, keywords), tensors


def _nn_call(record: Record, factory: str, seed: int) -> tuple[ModuleCall, tuple[torch.Tensor, ...]]:
    """A sweep's module record: ``torch.nn.<record.op>`` built from its init arguments, cast to the
    dtype of its recorded parameters, which are then drawn from their recorded statistics."""
    from ..ops.rebuild import dtype_of, materialize_value

    try:
        inner = build_nn_module(record.op, init_args(record))
    except (TypeError, ValueError) as e:
        raise ModelSpecError(f"record seq={record.seq}: cannot build torch.nn.{record.op}: {e}") from e
    floats = [m.dtype for m in record.params.values() if dtype_of(m.dtype).is_floating_point]
    if floats:
        inner = inner.to(dtype_of(floats[0]))
    gen = torch.Generator().manual_seed(int(seed))
    keys, n_positional, keywords = input_order(record)
    tensors = tuple(materialize_value(record.inputs[k], None, factory=factory, generator=gen,
                                      ignored=ignored_input(inner, record, k)) for k in keys)
    own = dict(inner.named_parameters())
    own.update(inner.named_buffers())
    gen = torch.Generator().manual_seed(int(seed) + 1)
    with torch.no_grad():
        for name, meta in record.params.items():
            if name in own and tuple(own[name].shape) == tuple(meta.shape):
                own[name].copy_(materialize_value(meta, None, factory=factory, generator=gen).to(own[name].dtype))
    return ModuleCall(inner, n_positional, keywords), tensors


# transformers' documented convention for ``labels``: "indices set to -100 are ignored"
LABELS_IGNORED = -100


def ignored_input(module: torch.nn.Module, record: Record, key: str) -> int | None:
    """The negative sentinel that a module's class-index input ``key`` may hold besides valid
    classes (``ops.rebuild.ignored_index`` for module calls): a torch.nn loss's ``target`` (its
    second positional input) holds the module's ``ignore_index``, a transformers model's
    ``labels`` -100. Drawn uniformly in its recorded range, such an input holds negative classes
    that no loss accepts."""
    head, tail = _split_key(key)
    name = record.keywords.get(key) or (None if head in _POSITIONAL else head)
    if name == "target" or (name is None and tail == "1"):
        value = getattr(module, "ignore_index", None)
    else:
        value = LABELS_IGNORED if name == "labels" else None
    return value if type(value) is int and value < 0 else None


def _module_records(dump: Dump, step: int | None) -> Iterable[Record]:
    """The dump's module records of ``step``: on a v3 trace dump's columns, building only those."""
    from ..dump.column_scan import native_columns
    from ..dump.columns import KINDS, NONE

    columns = native_columns(dump)
    if columns is None:
        return (r for r in getattr(dump, "records", []) if r.kind == "module" and r.step == step)
    r = columns.records
    rows = np.flatnonzero((r["kind"] == KINDS.index("module")) & (r["step"] == (NONE if step is None else step)))
    return (columns.record(i) for i in rows.tolist())


def _load_recorded_params(inner: torch.nn.Module, record: Record, dump: Dump, factory: str, seed: int) -> None:
    """Copy the parameters and buffers the dump recorded for ``inner`` and its children into it.

    A module record carries the module's own parameters and buffers (``Record.params``), so a
    parent's weights are found on its children's records.
    """
    from ..ops.rebuild import materialize_value

    path = record.module or ""
    prefix = path + "." if path else ""
    found: dict[str, TensorMeta] = {}
    for r in _module_records(dump, record.step):
        where = r.module or ""
        if where != path and not where.startswith(prefix):
            continue
        rel = where[len(prefix):] if where != path else ""
        for name, meta in r.params.items():
            found.setdefault(f"{rel}.{name}" if rel else name, meta)
    if not found:
        return
    own = dict(inner.named_parameters())
    own.update(inner.named_buffers())
    gen = torch.Generator().manual_seed(int(seed) + 1)
    with torch.no_grad():
        for name, meta in found.items():
            if name in own and tuple(own[name].shape) == tuple(meta.shape):
                own[name].copy_(materialize_value(meta, dump, factory=factory, generator=gen).to(own[name].dtype))
