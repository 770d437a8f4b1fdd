"""A half-precision elementwise op's self-check at record time: every output element against the
op run again on the call's inputs in float32, rounded to the output's dtype.

A statistics-only record of an elementwise op (add, mul, silu, pow, where...) is judged by
compare on its statistics and its sample (compare/sample_local.py), which sees a fault in a
fraction f of the elements with probability 1 - (1 - f)^32. Under bf16 neither sees three
doubled elements of a residual add of 524,288: its statistics move within bf16's band, its
sample misses them, yet the model's output moves by several percent. This check reads every
element. Its residual is the largest error of one element,

    max_i |y_i - r_i| / max(|r_i|, rms(r) / 16),

``r`` the float32 result rounded to the output's dtype: another kernel than the one checked (the
float32 one), on inputs converted exactly. A right kernel reads 0, or one unit of its dtype's
roundoff where it rounds twice (float32, then half); a doubled element reads 1. An element far
below the tensor's scale is measured against a sixteenth of its RMS: its error there is not a
relative one (a difference that cancels). A value NaN or infinite on one side only reads 1.
Where every element equals the reference (one pass, on the host) the residual is 0 with no more.

Half precision only. A float32 output's only reference cheaper than 20 to 100 times the op would
be the same kernel run again (torch's float64 ``silu`` and ``sin`` on CPU take about 25 ns an
element), which cannot see a kernel wrong the same way every time; and float32's tolerance is
fine enough that its statistics see three doubled elements. Its whole-tensor errors are the
sample's (recomputed in float64 by compare).

Not checked: ops that round a quotient they computed (remainder, fmod, a division with a
rounding mode), whose result jumps a whole unit at a last-bit difference; random ops; in-place
and ``out=`` calls (their inputs no longer hold what they read); tensor subclasses.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ..numerics.rules import PRECISION_STEPS

# aten ops that round a value they computed to a whole number (a quotient's floor): a last-bit
# difference in that value, between two right kernels, moves the result a whole unit. (Those that
# round an argument, floor or round, are exact: both runs read the same argument.)
ROUNDS_A_RESULT = frozenset({"remainder", "fmod", "floor_divide"})
HALF = (torch.float16, torch.bfloat16)
SCALE_FRACTION = 16  # elements below rms / 16 are measured against it
_NO_STEPS = (math.nan,) * len(PRECISION_STEPS)  # an elementwise op has no reduced-precision step


@functools.lru_cache(maxsize=4096)
def pointwise_op(name: str) -> torch._ops.OpOverload | None:
    """The OpOverload of ``name`` (``aten.add.Tensor``) where this check takes its calls: torch's
    ``Tag.pointwise``, functional, not random, not rounding a quotient; else None."""
    parts = name.split(".") if isinstance(name, str) else ()
    if len(parts) != 3 or parts[0] != "aten" or parts[1] in ROUNDS_A_RESULT or "out" in parts[2]:
        return None
    try:
        func = getattr(getattr(torch.ops.aten, parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        return None
    if not isinstance(func, torch._ops.OpOverload) or torch.Tag.pointwise not in func.tags \
            or torch.Tag.nondeterministic_seeded in func.tags or func._schema.is_mutable:
        return None
    return func


def elementwise_check(name: str, bound: dict, out: torch.Tensor, defer: bool = False) -> Any:
    """(residual, NaN...) of an elementwise call with a half-precision output (``bound``: its
    arguments by schema name), as self_check.self_checks gives a check; ``defer`` (an
    accelerator's call): the same as a float64 tensor on the output's device, read at the next
    flush. None where this does not check it."""
    func = pointwise_op(name)
    if func is None or out.dtype not in HALF or bound.get("rounding_mode") is not None:
        return None
    args = {}
    for key, value in bound.items():
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
                return None
            # exact from half precision; a float64 argument stays (its values are its own)
            value = value.float() if value.dtype in HALF else value
        elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return None
        args[key] = value
    ref = func(**args)
    if not isinstance(ref, torch.Tensor) or ref.shape != out.shape:
        return None
    ref = ref.to(out.dtype)
    if out.is_cpu and not defer and float((out - ref).abs_().max()) == 0:  # (NaN, Inf: measured below)
        return (0.0, *_NO_STEPS)
    residual = _largest_error(out.float(), ref.float())
    if defer:
        return torch.cat([residual.to(torch.float64).reshape(1),
                          torch.full((len(_NO_STEPS),), math.nan, dtype=torch.float64, device=out.device)])
    return (float(residual), *_NO_STEPS)


def _largest_error(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The module docstring's residual as a 0-d tensor; 1 for a value non-finite on one side only."""
    diff = (got - ref).abs_().masked_fill_((got == ref) | (got.isnan() & ref.isnan()), 0)
    size = ref.abs().nan_to_num_(0.0, 0.0, 0.0)
    floor = torch.linalg.vector_norm(size) / (math.sqrt(max(1, size.numel())) * SCALE_FRACTION)
    size = torch.maximum(size, floor.clamp_min(torch.finfo(got.dtype).tiny))
    return (diff / size).nan_to_num_(1.0, 1.0, 1.0).max()
