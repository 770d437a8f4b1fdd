"""The small runtime that generated tests import: input specs (``T``) and the op check.

A generated test declares its inputs as ``T(...)`` specs (shape, dtype, stride, saved data or
recorded range) and calls ``xray_op.check(op, *args, **kwargs)``. The check builds the inputs
on the device under test, runs the op there and on a CPU reference one precision step up,
compares (``xray.gen.reference``) and hands one CSV row to the pytest plugin.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import h5py
import torch

from ..dump.model import Stats, TensorMeta
from ..dump.tensorio import dtype_name, open_dataset, read_dataset
from ..inputs import place, random_like_meta
from ..record.encode import op_info
from .columns import make_row
from .reference import Comparison, combine, compare, reduction_size, to_cpu, upcast

_DATA_RE = re.compile(r"^data/[A-Za-z0-9_.-]+\.h5$")


@dataclass(frozen=True)
class T:
    """A tensor input: saved data (``data="data/<file>.h5:<dataset>"``, relative to the test file)
    or, without data, uniform values in the recorded [lo, hi] (bool: P(True) = mean)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None
    data: str | None = None
    lo: float | None = None
    hi: float | None = None
    mean: float | None = None

    def meta(self) -> TensorMeta:
        stats = None if self.lo is None or self.hi is None else Stats(self.lo, self.hi, self.mean, None)
        return TensorMeta(shape=tuple(self.shape), dtype=dtype_name(self.dtype),
                          stride=self.stride, stats=stats)


class OpCheckFailed(AssertionError):
    """The device result is outside the documented error budget."""


def case_seed(seed: int, name: str) -> int:
    """A per-test seed: independent of test order, so xdist workers build identical inputs."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


class OpCheck:
    """What a generated test talks to (the ``xray_op`` fixture of the pytest plugin)."""

    def __init__(self, name: str, folder: Path, device: str | torch.device = "cpu", seed: int = 0,
                 cpu_init: bool = True, on_row: Callable[[dict], None] | None = None) -> None:
        self.name = name
        self.folder = Path(folder)
        self.device = torch.device(device)
        self.seed = case_seed(seed, name)
        self.cpu_init = cpu_init or self.device.type == "cpu"
        self.on_row = on_row
        self._files: dict[str, h5py.File] = {}

    # -- inputs ------------------------------------------------------------------------------------
    def _generator(self) -> torch.Generator:
        if not self.cpu_init:
            try:
                return torch.Generator(device=self.device).manual_seed(self.seed)
            except RuntimeError:
                self.cpu_init = True  # this device has no generator of its own
        return torch.Generator().manual_seed(self.seed)

    def _load(self, ref: str) -> torch.Tensor:
        fname, _, dataset = ref.partition(":")
        if not _DATA_RE.match(fname) or not dataset:
            raise ValueError(f"{self.name}: invalid data reference {ref!r}")
        if fname not in self._files:
            path = self.folder / fname
            if not path.exists():
                raise FileNotFoundError(f"{self.name}: {path} is missing; copy the data/ folder along with the "
                                        "tests, or regenerate them with xray-gen --factory random")
            self._files[fname] = h5py.File(path, "r")
        return read_dataset(open_dataset(self._files[fname], dataset))

    def _build(self, spec: T, gen: torch.Generator) -> torch.Tensor:
        meta = spec.meta()
        if spec.data is not None:
            data = self._load(spec.data)
        else:
            dev = "cpu" if self.cpu_init else self.device
            data = random_like_meta(meta, spec.dtype, gen, device=dev)
        return place(data, spec.stride, self.device)

    def _materialize(self, v: Any, gen: torch.Generator) -> Any:
        if isinstance(v, T):
            return self._build(v, gen)
        if isinstance(v, list):
            return [self._materialize(x, gen) for x in v]
        if isinstance(v, tuple):
            return tuple(self._materialize(x, gen) for x in v)
        return v

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    # -- the check ---------------------------------------------------------------------------------
    def check(self, op: torch._ops.OpOverload, *args: Any, compare_mutated: bool = False, **kwargs: Any) -> Comparison:
        """Run ``op`` on the device and on the reference, record one row, fail if out of budget.

        ``compare_mutated``: compare the arguments the op writes (in-place and ``out=``) after
        the call instead of its return values.
        """
        op_name = str(op)
        gen = self._generator()
        dev_args = self._materialize(list(args), gen)
        dev_kwargs = {k: self._materialize(v, gen) for k, v in kwargs.items()}
        # The reference sees exactly the device's inputs (copied back), so inputs never differ.
        ref_args, ref_kwargs = _for_reference(dev_args, dev_kwargs, upcast)
        try:
            out = op(*dev_args, **dev_kwargs)
        except Exception as e:
            self._row(op_name, None, "", f"device run failed: {type(e).__name__}: {e}")
            raise
        ref_dtype = "upcast"
        try:
            ref = op(*ref_args, **ref_kwargs)
        except Exception:
            # Some ops refuse wider inputs (e.g. _softmax with half_to_float); fall back to the
            # same precision on CPU, and say so in the ref_dtype column.
            ref_args, ref_kwargs = _for_reference(dev_args, dev_kwargs, to_cpu)
            ref = op(*ref_args, **ref_kwargs)
            ref_dtype = "same"
        if compare_mutated:
            dev_outs = _written(op, dev_args, dev_kwargs)
            ref_outs = _written(op, ref_args, ref_kwargs)
        else:
            dev_outs, ref_outs = _flat(out), _flat(ref)
        if ref_dtype == "upcast" and not _widened([dev_args, dev_kwargs], [ref_args, ref_kwargs]):
            ref_dtype = "same"  # nothing to widen (integer or bool inputs): the reference ran at their dtypes
        ref_dtype = ",".join(dict.fromkeys(_dtype_name(r) for r in ref_outs)) + f" ({ref_dtype})"
        tensors_in = [t for t in _flat([ref_args, list(ref_kwargs.values())]) if isinstance(t, torch.Tensor)]
        k = reduction_size(op_name, tensors_in, [o for o in ref_outs if isinstance(o, torch.Tensor)])
        if len(dev_outs) != len(ref_outs):
            self._row(op_name, None, ref_dtype, f"{len(dev_outs)} outputs vs {len(ref_outs)} in the reference")
            raise OpCheckFailed(f"{self.name}: output count differs from the reference")
        cmp = combine([compare(d, r, k) for d, r in zip(dev_outs, ref_outs)])
        self._row(op_name, cmp, ref_dtype, cmp.reason)
        if not cmp.is_pass:
            raise OpCheckFailed(f"{self.name} ({op_name} on {self.device}): {cmp.reason}")
        return cmp

    def _row(self, op_name: str, cmp: Comparison | None, ref_dtype: str, error: str) -> None:
        row = make_row(self.name, op_name, cmp, ref_dtype=ref_dtype, device=str(self.device), error=error)
        if self.on_row is not None:
            self.on_row(row)


def _dtype_name(v: Any) -> str:
    return dtype_name(v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__


def _flat(v: Any) -> list:
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _flat(item)]
    return [] if v is None else [v]


def _widened(dev: list, ref: list) -> bool:
    """Whether any reference input tensor is wider than the device's."""
    flat = lambda v: [t for t in _flat([*v[0], *v[1].values()]) if isinstance(t, torch.Tensor)]  # noqa: E731
    return any(d.dtype != r.dtype for d, r in zip(flat(dev), flat(ref)))


def _for_reference(args: list, kwargs: dict, convert: Callable[[Any], Any]) -> tuple[list, dict]:
    """CPU copies of the inputs; a device argument (``device=...``) becomes ``cpu``."""
    def one(v: Any) -> Any:
        if isinstance(v, torch.device):
            return torch.device("cpu")
        if isinstance(v, (list, tuple)):
            return type(v)(one(x) for x in v)
        return convert(v)
    return [one(a) for a in args], {k: one(v) for k, v in kwargs.items()}


def _written(op: torch._ops.OpOverload, args: list, kwargs: dict) -> list:
    """The arguments ``op`` writes (schema ``Tensor(a!)``), flattened, after the call."""
    info = op_info(op)
    bound = dict(zip(info.arg_names, args))
    bound.update(kwargs)
    return _flat([bound[n] for n in info.mutates if n in bound])


__all__ = ["T", "OpCheck", "OpCheckFailed", "case_seed"]
