"""Attribution on statistics only: the rules that tell reduced-precision noise from a bug when
nothing can be recomputed (a statistics-only recording, the usual one on a device). Measured by
tests/test_stats_only_verdicts.py and tools/bench_accuracy.py (the ``/stats`` classes, and the
real CPU-vs-H100 pairs judged on their statistics alone); docs/compare.md, "Statistics-only dumps".

causality.attribute calls ``precision_loss`` and ``kind_outliers`` after its own pass, and
``selection_indices`` while deciding a failing row.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..dump.tensorio import dtype_from_name, dtype_name
from ..numerics.kernel_families import packet
from ..numerics.selections import selection_of
from ..numerics import sample_judge
from .sample_local import carried_on_sample
from ..numerics.rules import PRECISION_STEPS, Rules
from .entry_records import Entry
from .noise_floor import TF32, Floors, far_above, is_convolution, is_matmul_like, is_rnn, reduction_length
from .op_classes import is_gather, is_value_preserving
from .pending import FAILING, PRECISION, Pending, agreement, downgrade, input_error, row_inputs, set_origin
from .result import CompareRow, PairStatus


def kind_outliers(pending: list[Pending], rules: Any, kind_errors: Any) -> None:
    """Statistics only: a call whose statistics error is far above the calls of its kind on this
    run (noise_floor.far_above: median and MAD of the log errors, at least 4 calls) and not
    carried in by its inputs (they agree, or its error jumps beyond ``precision_factor`` x
    theirs) is wrong on its own, even where the run's tolerance (bf16, fp16) makes its row a
    warning: bf16 moves each matmul's statistics by ~3e-3 on one run, never one of them by 5e-2.
    Turned into a failure born there. Each kind's population is judged once (a million-record
    compare has thousands of warnings over a few kinds).

    A call whose own local error was measured (its self-check, or a recomputation) no larger
    than a CPU kernel's at its dtype computed right on its inputs: what its statistics carry came
    in with them, however a cancelling output magnifies it (MobileViT's bf16 attention gradient,
    256 dot products of 8 terms: 0.18 on its statistics, 0 on its self-check), so it is not
    judged by its kind here."""
    if kind_errors is None:
        return
    f = rules.precision_factor
    within = (PairStatus.PASS.value, PairStatus.WARNING.value, PairStatus.SKIP.value)
    candidates = []
    for p in pending:
        if is_value_preserving(p.target.op):
            continue
        candidates += [(p, k, r) for k, r in enumerate(p.rows) if r.status == PairStatus.WARNING.value
                       and r.mode == "stats" and not r.cause and r.stats_err
                       and all(s in within for _, _, s, _ in row_inputs(p, k))
                       and r.stats_err > f * math.prod(carried_error(p, k) or (0.0, 1.0))
                       and not _measured_right(p, k)]
    if not candidates:
        return
    populations = kind_errors([(p.target.pos, r) for p, _, r in candidates])
    far: dict[int, dict[int, float]] = {}  # population (by identity) -> row index -> factor
    for (p, k, r), calls in zip(candidates, populations):
        if id(calls) not in far:
            found = far_above([math.log(e) if e > 0 else -math.inf for _, e, _ in calls])
            far[id(calls)] = {calls[i][0]: factor for i, factor in found.items()}
        factor = far[id(calls)].get(r.index)
        if factor is not None:
            r.status, r.inputs_agree = PairStatus.FAIL.value, agreement(row_inputs(p, k))
            set_origin(r, "born", "local error", f"statistics only: its error {r.stats_err:.3g} is {factor:.3g}x the "
                                                 f"median of its kind's {len(calls)} calls on this run, and not carried "
                                                 "in by its inputs")


def _measured_right(p: Pending, k: int) -> bool:
    """Output ``k``'s local error was measured, and no larger than a CPU kernel's at its dtype:
    not the device floor, which a bf16 kernel 5 % off can sit under (a long sum's bound)."""
    le = p.local.get(k)
    return le is not None and k not in p.outlier and le.local <= le.floor


def precision_loss(pending: list[Pending], rules: Any, floors: Floors, entered_first: bool,
                   kind_errors: Any = None) -> None:
    """Statistics only, nothing recomputed: a kind that adds error of its own on several calls at
    one relative level is precision loss (TF32-like math on every matmul). A call adds its own
    error where it is born (its inputs agree) or, for a matmul, convolution or module, where its error
    jumps beyond ``precision_factor`` x its inputs' (a CNN or ViT has one born call, its first
    convolution, and rounds again at every later one). A matmul-like call born within the factor
    of TF32's rounding on a run whose recorded settings allowed TF32 for it sets the level too.
    Any unmeasured failing row within the factor of that level is a warning.

    Through a deep network the loss grows layer by layer beyond that level, and a statistic of a
    small or cancelling output moves more than its inputs' statistics do. So, in the order the
    calls finished (a row's inputs are settled before it; a module-dump module after the modules
    inside it, whose outputs make its own): a row whose disagreeing inputs carry no more than the
    factor times the loss accepted so far, and whose own error is within the factor of that loss,
    or of what its inputs carry plus one more rounding at the factor times the level (a matmul
    over 512 keys rounds again), carries the loss on. A jump beyond that is born there; a lone
    born call, a call above its kind's level, and every row fed by a bug's error stay failures."""
    f = rules.precision_factor

    level, shown_by = _run_level(pending, f, floors, kind_errors)
    if not level:
        return
    carried = level  # the largest error accepted as precision loss so far
    for p, inside in _completion_order(pending, entered_first):
        made = None
        if inside:  # a module of a module dump: its output is made by the modules inside it
            if any(r.status in FAILING for q in inside for r in q.rows):
                continue  # a bug inside: decided by the attribution above
            made = [r.stats_err for q in inside for r in q.rows if r.cause == PRECISION and r.stats_err]
        for k, r in enumerate(p.rows):
            if r.status == PairStatus.WARNING.value and r.mode == "stats" and r.stats_err and not r.cause:
                carried = max(carried, r.stats_err)  # within the dtype's spread by the judge itself
            if not unmeasured(r) or r.cause not in ("local error", "inherited"):
                continue
            inputs = input_error(p, k)
            if made is not None:
                inputs = max([inputs or 0.0] + made) or inputs
            err, at = r.stats_err, ""
            reduction = reduction_change(p, k)
            if reduction is not None:  # a cancelling sum: its n terms' independent roundings add up to sqrt(n) of one
                diff, scale, n, _ = reduction
                if diff / (scale * math.sqrt(n)) < err:
                    err, at = diff / (scale * math.sqrt(n)), " at its inputs' magnitude"
            if err <= f * level:
                downgrade(r, f"statistics only: within {f:g}x of the error {shown_by} shows "
                              f"({level:.3g}){at}, consistent precision loss")
            elif inputs is not None and inputs <= f * carried and err <= f * max(carried, inputs + f * level):
                downgrade(r, f"statistics only: its inputs carry precision loss ({inputs:.3g}, within {f:g}x of "
                              f"the {carried:.3g} accepted so far, which {shown_by} starts) and it adds no jump{at}")
            else:
                if r.cause == "inherited" and inputs is not None and inputs <= f * carried:
                    # what it received is precision loss; what it made of it is not
                    set_origin(r, "born", "local error", f"statistics only: its error {err:.3g}{at} jumps beyond "
                                                   f"{f:g}x what its inputs carry ({inputs:.3g}), on a run whose "
                                                   f"precision loss is {level:.3g}")
                continue
            carried = max(carried, err)


# Backward ops whose output subtracts a reduction of the incoming gradient (a normalization's,
# a softmax's): by the name of that gradient argument.
_CANCELLING = {"aten.native_layer_norm_backward": "grad_out", "aten.native_batch_norm_backward": "grad_out",
               "aten.native_group_norm_backward": "grad_out", "aten._fused_rms_norm_backward": "grad_out",
               "aten._softmax_backward_data": "grad_output", "aten._log_softmax_backward_data": "grad_output"}


# A sum of two tensors is a reduction of two terms: where they cancel (a norm's backward built
# of ops, x * rstd**2 * mean(...) against g * rstd), its output's relative error is theirs times
# how much smaller it is, so it is judged at their magnitude.
_TWO_TERM_SUMS = frozenset(("aten.add", "aten.sub", "aten.rsub"))

# Reductions that average what they sum (a norm's mean and variance, a pooled mean): an output of
# values of 1 is 1, not sqrt(n), when nothing cancels
_AVERAGES = frozenset(f"aten.{name}" for name in (
    "mean", "var", "std", "var_mean", "std_mean", "native_layer_norm", "native_group_norm",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "_fused_rms_norm", "avg_pool1d", "avg_pool2d", "avg_pool3d", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "adaptive_avg_pool1d"))


def _rms(stats: Any) -> float:
    """The RMS of a tensor from its statistics (hypot: finite where mean ** 2 would overflow)."""
    return math.hypot(stats.mean, stats.std or 0.0)


def summed_terms(e: Entry, k: int, gradient_rows: bool = False) -> tuple[list[Any], int] | None:
    """What output ``k`` of ``e`` sums, and over how many terms, or None when it is no sum: a
    reduction (fewer elements than its largest input), a sum of two tensors, and with
    ``gradient_rows`` any output of a norm's or softmax's backward (the rows of its incoming
    gradient, over its last dimension). A norm's backward sums that gradient alone. Not a
    matmul or convolution, nor a gather (an embedding's lookup: fewer elements than its table, but
    each copied), nor an item of a list result (a multi-tensor op's or a split's)."""
    if k >= len(e.outputs) or is_matmul_like(e.op) or is_convolution(e.op) or is_rnn(e.op) or is_gather(e.op) \
            or "." in e.outputs[k][0]:
        return None
    out = e.outputs[k][1]
    grad = _CANCELLING.get(packet(e.op))
    ins = [m for name, m in e.inputs if getattr(m, "stats", None) is not None and m.stats.mean is not None
           and (grad is None or name == grad)]
    if not ins:
        return None
    if gradient_rows and grad is not None:
        return ins, out.shape[-1] if out.shape else 1
    if packet(e.op) in _TWO_TERM_SUMS and len(ins) == 2:
        return ins, 2
    biggest = max(m.numel for m in ins)
    return (ins, max(1, biggest // max(1, out.numel))) if out.numel < biggest else None


def carried_error(p: Pending, k: int, disagreeing: bool = False) -> tuple[float, float] | None:
    """What the inputs of ``p`` carry into its output ``k`` (None: none was judged): (the largest
    input error, the factor its sum's cancellation grows it by). An input's error is its saved
    data's where it was judged so (``Pending.input_errors``), else the larger of its statistics'
    and its sample's, which its statistics can hide (a gradient through relu's mask, a third of it
    flipped, keeps them; a slice of half a tensor differs by more on statistics than the whole
    whose elements it keeps), and at least what the records that held its values before a view,
    a transpose or a cast measured on them (upstream_errors.py). In the unit of a row's
    ``stats_err`` and ``accumulated_err``: the largest difference over the bench's largest
    magnitude. ``disagreeing``: inputs that passed (or were skipped) carry nothing in."""
    bench, upstream = dict(p.bench.inputs), p.run.upstream_error
    errors = [max(e, sample_error(bench.get(name), meta), upstream(meta) if upstream is not None else 0.0)
              for name, meta, status, stat in row_inputs(p, k)
              if (e := p.input_errors.get(name, stat)) is not None
              and not (disagreeing and status in (PairStatus.PASS.value, PairStatus.SKIP.value))]
    if not errors:
        return None
    grown = cancellation(p, k)
    # an elementwise op's inputs' sampled differences pushed through the op itself, exactly: a
    # nonlinear op (rsqrt, a square) moves error between elements, which the inputs' own errors,
    # at their peak, cannot say
    marks = p.carried_on_sample
    if k not in marks:
        marks[k] = carried_on_sample(p.bench.record, p.target.record, p.target.outputs[k][1], k) \
            if k < len(p.target.outputs) else None
    return (max(max(errors), (marks[k] or 0.0) / grown), grown)


def cancellation(p: Pending, k: int) -> float:
    """How much a sum's cancellation grows its inputs' relative error into output ``k``'s, from
    the statistics (at least 1): a sum of n terms of random sign is sqrt(n) times a term; where the
    output is smaller than that, its terms cancel, and their errors do not (a weight gradient, a
    sum over tokens, a norm's mean of centred values). A matmul's terms are its two multiplied
    inputs' products (K of them, ``reduction_length``); a reduction's or a sum of two tensors' are
    its inputs (``summed_terms``); a fused attention backward's, its chained products
    (``attention_backward_terms``); a norm backward's input gradient, its scaled gradient
    (``norm_backward_terms``); any other op's output is its inputs' size: 1."""
    e = p.target
    out = e.outputs[k][1] if k < len(e.outputs) else None
    st = getattr(out, "stats", None)
    if st is None or st.mean is None:
        return 1.0
    made = _rms(st)
    ins = [m for _, m in e.inputs if getattr(m, "stats", None) is not None and m.stats.mean is not None]
    if is_matmul_like(e.op) and len(ins) >= 2:
        a, b = sorted(ins, key=lambda m: m.numel or 0)[-2:]  # its operands (an addmm's bias is the smallest)
        terms = math.sqrt(reduction_length(e.record, k)) * _rms(a.stats) * _rms(b.stats)
    elif (attention := attention_backward_terms(e, k)) is not None:
        terms = attention
    elif (norm := norm_backward_terms(e, k)) is not None:
        terms = norm
    elif (summed := summed_terms(e, k)) is not None:
        terms = math.sqrt(summed[1]) * max(_rms(m.stats) for m in summed[0])
        if packet(e.op) in _AVERAGES:  # a mean's terms are each 1/n of what it reads
            terms /= max(summed[1], 1)
    else:
        return 1.0
    if made <= 0:
        return math.inf if terms > 0 else 1.0
    return max(1.0, terms / made)


def attention_backward_terms(e: Entry, k: int) -> float | None:
    """The size output ``k`` (dQ, dK, dV) of a fused attention backward would have if its terms did
    not cancel, from its inputs' statistics; None when not such a call or a statistic is missing.

    With P = softmax(s·QKᵀ) and dP = dO·Vᵀ (√Dv·rms(dO)·rms(V) an element), the backward sums
    dQ = s·Σⱼ Pᵢⱼ(dPᵢⱼ − δᵢ)Kⱼ over S keys, dK = s·Σᵢ (same)·Qᵢ over L queries and dV = Σᵢ PᵢⱼdOᵢ.
    Each term is taken at P's uniform size 1/S: a sum of n such terms of random sign is √n terms.
    A peaked P makes dQ smaller still (δᵢ then equals the one dPᵢⱼ it weighs): that is the
    cancellation this measures, as a key whose every score is alike makes dQ ~1e-13 from terms
    of 1e-3 (Canary's cross-attention under a bf16 training step)."""
    if packet(e.op).rsplit(".", 1)[-1] not in _ATTENTION_BACKWARD or k > 2:
        return None
    named = dict(e.inputs)
    metas = [named.get(n) for n in (("grad_out_" if "grad_out_" in named else "grad_out"), "query", "key", "value")]
    if any(m is None or getattr(m, "stats", None) is None or m.stats.mean is None or len(m.shape) < 2
           for m in metas):
        return None
    d_out, q, key, v = metas
    length, width, keys, width_v = q.shape[-2], q.shape[-1], key.shape[-2], v.shape[-1]
    if not (length > 0 and width > 0 and keys > 0 and width_v > 0):
        return None
    scale = e.record.inputs.get("scale")
    scale = float(scale) if isinstance(scale, (int, float)) else 1.0 / math.sqrt(width)
    d_p = math.sqrt(width_v) * _rms(d_out.stats) * _rms(v.stats)
    if k == 0:
        return abs(scale) * d_p * _rms(key.stats) / math.sqrt(keys)
    if k == 1:
        return abs(scale) * d_p * _rms(q.stats) * math.sqrt(length) / keys
    return _rms(d_out.stats) * math.sqrt(length) / keys


def norm_backward_terms(e: Entry, k: int) -> float | None:
    """The size a norm backward's input gradient (output 0) would have if its terms did not cancel,
    from its inputs' statistics; None when not such a call or a statistic is missing.

    With x̂ = (x - mean)·rstd, the input gradient is rstd·(w·g - mean(w·g) - x̂·mean(w·g·x̂)): its
    terms are rstd·w·g an element, and the two means take away what g shares with 1 and x̂. A
    gradient that is mostly along them (an embedding's norm, whose rstd is ~60) cancels to ~1/30
    of its terms under a bf16 training step, and its relative error grows as much."""
    if k != 0 or _CANCELLING.get(packet(e.op)) != "grad_out":  # (a batch norm backward has no rstd)
        return None
    named = dict(e.inputs)
    grad, rstd, weight = named.get("grad_out"), named.get("rstd"), named.get("weight")
    if any(m is None or getattr(m, "stats", None) is None or m.stats.mean is None for m in (grad, rstd)):
        return None
    scale = _rms(weight.stats) if weight is not None and getattr(weight, "stats", None) is not None \
        and weight.stats.mean is not None else 1.0
    return _rms(grad.stats) * _rms(rstd.stats) * scale


# Fused attention backwards (dQ, dK, dV first): CPU's flash, CUDA's flash, efficient and cuDNN
_ATTENTION_BACKWARD = frozenset(f"_scaled_dot_product_{kind}_backward" for kind in (
    "flash_attention_for_cpu", "flash_attention", "efficient_attention", "cudnn_attention"))


def sample_error(bench: Any, target: Any) -> float:
    """sample_judge's ``sample_err`` of two sampled tensors (0.0 without a sample on both sides)."""
    b, t = getattr(getattr(bench, "stats", None), "sample", None), getattr(getattr(target, "stats", None), "sample", None)
    err = sample_judge.judge_one(b, t, 0.0, 0.0, 0.0, math.nan, Rules())[1]  # (the rules set no part of it)
    return 0.0 if err is None else err


def reduction_change(p: Pending, k: int) -> tuple[float, float, int, Any] | None:
    """Output ``k`` of a sum (``summed_terms``: a norm's mean and rstd, a sum of two tensors), judged
    at its *inputs'* magnitude: (the largest difference of its min/max/mean/std between the runs,
    the inputs' RMS, the terms each element sums, the output's dtype). A mean of values of 1 that
    cancels to 4.6e-5 moves by what its inputs' rounding moves a sum of 1s, however large
    relative to 4.6e-5. None when not such a row."""
    summed = summed_terms(p.target, k)
    if summed is None or k >= len(p.bench.outputs):
        return None
    bm, tm = p.bench.outputs[k][1], p.target.outputs[k][1]
    if bm.stats is None or tm.stats is None or bm.stats.mean is None or tm.stats.mean is None:
        return None
    try:
        dtype = dtype_from_name(tm.dtype)
    except ValueError:
        return None
    ins, n = summed
    scale = max(_rms(m.stats) for m in ins)
    diff = stats_difference(bm.stats, tm.stats)
    if not (math.isfinite(diff) and scale > 0):
        return None
    return diff, scale, n, dtype


def stats_difference(b: Any, t: Any) -> float:
    """The largest difference of min/max/mean/std between two runs' statistics of one tensor."""
    return max((abs(getattr(b, a) - getattr(t, a)) for a in ("min", "max", "mean", "std")
                if getattr(b, a) is not None and getattr(t, a) is not None), default=math.nan)


def folded_sum(rep: Entry, carried: float, arg: Any, out_b: Any, out_t: Any, factor: float) -> str | None:
    """A call de-dup folded into ``rep``'s record, judged as ``reduction_change`` judges a
    recorded sum: its output's difference between the runs (statistics ``out_b``, ``out_t``, seen
    where a recorded call reads it), at its terms' magnitude (the RMS of ``arg``, the statistics
    of the argument a recorded call made) and over the terms each element sums (from ``rep``: a folded call has
    its record's shapes), within ``factor`` x the relative error its argument ``carried``. A
    key bias's gradient, the sum over positions of a key gradient that carries TF32's loss, is
    0 in exact arithmetic and differs 100 % between runs; at its terms' magnitude it moves by
    what they carry. The reason, or None."""
    summed = summed_terms(rep, 0)
    scale = _rms(arg) if arg is not None and arg.mean is not None else 0.0
    if summed is None or out_b is None or out_t is None or out_b.mean is None or out_t.mean is None \
            or not (scale > 0 and math.isfinite(carried)):
        return None
    n = summed[1]
    diff = stats_difference(out_b, out_t)
    at = diff / (scale * math.sqrt(max(n, 1)))
    if not math.isfinite(at) or at > factor * carried:
        return None
    return (f"a sum of {n} terms whose difference at their magnitude ({at:.3g}) is within {factor:g}x what "
            f"its argument carries ({carried:.3g})")


_PRODUCTS = frozenset(("aten.mul.Tensor", "aten.div.Tensor"))


def folded_product(rep: Entry, arg_b: Any, arg_t: Any, out_b: Any, out_t: Any, factor: float) -> str | None:
    """A call de-dup folded into ``rep``'s record, a product (``mul``/``div``: the relative errors
    of its factors add), judged by its first factor, the one the folds table names: ``arg_b`` and
    ``arg_t`` are that factor's statistics on each side, ``out_b``/``out_t`` the product's, seen
    where a recorded call reads it. The reason when the product's relative difference between the
    runs is within ``factor`` x its first factor's; else None. The other factor is not known, so
    it can only add: a difference beyond the first factor's stays unexplained. A norm backward's
    gradient times ``rstd``, folded into the forward's ``x * rstd``, carries the rounding of the
    gradient sum that cancels before it."""
    if rep.op not in _PRODUCTS or any(s is None or s.mean is None for s in (arg_b, arg_t, out_b, out_t)):
        return None
    scale_arg, scale_out = max(_rms(arg_b), _rms(arg_t)), max(_rms(out_b), _rms(out_t))
    if not (scale_arg > 0 and scale_out > 0):
        return None
    carried = stats_difference(arg_b, arg_t) / scale_arg
    moved = stats_difference(out_b, out_t) / scale_out
    if not (math.isfinite(carried) and math.isfinite(moved)) or moved > factor * carried:
        return None
    return (f"a product whose relative difference ({moved:.3g}) is within {factor:g}x what its first factor "
            f"carries ({carried:.3g})")


def holds_rounding(p: Pending, k: int, factor: float, both: bool = False) -> bool:
    """Whether output ``k`` is 0 at the precision the two runs are compared at, judged on
    statistics: a sum's (``summed_terms``; any output of a norm's or softmax's backward) whose
    bench values are no larger than the rounding of that sum, ``factor * sqrt(n) * eps`` times the
    magnitude summed (``both``: the target's too, on its own inputs). ``eps`` is the coarser of the
    two runs' dtypes: a bf16 run cannot tell from 0 a value below its rounding of the terms, so a
    norm's input gradient that a normalised loss makes 1e-5 of its terms (the norm's eps over the
    variance) holds only rounding there, though fp32 resolves it. A key bias's gradient is 0 in
    exact arithmetic (softmax ignores a shift of every key), so is every gradient of a loss that a
    normalization makes constant. Their statistics differ by 100% between runs; so do those of what
    is computed from them alone, and none of that is a bug."""
    if reduction_change(p, k) is None and packet(p.target.op) not in _CANCELLING:
        return False
    if k >= len(p.bench.outputs) or k >= len(p.target.outputs):
        return False
    try:
        unit = max(torch.finfo(dtype_from_name(e.outputs[k][1].dtype)).eps for e in (p.bench, p.target))
    except (ValueError, TypeError):
        return False
    if not _within_rounding(p.bench, k, factor, unit):
        return False
    if not both:
        return True
    carried = carried_error(p, k)
    return _within_rounding(p.target, k, factor, unit, carried[0] if carried is not None else 0.0)


def _within_rounding(e: Entry, k: int, factor: float, unit: float, carried: float = 0.0) -> bool:
    """Output ``k`` of ``e`` is no larger than ``factor * sqrt(n)`` times what each of its ``n``
    terms may hold besides their exact values: ``unit`` (the rounding) at their RMS, or what the
    terms carry from the other run (``carried``, relative to their peak, as errors are). A bias
    gradient that a norm makes 0 in exact arithmetic sums, on the target, the differences its
    terms carry from a bf16 autocast region; the same sum cancels to its rounding on the bench."""
    summed = summed_terms(e, k, gradient_rows=True)
    if summed is None:
        return False
    st = e.outputs[k][1].stats
    if st is None or st.mean is None:
        return False
    ins, n = summed
    peak = max((max(abs(m.stats.min), abs(m.stats.max)) for m in ins
                if m.stats.min is not None and m.stats.max is not None), default=0.0)
    held = max(unit * max(_rms(m.stats) for m in ins), carried * peak)
    return _rms(st) <= factor * math.sqrt(max(n, 1)) * held


def cast_rounds_only(first: Any, out: Any, factor: float) -> bool | None:
    """A dtype cast, by its input's and output's statistics alone: True when they moved by no
    more than ``factor`` x the coarser dtype's rounding at the input's largest magnitude, or at
    the smallest normal where that is larger (rounding moves each element by at most that, so its
    min, max, mean and std too), False beyond it, None
    when they cannot tell (no statistics, another shape, a non-float dtype)."""
    a, b = getattr(first, "stats", None), getattr(out, "stats", None)
    if a is None or b is None or tuple(first.shape) != tuple(out.shape):
        return None
    try:
        dtypes = [dtype_from_name(m.dtype) for m in (first, out)]
    except (ValueError, TypeError):
        return None
    if not all(d.is_floating_point for d in dtypes):
        return None
    values = [(a.min, b.min), (a.max, b.max), (a.mean, b.mean), (a.std, b.std)]
    if any(x is None or y is None for x, y in values):
        return None
    if (a.nan, a.posinf, a.neginf) != (b.nan, b.posinf, b.neginf):
        return False
    step = max(torch.finfo(d).eps for d in dtypes)
    # below a dtype's smallest normal its rounding is absolute (gradual underflow)
    scale = max(abs(a.min), abs(a.max), *(torch.finfo(d).tiny for d in dtypes))
    return all(abs(y - x) <= factor * step * scale for x, y in values)


def unmeasured(r: CompareRow) -> bool:
    """A failing row judged on statistics, with nothing recomputed."""
    return r.status == PairStatus.FAIL.value and r.mode == "stats" and r.local_err is None and bool(r.stats_err)


_NARROW = {"bfloat16": "bf16", "float16": TF32}  # a target dtype -> the precision step it rounds to


def _run_level(pending: list[Pending], f: float, floors: Floors, kind_errors: Any) -> tuple[float, str]:
    """The run's precision level for ``precision_loss`` and what shows it (0.0, "" when none):
    the largest first band (``_first_band``) of a kind's calls that add error of their own, or
    TF32's rounding where the run's settings allowed it."""
    kinds: dict[tuple, dict[int, tuple[float, Pending, CompareRow]]] = {}  # kind -> call (seq) -> worst output
    settings_level, settings_kind = 0.0, ""  # TF32 allowed by the run's recorded settings
    tf32 = 2.0 ** -PRECISION_STEPS[TF32]  # twice TF32's unit roundoff: inputs and weights both rounded
    for p in pending:
        # a module (module dumps) may hold matmuls: its own rounding can add error as theirs does
        matmul_like = p.target.kind == "module" or is_matmul_like(p.target.op) or is_convolution(p.target.op) \
            or is_rnn(p.target.op)
        for k, r in enumerate(p.rows):
            inputs = input_error(p, k)
            # a call adds error of its own where it is born, or where a matmul or convolution
            # jumps beyond the factor of what its inputs carry (TF32-like math rounds at every one)
            fresh = unmeasured(r) and (r.origin == "born" and r.cause == "local error" or r.cause == "inherited"
                                       and inputs is not None and r.stats_err > f * inputs and matmul_like)
            # a warning on agreeing inputs shows the same rounding, only smaller (q and k beside v); so
            # does a matmul whose recorded self-check measured precision loss (record/self_check.py)
            shows = r.status == PairStatus.WARNING.value and r.mode == "stats" and bool(r.stats_err) and matmul_like \
                and (not r.cause and inputs is None and r.local_err is None
                     or r.cause == PRECISION and r.local_err is not None)
            if fresh or shows:
                calls = kinds.setdefault((p.target.op, p.target.record.direction), {})
                seq = p.target.record.seq
                if seq not in calls or calls[seq][0] < r.stats_err:
                    calls[seq] = (r.stats_err, p, r)
                if r.origin == "born" and unmeasured(r) and TF32 in floors.allowed_steps(p.target.op, p.target.kind == "module") \
                        and r.stats_err <= f * tf32 and tf32 > settings_level:
                    settings_level, settings_kind = tf32, f"TF32 (allowed for {p.target.op} by the run's settings)"
            # a target that computes in a narrower float dtype rounds every such output to it
            step = _NARROW.get(r.target_dtype) if r.bench_dtype in ("float32", "float64") else None
            if step is not None and 2.0 ** -PRECISION_STEPS[step] > settings_level:
                settings_level, settings_kind = 2.0 ** -PRECISION_STEPS[step], f"{r.target_dtype} outputs of the target"
    # no reduced-precision step moves values by more than its unit roundoff (bf16: 2**-8)
    largest_step = 2.0 ** -(min(PRECISION_STEPS.values()) + 1)
    level, shown_by = settings_level, settings_kind
    bands = {}
    for kind, calls in kinds.items():
        ordered = list(calls.values())
        band = [ordered[i] for i in _first_band([e for e, _, _ in ordered], f)]
        if len(band) >= 2 and statistics.median(e for e, _, _ in band) <= largest_step:
            bands[kind] = band
    # Reduced-precision math rounds from the first call: a kind that passed some earlier call
    # far below its band (a CNN's first convolutions exact, a bug's error after) shows a bug
    # carried on, not its own rounding.
    firsts = [(band[0][1].target.pos, band[0][2]) for band in bands.values()]
    earlier = kind_errors(firsts) if kind_errors is not None and firsts else [[] for _ in firsts]
    for ((op, _), band), before in zip(bands.items(), earlier):
        errors = [e for e, _, _ in band]
        centre = statistics.median(errors)
        if any(e < centre / f and status == PairStatus.PASS.value for i, e, status in before if i < band[0][2].index):
            continue
        if level < max(errors):  # the kind's band reaches its largest consistent call
            level, shown_by = max(errors), f"{op} ({len(errors)} calls)"
    return level, shown_by


def _first_band(errors: list[float], f: float, starts: int = 8, anchor: int = 5) -> list[int]:
    """Indices of the first consistent level of a kind's calls, in execution order: from the
    earliest call that has a partner within ``f`` x, the calls within ``f`` x of the band's
    centre (the median of its first ``anchor`` members). Precision loss shows from the start; a
    bug's error, once born, feeds every call after it, so the centre is set before them (a median
    over all calls would follow them: four of a deep CNN's seven jumping convolutions came after
    its bug). At most ``starts`` starting calls are tried (linear in the calls)."""
    for i in range(min(starts, len(errors))):
        band = [i]
        centre = errors[i]
        for j in range(i + 1, len(errors)):
            if centre / f <= errors[j] <= f * centre:
                band.append(j)
                if len(band) <= anchor:
                    centre = statistics.median(errors[k] for k in band)
        if len(band) >= 2:
            return band
    return []


def _completion_order(pending: Sequence[Pending], entered_first: bool) -> Iterable[tuple[Pending, list[Pending]]]:
    """``pending`` in the order its calls finished, each with the calls inside it. A module dump
    (``entered_first``) records a module when it is entered, before the modules inside it, whose
    outputs its own output is made of; a trace records it when it exits (read one at a time: a
    trace's pairs are a million on a run that diverged early)."""
    if not entered_first:
        return ((p, []) for p in pending)

    def depth(path: str) -> int:
        return path.count(".") + 1 if path else 0

    keyed = []
    for i, p in enumerate(pending):
        inside = []
        if p.target.kind == "module":
            prefix = p.target.path + "." if p.target.path else ""
            direction = p.target.record.direction
            for q in pending[i + 1:]:  # a module's calls follow it, in one run
                if q.target.record.direction != direction or not q.target.path.startswith(prefix) \
                        or q.target.path == p.target.path:
                    break
                inside.append(q)
        end = inside[-1].target.pos if inside else p.target.pos
        keyed.append((end, -depth(p.target.path), i, inside))
    return [(pending[i], inside) for _, _, i, inside in sorted(keyed, key=lambda k: k[:3])]


def _extreme_of(value: Any, dtype_name: str) -> str | None:
    """``value``'s name when it is ``dtype_name``'s extreme (finfo min or max, or an infinity)."""
    try:
        dtype = dtype_from_name(dtype_name)
    except ValueError:
        return None
    if not dtype.is_floating_point or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    fi = torch.finfo(dtype)
    names = {fi.min: "min", fi.max: "max", -math.inf: "-inf", math.inf: "inf"}
    return next((f"finfo({dtype_name}).{n}" if n in ("min", "max") else n for v, n in names.items()
                 if float(value) == v), None)


def below_normal_range(r: CompareRow, p: Pending, k: int) -> str | None:
    """Where every value of both runs lies below the smallest normal number of the dtypes they
    compute in (float16: 6.1e-05; float32: 1.2e-38), the values are subnormals of a few
    significant bits, or 0 where a kernel flushes them (a narrower target dtype; GPU tensor cores,
    TF32 math and cuDNN flush subnormals, as ``torch.set_flush_denormal`` does on CPU), so the
    two differ by up to the values themselves. That is the dtype's range, not a bug (an fp16
    Adam's squared gradients, ~1e-11; a float32 conv on activations a chain of near-zero products
    left at 1e-42). None otherwise."""
    if k >= len(p.target.outputs) or k >= len(p.bench.outputs):
        return None
    bm, tm = p.bench.outputs[k][1], p.target.outputs[k][1]
    try:
        bench_dtype, target_dtype = dtype_from_name(bm.dtype), dtype_from_name(tm.dtype)
    except ValueError:
        return None
    if not (bench_dtype.is_floating_point and target_dtype.is_floating_point):
        return None
    narrow = target_dtype if torch.finfo(target_dtype).tiny >= torch.finfo(bench_dtype).tiny else bench_dtype
    tiny = torch.finfo(narrow).tiny
    tops = []
    for st in (bm.stats, tm.stats):  # both runs' values: subnormal or 0, never an Inf
        if st is None or st.min is None or st.max is None or st.nan or st.posinf or st.neginf:
            return None
        tops.append(max(abs(st.min), abs(st.max)))
    top = tops[0]
    if max(tops) >= tiny:
        return None
    return (f"every bench value ({top:.3g} at most) lies below {dtype_name(narrow)}'s smallest normal number "
            f"({tiny:.3g}): subnormals, or 0 where a kernel flushes them")


def dtype_extreme_fill(r: CompareRow, p: Pending, k: int) -> str | None:
    """Statistics only: an op that fills with its dtype's extreme (masked_fill(mask,
    finfo(dtype).min), as attention masks are built) writes -3.4e38 in a float32 run and -65504 in
    a float16 one. Its statistics then hold the fill, not the values: where its tensor inputs
    are within precision, the scalar is each run's own dtype extreme, and the statistic on the
    other side of the fill (the max, for a min fill) agrees within the row's tolerance, the
    difference is the dtypes', not a bug. None otherwise."""
    if r.mode != "stats" or k >= len(p.target.outputs) or k >= len(p.bench.outputs) \
            or any(status not in (PairStatus.PASS.value, PairStatus.WARNING.value)
                   for _, _, status, _ in row_inputs(p, k)):
        return None
    bm, tm = p.bench.outputs[k][1], p.target.outputs[k][1]
    if bm.stats is None or tm.stats is None:
        return None
    bench_args = p.bench.record.inputs
    for name, value in p.target.record.inputs.items():
        other = bench_args.get(name)
        if value == other or not isinstance(value, (int, float)) or not isinstance(other, (int, float)):
            continue
        ours, theirs = _extreme_of(value, tm.dtype), _extreme_of(other, bm.dtype)
        if ours is None or theirs is None:
            continue
        side = "max" if float(value) < 0 else "min"  # the statistic the fill does not set
        b, t = getattr(bm.stats, side), getattr(tm.stats, side)
        if b is None or t is None or abs(b - t) > (r.rtol or 0.0) * abs(b) + (r.atol or 0.0):
            return None
        return (f"fills with each run's dtype extreme ({name} = {theirs} vs {ours}): the statistics hold the fill; "
                f"its {side}, which the fill does not set, agrees")
    return None


def selection_indices(r: CompareRow, p: Pending, k: int) -> str | None:
    """Statistics only: the index output of a selection (max pooling's indices, topk's, sort's:
    ``numerics.selections``, whose rule judges them where the data is saved) whose selected values
    agree, on inputs that differ however little: where two candidates are (nearly) equal, the
    input's noise picks the other one. The values are what the model uses, so this is precision
    loss. None when not such a row, or when the inputs are identical (statistics cannot tell a tie
    broken another way from a wrong index) or any value output fails."""
    e = p.target
    if r.mode != "stats" or e.kind != "op" or selection_of(e.op, k) is None or k >= len(e.outputs):
        return None
    try:
        values = [row for j, row in enumerate(p.rows) if j != k and j < len(e.outputs)
                  and dtype_from_name(e.outputs[j][1].dtype).is_floating_point]
    except ValueError:
        return None
    if not values or any(row.status not in (PairStatus.PASS.value, PairStatus.WARNING.value) for row in values):
        return None
    bench_inputs = dict(p.bench.inputs)
    differ = [n for n, m, _, _ in p.inputs if n in bench_inputs and getattr(m, "stats", None) is not None
              and getattr(bench_inputs[n], "stats", None) is not None and m.stats != bench_inputs[n].stats]
    if not differ:
        return None
    return (f"the values {e.op} selects agree ({', '.join(row.tensor for row in values)}); its indices differ where "
            f"input {differ[0]}'s noise breaks a near-tie another way")
