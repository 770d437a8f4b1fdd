"""The small runtime that generated tests import: input specs (``T``) and the op check.

A generated test declares its inputs as ``T(...)`` specs (shape, dtype, stride, saved data or
recorded range) and calls ``xray_op.check(op, *args, **kwargs)``. The check builds the inputs
on the device under test, runs the op there, in fp64 on CPU (the reference) and at the same
dtype on CPU (the noise), judges with ``xray.numerics.noise`` and hands one CSV row to the
pytest plugin.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import h5py
import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..dump.model import Stats, TensorMeta
from ..dump.tensorio import dtype_name, open_dataset, read_dataset
from ..ops.rebuild import place, random_like_meta
from ..record.encode import op_info
from .columns import make_row
from ..numerics import noise
from ..numerics.kernel_families import packet, primary_outputs, reference_of, runs_public_op
from .reference import OutputVerdict, combine_verdicts, judge_output, to_cpu, widen

_DATA_RE = re.compile(r"^data/[A-Za-z0-9_.-]+\.h5$")


@dataclass(frozen=True)
class T:
    """A tensor input: saved data (``data="data/<file>.h5:<dataset>"``, relative to the test file)
    or, without data, uniform values in the recorded [lo, hi] (bool: P(True) = mean; ``ignore``:
    a class-index target's ignore_index, see xray.ops.rebuild.ignored_index)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None
    data: str | None = None
    lo: float | None = None
    hi: float | None = None
    mean: float | None = None
    ignore: int | None = None

    def meta(self) -> TensorMeta:
        stats = None if self.lo is None or self.hi is None else Stats(self.lo, self.hi, self.mean, None)
        return TensorMeta(shape=tuple(self.shape), dtype=dtype_name(self.dtype),
                          stride=self.stride, stats=stats)


class OpCheckFailed(AssertionError):
    """The device result is beyond the CPU's measured noise (docs/gen.md, "Pass criteria")."""


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
            data = random_like_meta(meta, spec.dtype, gen, device=dev, ignored=spec.ignore)
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
    def check(self, op: torch._ops.OpOverload, *args: Any, compare_mutated: bool = False,
              **kwargs: Any) -> OutputVerdict:
        """Run ``op`` on the device, in fp64 on CPU (the reference) and at the device's dtype on CPU
        (the noise), record one row, fail when the device's error is beyond the noise.

        ``compare_mutated``: judge the arguments the op writes (in-place and ``out=``) after the
        call instead of its return values.
        """
        op_name = str(op)
        self._skip_unless_device_runs()
        op, reference_op = public_form(op)
        gen = self._generator()
        dev_args = self._materialize(list(args), gen)
        dev_kwargs = {k: self._materialize(v, gen) for k, v in kwargs.items()}
        # Both CPU runs see exactly the device's inputs (copied back), so inputs never differ.
        # They run outside any dispatch mode the test runs under (a device emulation, a fault
        # injector): the copies and the CPU runs are plain ATen on CPU.
        with _disable_current_modes():
            ref_args, ref_kwargs = _for_reference(dev_args, dev_kwargs, widen)
            cpu_args, cpu_kwargs = _for_reference(dev_args, dev_kwargs, to_cpu)
        try:
            out = op(*dev_args, **dev_kwargs)
        except Exception as e:
            why = _no_kernel(e)
            if why:
                self._skip(op_name, f"{op_name} has no kernel on {self.device}: {why}")
            self._row(op_name, None, "", f"device run failed: {type(e).__name__}: {e}")
            raise
        with _disable_current_modes():
            ref, ref_dtype = _run_reference(reference_op, ref_args, ref_kwargs, cpu_args, cpu_kwargs)
            try:
                cpu = reference_op(*cpu_args, **cpu_kwargs)
            except Exception:  # CPU has no kernel at this dtype: the noise level falls back to its floor
                cpu = None
        if ref_dtype == "upcast" and not _widened([*cpu_args, *cpu_kwargs.values()], [*ref_args, *ref_kwargs.values()]):
            ref_dtype = "same"  # nothing to widen (integer or bool inputs): the reference ran at their dtypes
        if compare_mutated:
            dev_outs = _written(op, dev_args, dev_kwargs)
            ref_outs = _written(op, ref_args, ref_kwargs)
            cpu_outs = _written(op, cpu_args, cpu_kwargs) if cpu is not None else []
        else:  # a kernel's own outputs after its family's primary ones (a workspace, an RNG seed) are not values
            shared = primary_outputs(op_name)
            dev_outs, ref_outs, cpu_outs = _flat(out)[:shared], _flat(ref)[:shared], _flat(cpu)[:shared]
        ref_dtype = ",".join(dict.fromkeys(_dtype_name(r) for r in ref_outs)) + f" ({ref_dtype})"
        if len(dev_outs) != len(ref_outs):
            self._row(op_name, None, ref_dtype, f"{len(dev_outs)} outputs vs {len(ref_outs)} in the reference")
            raise OpCheckFailed(f"{self.name}: output count differs from the reference")
        if len(cpu_outs) != len(ref_outs):
            cpu_outs = [None] * len(ref_outs)
        depth = noise.depth_of(_tensors([*ref_args, *ref_kwargs.values()]), _tensors(ref_outs))
        verdict = combine_verdicts([judge_output(d, r, c, depth) for d, r, c in zip(dev_outs, ref_outs, cpu_outs)])
        self._row(op_name, verdict, ref_dtype, verdict.reason)
        if not verdict.is_pass:
            raise OpCheckFailed(f"{self.name} ({op_name} on {self.device}): {verdict.reason}")
        return verdict

    def _skip_unless_device_runs(self) -> None:
        """A device this machine cannot reach (``--device cuda`` without CUDA) skips every test."""
        try:
            torch.empty(0, device=self.device)
        except (RuntimeError, AssertionError) as e:
            self._skip("", f"device {self.device} is not available here: {str(e).splitlines()[0]}")

    def _skip(self, op_name: str, reason: str) -> None:
        """A test that cannot run on the device under test is a SKIP with its reason, never a FAIL."""
        import pytest

        self._row(op_name, None, "", f"skipped: {reason}")
        pytest.skip(reason)

    def _row(self, op_name: str, verdict: OutputVerdict | None, ref_dtype: str, error: str) -> None:
        row = make_row(self.name, op_name, verdict, ref_dtype=ref_dtype, device=str(self.device), error=error)
        if self.on_row is not None:
            self.on_row(row)


_NO_KERNEL = ("Could not run", "not implemented for", "no kernel", "NotImplementedError")


def _no_kernel(e: BaseException) -> str | None:
    """The first line of an error that says the device has no kernel for this op, else None."""
    text = f"{type(e).__name__}: {e}"
    return text.splitlines()[0][:300] if isinstance(e, NotImplementedError) or any(m in text for m in _NO_KERNEL) \
        else None


class _PublicOp:
    """A kernel family member called as the family's public op (numerics/kernel_families.py):
    ``_scaled_dot_product_flash_attention_for_cpu`` becomes F.scaled_dot_product_attention, so
    each device picks its own kernel; only the outputs the family shares are compared."""

    def __init__(self, op: torch._ops.OpOverload, names: list[str], reference) -> None:
        self.op, self.names, self.reference = op, names, reference

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.reference({**dict(zip(self.names, args)), **kwargs})

    def __str__(self) -> str:
        return str(self.op)


def public_form(op: Any) -> tuple[Any, Any]:
    """(what the device runs, what the CPU references run): ``op`` itself for both, or its
    family's public op for both where it is a device-specific kernel, or, where the family's
    reference is a closed form (kernel_families.runs_public_op), ``op`` on the device and the
    closed form on CPU."""
    reference = reference_of(str(op)) if isinstance(op, torch._ops.OpOverload) else None
    if reference is None or packet(str(op)) in _PUBLIC:
        return op, op
    public = _PublicOp(op, [a.name for a in op._schema.arguments], reference)
    return (public, public) if runs_public_op(str(op)) else (op, public)


_PUBLIC = frozenset(("aten.scaled_dot_product_attention", "aten.layer_norm", "aten.rms_norm", "aten.batch_norm", "aten.conv1d",
                     "aten.conv2d", "aten.conv3d", "aten.convolution"))


def _run_reference(op: torch._ops.OpOverload, ref_args: list, ref_kwargs: dict, cpu_args: list,
                   cpu_kwargs: dict) -> tuple[Any, str]:
    """The op in fp64 on CPU; an op that refuses wider inputs (``_softmax(half_to_float=True)``)
    runs at the same dtype on fresh copies, and the ref_dtype column says ``(same)``."""
    try:
        return op(*ref_args, **ref_kwargs), "upcast"
    except Exception:
        ref_args[:] = to_cpu(cpu_args)
        ref_kwargs.update({k: to_cpu(v) for k, v in cpu_kwargs.items()})
        return op(*ref_args, **ref_kwargs), "same"


def _tensors(v: list) -> list[torch.Tensor]:
    return [t for t in _flat(v) if isinstance(t, torch.Tensor)]


def _widened(cpu_inputs: list, ref_inputs: list) -> bool:
    """Whether any reference input tensor is wider than the device's."""
    return any(c.dtype != r.dtype for c, r in zip(_tensors(cpu_inputs), _tensors(ref_inputs)))


def _dtype_name(v: Any) -> str:
    return dtype_name(v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__


def _flat(v: Any) -> list:
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _flat(item)]
    return [] if v is None else [v]


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
