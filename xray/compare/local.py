"""Local error: recompute one op on the target's own recorded inputs, on CPU.

Accumulated error (target vs bench) says *that* a value differs; local error says whether this op
computed correctly given what it received: the target's output against a float64 recomputation
of the same call. Its noise floor is what CPU itself makes at the target's dtype on those inputs
(torch._dynamo's ``same()`` fp64 idea, per op). Reduced-precision steps (inputs rounded to a
10-bit or 7-bit mantissa, as TF32/fp16/bf16 math does) give the error a legitimate precision
change would make, so a consistent precision loss can be told from a bug.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..dump.model import Record, TensorMeta, iter_tensors
from ..dump.tensorio import dtype_from_name
from ..ops.rebuild import build_call, check_call, check_outputs, load_tensor, named_args, rebuild_with
from ..ops.nondeterminism import nondeterministic
from ..numerics.metrics import normwise_error
from ..numerics.rules import PRECISION_STEPS, eps, round_mantissa
from ..numerics.kernel_families import local_reference_of, primary_outputs
from ..numerics.selections import differing_picks, selection_of
from ..record.encode import bind_inputs, op_info, recorded_result
from ..record.elementwise_check import rerun_op
from ..record.self_check import CONVOLUTIONS as CHECKED_CONVOLUTIONS, MATMULS as CHECKED_MATMULS

MAX_NUMEL = 1 << 22  # recompute only ops whose tensors are this small (CPU float64 must stay quick)


@dataclass
class LocalError:
    """Errors of one output against the float64 recomputation (normwise, see normwise_error)."""

    local: float  # the target's recorded output (integers: the share of elements that differ)
    floor: float  # CPU at the target's dtype
    dtype: torch.dtype  # the target output's dtype
    steps: dict[str, float] = field(default_factory=dict)  # precision step name -> its error
    # terms the measurement itself summed in float32 (a self-check's product with its output's
    # width), whose rounding Floors.floor allows besides the kernel's own
    own_terms: int = 1
    # what measured it where a row's note should say so (an elementwise self-check: every element)
    seen_by: str = ""


def _blocked(record: Record) -> str | None:
    """Why an op must not be re-run here, or None: nothing random or uninitialised (the check
    replay and gen share, xray.ops.nondeterminism). An op that writes its arguments (``addcmul_``,
    ``_foreach_addcdiv_``, ``_fused_adamw_``) is re-run on copies of the inputs recorded before
    its call. Views are re-run: they move numbers, so their local error is 0 unless the target
    moved them wrongly."""
    if record.kind != "op":
        return "not an op call"
    return nondeterministic(record)


def _known(meta: TensorMeta) -> bool:
    """Whether an input's values are known: saved, or a finite constant its statistics hold whole."""
    return meta.data is not None or constant_value(meta) is not None


def _tensors_saved(record: Record) -> bool | None:
    """True: every input tensor known (saved, or a constant: an AdamW denominator of float16
    zeros); None: some, not all (X_DUMP_NUM spent: a layer norm backward has six); False: none,
    or one too large to recompute."""
    metas = [m for _, m in record.input_tensors()]
    if any(m.numel > MAX_NUMEL for m in metas):
        return False
    known = sum(_known(m) for m in metas)
    return True if known == len(metas) else None if known else False


def _rebuilt(record: Record, dump: Any, draw: int | None) -> tuple:
    """``build_call(record, dump)`` with a constant input filled with its one value, and every other
    unsaved input drawn: ``draw`` None leaves none (all known), 0 fills zeros, a seed draws normal
    values (or 0/1) independently of its statistics."""
    gen = torch.Generator().manual_seed(draw or 0)

    def tensor(meta: TensorMeta) -> torch.Tensor:
        if meta.data is not None:
            return load_tensor(meta, dump)
        dtype, shape = dtype_from_name(meta.dtype), tuple(meta.shape)
        if (value := constant_value(meta)) is not None:
            return torch.full(shape, value, dtype=dtype)
        if draw is None:
            raise ValueError(f"input of {record.op} unsaved")
        if not draw:
            return torch.zeros(shape, dtype=dtype)
        if dtype.is_floating_point or dtype.is_complex:
            return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
        return torch.randint(0, 2, shape, generator=gen).to(dtype)

    return rebuild_with(record, tensor)


def _unsaved_unread(record: Record, dump: Any, k: int) -> tuple | None:
    """The call rebuilt with its unknown inputs drawn, when output ``k`` is the same whatever they
    hold: zeros and two independent random draws give the same bits (a layer norm's backward reads
    its bias for its shape only). A kernel that reads them cannot pass this, not even where random
    values round away (``x + t1 / t2`` in float16 with tiny t1: zeros give Inf). Else None."""
    calls = [_rebuilt(record, dump, draw) for draw in (1, 2, 0)]
    first, *others = (runner(record.op, *call, k)(lambda t: t) for call in calls)
    same = first is not None and all(o is not None and o.shape == first.shape and torch.equal(o, first) for o in others)
    return calls[0] if same else None


def _convert(v: Any, fn, copy: bool = False) -> Any:
    """``fn`` applied to every floating tensor of ``v``; ``copy``: every tensor a fresh one."""
    if isinstance(v, torch.Tensor):
        t = fn(v) if v.is_floating_point() else v
        return t.clone() if copy else t
    if isinstance(v, (list, tuple)):
        return type(v)(_convert(x, fn, copy) for x in v)
    if isinstance(v, dict):
        return {key: _convert(x, fn, copy) for key, x in v.items()}
    return v


def _tensors(v: Any) -> list[torch.Tensor]:
    """The tensors of a result in the order the dump lists its outputs (nested lists flattened)."""
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    return []


def _output(out: Any, k: int) -> torch.Tensor | None:
    flat = _tensors(out)
    return flat[k] if k < len(flat) else None


def _call(func, args: tuple, kwargs: dict) -> Any:
    """The call's result as the recorder took it (an op that returns nothing but writes its
    arguments: the written arguments)."""
    out = func(*args, **kwargs)
    info = op_info(func)
    return recorded_result(info, out, bind_inputs(info, args, kwargs)) if info.written_results else out


def runner(op: str, func, args: tuple, kwargs: dict, k: int):
    """``run(convert)``: output ``k`` of the call on converted inputs. A kernel family's member
    (a CUDA attention kernel, a fused norm) is run as its family's public op, so every device's
    kernel is judged against one device-neutral reference (kernel_families.py), on what the
    kernel reads (an attention backward: its forward's saved logsumexp and output)."""
    reference = local_reference_of(op)
    shared = primary_outputs(op)
    if reference is not None and (shared is None or k < shared):
        names = [a.name for a in func._schema.arguments]
        values = {**dict(zip(names, args)), **kwargs}

        def run(fn) -> torch.Tensor | None:
            with torch.no_grad():
                return _output(reference(_convert(values, fn)), k)

        return run

    if func._schema.is_mutable:  # each run writes fresh copies: the loaded inputs stay as recorded
        def run(fn) -> torch.Tensor | None:
            with torch.no_grad():
                return _output(_call(func, _convert(args, fn, copy=True), _convert(kwargs, fn, copy=True)), k)

        return run

    def run(fn) -> torch.Tensor | None:
        with torch.no_grad():
            return _output(func(*_convert(args, fn), **_convert(kwargs, fn)), k)

    return run


def constant_value(output: TensorMeta) -> float | None:
    """The one value of an output whose statistics describe it whole (a finite constant: a
    scalar, a filled mask), or None. Such an output needs no saved data to be judged."""
    st = output.stats
    if st is None or st.min is None or st.max is None or st.nan or st.posinf or st.neginf or output.numel < 1:
        return None
    return st.min if st.min == st.max else None


def _recomputable(output: TensorMeta) -> bool:
    """Whether a recomputation has the target's values to measure: saved, or a constant (above)."""
    return output.data is not None or constant_value(output) is not None


def measurable(output: TensorMeta, op: str | None) -> bool:
    """Whether ``local_error`` can judge output ``output`` of a call of ``op``: recomputable, or
    with a recorded self-check that measures it whole (an elementwise op's largest error of one
    element is weighed beside its sample instead: causality._unsaved_local_error)."""
    return _recomputable(output) or (rerun_op(op) is None and checked_error(output, op) is not None)


def checked_error(output: TensorMeta, op: str | None = None) -> LocalError | None:
    """A checked op's recorded self-check as its local error (xray/record/self_check.py: its
    normwise error against its own inputs, taken on its device), for
    a call compare cannot re-run: its inputs kept with statistics only. Its floor is the output's
    own rounding (unit roundoff / sqrt(3), the normwise error of rounding uniformly); the
    accumulation bound and the precision steps it measured (TF32's, bf16's) are the Floors'.
    A matmul's or a convolution's check (``op``) sums its output's width (columns, channels) in
    float32 (``own_terms``): an (8, 8192) product of 8 terms reads 2.6e-6 where the kernel's own
    8-term bound is 6.7e-7."""
    check = output.check
    if not check or not math.isfinite(check[0]):
        return None
    dtype = dtype_from_name(output.dtype)
    if rerun_op(op) is not None:  # its largest error of one element
        return LocalError(check[0], elementwise_check_floor(dtype), dtype, seen_by=ELEMENTWISE_CHECK)
    steps = {name: v for name, v in zip(PRECISION_STEPS, check[1:]) if math.isfinite(v)}
    axis = -1 if op in CHECKED_MATMULS else 1 if op in CHECKED_CONVOLUTIONS else None
    width = output.shape[axis] if axis is not None and len(output.shape) > 1 else 1
    return LocalError(check[0], check_floor(dtype), dtype, steps, own_terms=max(1, int(width)))


# A passing row made a warning by its target call's self-check alone (engine._suspect_self_checks):
# attribution fails it where that local error is beyond its floors, and passes it again where not.
CHECK_SUSPECT = "its self-check reads more than its dtype's rounding"
# A passing row whose call's non-tensor arguments differ from the bench's (engine._suspect_arguments):
# attribution fails it where they make another computation, and passes it again where not.
ARGUMENT_SUSPECT = "its call's arguments differ from the bench's"


def check_floor(dtype: torch.dtype) -> float:
    """A self-check's own floor at ``dtype``: the normwise error of rounding to it uniformly."""
    return eps(dtype) / 2 / math.sqrt(3)


ELEMENTWISE_CHECK = "its self-check, which reads every element"  # (LocalError.seen_by)


def reads_right(le: LocalError | None) -> bool:
    """An elementwise self-check that found every element within one machine epsilon of its
    reference: the call computed right on its inputs, as its saved tensors would show (a right
    kernel reads 0, or a unit where it rounds twice). Finer than its floor, which in float32
    judges gross errors only (``elementwise_check_floor``): a check between the two says nothing
    either way."""
    return le is not None and le.seen_by == ELEMENTWISE_CHECK and le.local <= eps(le.dtype)


def elementwise_check_floor(dtype: torch.dtype) -> float:
    """An elementwise self-check's own floor (record/elementwise_check.py: the largest error of
    one element): ``check_floor`` of its dtype, never below half precision's. A right
    half-precision kernel reads 0 or one unit. A float32 one is measured against float64, and a
    transcendental function may be off by far more than a unit there (torch's own CPU ``gelu``:
    2.3e-5 at some elements, 190 units of float32's roundoff): in float32 the check judges only
    errors beyond half precision's (a doubled element reads 1; whole-tensor errors are the
    sample's)."""
    return check_floor(dtype if eps(dtype) >= eps(torch.float16) else torch.float16)

def _target_values(dump: Any, output: TensorMeta) -> torch.Tensor:
    if output.data is not None:
        return dump.load_tensor(output).reshape(output.shape)
    return torch.full(tuple(output.shape), constant_value(output), dtype=dtype_from_name(output.dtype))


def local_error(record: Record, dump: Any, output: TensorMeta, k: int, *, steps: bool = True,
                checked: bool = True) -> LocalError | None:
    """Local error of output ``k`` (its meta ``output``) of ``record``, or None when the call
    cannot be rebuilt safely from saved tensors (an input left unsaved counts only where the
    output does not read its values: ``_unsaved_unread``). A constant output recorded with statistics only
    (``finfo(float16).min`` made by ``scalar_tensor``) is judged from its statistics: they hold
    its every value. A checked op (a matmul, a sum...) whose inputs are not all known, or whose recomputation
    cannot run, is judged by its recorded self-check (``checked_error``; not where ``checked`` is
    False: a call re-run with other arguments than those it was checked with).

    A dump that is several runs put back together (a sharded run, ``unshard.UnshardedRun``) says
    itself what its calls computed on their inputs (``own_local_error``): each rank's call on the
    inputs that rank held, not the rebuilt call on one rank's copy of a replicated input."""
    own = getattr(dump, "own_local_error", None)
    if own is not None and (got := own(record, k, steps=steps)) is not None:
        return got
    saved, check = _tensors_saved(record), checked_error(output, record.op) if checked else None
    if saved is not True and check is not None:  # measured on the device, on every input
        return check
    got = _recomputed(record, dump, output, k, saved, steps)
    return got if got is not None else check  # a reference that refuses these inputs: the check


def _recomputed(record: Record, dump: Any, output: TensorMeta, k: int, saved: bool | None,
                steps: bool) -> LocalError | None:
    """``local_error`` by re-running the call on CPU (float64 and the target's dtype), or None."""
    if not _recomputable(output) or output.numel > MAX_NUMEL or _blocked(record) or saved is False:
        return None
    try:
        every_saved = all(m.data is not None for _, m in record.input_tensors())
        check_call(record, dump, factory="load" if every_saved else "auto")
        check_outputs(record)  # an edited size or repeat count would compute (in float64) what was never recorded
        call = (build_call(record, dump, factory="load") if every_saved else _rebuilt(record, dump, None) if saved
                else _unsaved_unread(record, dump, k))
        if call is None:  # some inputs unknown, and read
            return None
        func, args, kwargs = call
        run, target = runner(record.op, func, args, kwargs, k), _target_values(dump, output)
        if selection_of(record.op, k) is not None:
            return _selection_error(record.op, k, named_args(func, args, kwargs), run, target)
        return measure(run, target, steps=steps)
    except Exception:  # noqa: BLE001 -- any op may refuse float64 or these inputs: no local error then
        return None


def _selection_error(op: str, k: int, arguments: dict[str, Any], run, target: torch.Tensor) -> LocalError | None:
    """An index output (a sort's, an argmax's) is right on its inputs where it picks the values the
    call picks, whichever of equal values it names (``numerics.selections``)."""
    native = run(lambda t: t)
    if native is None or native.shape != target.shape:
        return None
    wrong = differing_picks(op, k, arguments, native, target)
    if wrong is None:
        return None
    return LocalError(float(wrong.double().mean()) if wrong.numel() else 0.0, 0.0, target.dtype)


def measure(run, target: torch.Tensor, *, steps: bool = True) -> LocalError | None:
    """The ``LocalError`` of ``target`` (the values the target recorded, in its dtype) against
    ``run`` (``runner``'s: the call on converted inputs), or None where the call gives no
    comparable result. Shared by saved tensors (``local_error``) and samples (sample_local.py)."""
    if not target.is_floating_point():
        # Integer results (pooling indices, argmax, positions) are exact: right on these inputs
        # or not. A tie broken another way after bf16 rounding upstream is right on its inputs.
        native = run(lambda t: t)
        if native is None or native.shape != target.shape or native.dtype != target.dtype:
            return None
        wrong = float((native != target).double().mean()) if target.numel() else 0.0
        return LocalError(wrong, 0.0, target.dtype)
    exact = run(lambda t: t.to(torch.float64))
    native = run(lambda t: t)
    if exact is None or native is None or exact.numel() != target.numel():
        return None
    result = LocalError(normwise_error(target, exact), normwise_error(native, exact), target.dtype)
    if steps and target.dtype in (torch.float32, torch.float64) and result.local > result.floor:  # else not needed
        for name, bits in PRECISION_STEPS.items():
            rounded = run(lambda t, b=bits: round_mantissa(t, b))
            if rounded is not None:
                result.steps[name] = normwise_error(rounded, exact)
    return result



class _Sides:
    """The target dump, reading the tensors of the arguments taken from the bench in the bench's."""

    def __init__(self, target: Any, bench: Any, bench_metas: set[int]) -> None:
        self.target, self.bench, self.bench_metas = target, bench, bench_metas

    def _of(self, meta: Any) -> Any:
        return self.bench if id(meta) in self.bench_metas else self.target

    def load_tensor(self, meta: Any) -> torch.Tensor:
        return self._of(meta).load_tensor(meta)

    def has_data(self, meta: Any) -> bool:
        return self._of(meta).has_data(meta)

    def dataset(self, meta: Any) -> Any:
        return self._of(meta).dataset(meta)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def local_error_with(record: Record, dump: Any, output: TensorMeta, k: int, arguments: dict[str, Any],
                     arguments_dump: Any) -> LocalError | None:
    """``local_error`` of output ``k`` against the call re-run on the target's inputs with
    ``arguments`` in place of its own: the bench's (a scale, an eps, an attention mask the target
    dropped), their tensors read from ``arguments_dump``. A target output that agrees with its own
    arguments but not with these computed what another call asks for."""
    taken = {id(m) for name, v in arguments.items() for _, m in iter_tensors(v, name)}
    if taken and arguments_dump is None:
        return None
    call = dataclasses.replace(record, inputs={**record.inputs, **arguments})
    # (never the recorded self-check: it was measured with the target's own arguments)
    return local_error(call, _Sides(dump, arguments_dump, taken), output, k, steps=False, checked=False)
