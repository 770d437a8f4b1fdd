"""An elementwise op's self-check at record time: every output element against the op run again
on the call's inputs by another kernel, rounded to the output's dtype.

A statistics-only record of an elementwise op (add, mul, silu, pow, where...) is judged by
compare on its statistics and its sample (compare/sample_local.py), which sees a fault in a
fraction f of the elements with probability 1 - (1 - f)^32. Where a run computes in half
precision, neither sees three doubled elements of a residual add of 524,288: its statistics move
within the band half precision's rounding makes, its sample misses them, yet the model's output
moves by several percent. This check reads every element. Its residual is the largest error of
one element,

    max_i |y_i - r_i| / max(|r_i|, rms(r) / 16),

``r`` the reference rounded to the output's dtype. A right kernel reads 0, or a unit or so of
its dtype's roundoff where it rounds twice or approximates a transcendental; a doubled element
reads 1. An element far below the tensor's scale is measured against a sixteenth of its RMS:
its error there is not a relative one (a difference that cancels). No element is measured
against less than its dtype's smallest normal: below it rounding moves values by absolute steps
(gradual underflow: a float16 gradient of 1e-6 keeps two or three bits). A value NaN or infinite on
one side only reads 1. Where every element equals the reference (one pass, on the host) the
residual is 0 with no more.

Which calls, and against what:

- a half-precision output: the op in float32, on inputs converted exactly (another kernel);
- a float32 output in a run that computes in half precision somewhere (autocast's float32 ops:
  a residual stream, a norm, their gradients; ``mixed``): the op in float64 (another kernel),
  where the device has it;
- a float32 output of at most ``SMALL_OUTPUT`` elements, in any run: the op in float64. Its
  32-element sample reads a large share of it yet can miss the one element that makes a
  statistic (a router's division whose smallest divisor becomes the output's minimum), and the
  check costs about what its fixed part does there (40 to 170 us on CPU);
- any other float32 output in a run all float32: none. Its statistics compare at float32's
  tolerance, which three doubled elements exceed, and the check would cost a float64 run of every
  op (torch's float64 ``silu`` and ``sin`` take about 25 ns an element on CPU).

Softmax (and ``_safe_softmax``, the one a decomposed attention calls, 0 on a row all masked),
log-softmax and GLU, and their backwards, are checked alike: not tagged pointwise (an
output element reads its row, or two elements), they cost what an elementwise op costs to run
again whole, and their statistics under half precision hide a few wrong elements as well.

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
from ..ops.nondeterminism import op_kind
from ..ops.rebuild import UnknownOpError, is_pointwise, resolve_op

# aten ops that round a value they computed to a whole number (a quotient's floor): a last-bit
# difference in that value, between two right kernels, moves the result a whole unit. (Those that
# round an argument, floor or round, are exact: both runs read the same argument.)
ROUNDS_A_RESULT = frozenset({"remainder", "fmod", "floor_divide"})
HALF = (torch.float16, torch.bfloat16)
SCALE_FRACTION = 16  # elements below rms / 16 are measured against it
SMALL_OUTPUT = 4096  # float32 outputs of at most so many elements are checked in any run
_NO_STEPS = (math.nan,) * len(PRECISION_STEPS)  # an elementwise op has no reduced-precision step
# ops not tagged pointwise whose output element reads one row of their inputs (a softmax's) or a
# fixed few elements (GLU's two halves): run again whole at an elementwise op's cost
ROW_OPS = frozenset({"aten._softmax.default", "aten._safe_softmax.default", "aten._log_softmax.default",
                     "aten.softmax.int", "aten.log_softmax.int", "aten._softmax_backward_data.default",
                     "aten._log_softmax_backward_data.default", "aten.glu.default", "aten.glu_backward.default"})


@functools.lru_cache(maxsize=4096)
def rerun_op(name: str) -> torch._ops.OpOverload | None:
    """The OpOverload of ``name`` (``aten.add.Tensor``) where this check takes its calls:
    pointwise (``rebuild.is_pointwise``) or of ROW_OPS, writing no argument, not random
    (``nondeterminism.op_kind``), not rounding a quotient; else None."""
    try:
        func = resolve_op(name)
    except UnknownOpError:  # (an unsafe op too)
        return None
    if func.namespace != "aten" or func._opname in ROUNDS_A_RESULT \
            or not (is_pointwise(func) or name in ROW_OPS) \
            or func._schema.is_mutable or op_kind(name) is not None:
        return None
    return func


def reference_dtype(out: torch.Tensor, mixed: bool) -> torch.dtype | None:
    """What an elementwise call with output ``out`` is run again in (the module docstring), or
    None: not checked."""
    if out.dtype in HALF:
        return torch.float32
    if out.dtype == torch.float32 and (mixed or out.numel() <= SMALL_OUTPUT) \
            and out.device.type in ("cpu", "cuda", "xpu"):
        return torch.float64
    return None


def elementwise_check(name: str, bound: dict, out: torch.Tensor, defer: bool = False, mixed: bool = False) -> Any:
    """(residual, NaN...) of an elementwise call (``bound``: its arguments by schema name), as
    self_check.self_checks gives a check; ``defer`` (an accelerator's call): the same as a
    float64 tensor on the output's device, read at the next flush; ``mixed``: the run computes
    in half precision somewhere. None where this does not check it."""
    func = rerun_op(name)
    wide = reference_dtype(out, mixed) if func is not None else None
    if wide is None or bound.get("rounding_mode") is not None:
        return None
    args = {}
    for key, value in bound.items():
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
                return None
            # exact from any narrower floating dtype; a wider argument keeps its values
            value = value.to(wide) if value.is_floating_point() and value.dtype != torch.float64 else value
        elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return None
        elif isinstance(value, torch.dtype) and value.is_floating_point and value != torch.float64:
            value = wide  # the dtype it computes in (a softmax's, its backward's input_dtype)
        elif key == "half_to_float":
            value = False  # (its inputs are no longer half precision)
        args[key] = value
    ref = func(**args)
    if not isinstance(ref, torch.Tensor) or ref.shape != out.shape:
        return None
    ref = ref.to(out.dtype)
    if out.is_cpu and not defer and float((out - ref).abs_().max()) == 0:  # (NaN, Inf: measured below)
        return (0.0, *_NO_STEPS)
    residual = _largest_error(out.to(wide), ref.to(wide), torch.finfo(out.dtype).tiny)
    if defer:
        return torch.cat([residual.to(torch.float64).reshape(1),
                          torch.full((len(_NO_STEPS),), math.nan, dtype=torch.float64, device=out.device)])
    return (float(residual), *_NO_STEPS)


def _largest_error(got: torch.Tensor, ref: torch.Tensor, tiny: float) -> torch.Tensor:
    """The module docstring's residual as a 0-d tensor; 1 for a value non-finite on one side only.
    ``tiny``: the output dtype's smallest normal, the least scale of an element."""
    diff = (got - ref).abs_().masked_fill_((got == ref) | (got.isnan() & ref.isnan()), 0)
    size = ref.abs().nan_to_num_(0.0, 0.0, 0.0)
    floor = torch.linalg.vector_norm(size) / (math.sqrt(max(1, size.numel())) * SCALE_FRACTION)
    size = torch.maximum(size, floor.clamp_min(tiny))
    return (diff / size).nan_to_num_(1.0, 1.0, 1.0).max()
