"""Device-aware noise floors of local error, and outliers within an op kind.

Why: the CPU's own error at the target's dtype (local.py's ``floor``) is one legitimate kernel's
error. A GPU sums in another order, may round matmul inputs to TF32 where the run allowed it, and
may split a half-precision reduction. An op's floor therefore covers

- ``local_factor`` x the CPU's error, plus two units of roundoff (the rule so far);
- the accumulation-order bound of its reduction: ``2 * eps(accumulator) * sqrt(n)``, with ``n``
  the reduction length (K of a matmul, the key length of attention, the normalized size of a norm),
  and a float32 accumulator for half-precision outputs (what every GPU kernel uses), unless the run
  allowed reduced-precision reductions;
- TF32's rounding on matmul-like ops where the run's recorded settings enabled it (or where the
  run itself shows TF32 on every call of some kind: a measured precision class, causality.py).

A floor this wide is blind to a 3 % error under bf16. So a call is also judged against its own
kind's calls on the same run: a call far above the level of its kind (median and MAD of the log
ratio local / CPU floor) is an outlier, born there, whatever the absolute floor.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from ..numerics.math_settings import RunMath
from ..numerics.rules import eps
from ..numerics.kernel_families import family_of, packet
from .op_classes import is_gather

# ops whose inputs a TF32 (or reduced-precision) matmul path rounds
_MATMUL_LIKE = frozenset(("aten.bmm", "aten.baddbmm", "aten.addbmm", "aten.einsum", "aten.tensordot", "aten._grouped_mm"))
_MATMUL_FAMILIES = frozenset(("linear", "matmul", "scaled_dot_product_attention", "attention_forward_bmhk"))
TF32 = "tf32/fp16"

# Outliers within a kind: at least this many measured calls make a population; a call is an
# outlier when its log ratio is OUTLIER_Z robust standard deviations (1.4826 MAD) above the
# kind's median, and at least OUTLIER_MIN_FACTOR times the median ratio and the CPU floor.
MIN_POPULATION = 4
# Terms of a reduction per split-K partial, at least: cuBLAS splits K into slices of whole
# K-tiles (64 or more elements on current GPUs); 128 is measured by tools/probe_split_k.py
SPLIT_K_MIN_TERMS = 128

OUTLIER_Z = 5.0
OUTLIER_MIN_FACTOR = 5.0


def is_matmul_like(op: str) -> bool:
    f = family_of(op)
    return packet(op) in _MATMUL_LIKE or (f is not None and f.name in _MATMUL_FAMILIES)


def is_convolution(op: str) -> bool:
    f = family_of(op)
    return f is not None and f.name == "convolution"


def is_rnn(op: str) -> bool:
    """A multi-layer RNN kernel, forward or backward: cuDNN's runs its GEMMs in TF32 where its
    settings allow (torch.backends.cudnn, the same switch as convolutions')."""
    f = family_of(op)
    return f is not None and f.name in ("rnn", "rnn_backward")


def reduction_length(record: Any, k: int) -> int:
    """How many terms each element of output ``k`` sums (an estimate from the shapes): K of a
    matmul, the key length times head size of attention (forward or backward), a convolution's
    fan-in, 1 for a gather (an embedding reads one row of its table), else the largest input's
    size over the output's."""
    metas = [m for _, m in record.input_tensors() if m.shape is not None]
    outs = [m for _, m in record.output_tensors()]
    if not metas or k >= len(outs):
        return 1
    op = record.op
    try:
        if is_gather(op):
            return 1
        if is_convolution(op):
            w = metas[1]
            return max(1, math.prod(w.shape[1:]))
        f = family_of(op)
        if f is not None and f.name in ("scaled_dot_product_attention", "attention_forward_bmhk"):
            q, key = metas[0], metas[1]
            seq = key.shape[-2] if f.name == "scaled_dot_product_attention" else key.shape[1]
            return max(1, seq * q.shape[-1])
        if f is not None and f.name == "scaled_dot_product_attention_backward":  # (grad_out, query, key, ...)
            q, key = metas[1], metas[2]  # its gradients chain the forward's products: keys x head size
            return max(1, key.shape[-2] * q.shape[-1])
        if is_matmul_like(op):
            first = metas[1] if packet(op) in ("aten.addmm", "aten.baddbmm", "aten.addbmm") else metas[0]
            return max(1, first.shape[-1] if len(first.shape) else 1)
        out = max(1, outs[k].numel)
        return max(1, max(m.numel for m in metas) // out)
    except (IndexError, TypeError, AttributeError):
        return 1


@dataclass
class Floors:
    """The floors of one compare: its rules, the target run's math settings, and the precision
    classes the run itself established (step -> levels), filled in by causality."""

    rules: Any
    math: RunMath = field(default_factory=RunMath)
    established: dict[str, list[float]] = field(default_factory=dict)

    def accumulation(self, dtype: torch.dtype, n: int) -> float:
        """The accumulation-order bound of an ``n``-term sum whose output has ``dtype``. Half
        precision accumulates in float32; a run that allowed reduced-precision reductions
        (cuBLAS' split-K: ``allow_bf16/fp16_reduced_precision_reduction``, on by default for
        bf16) may also add its split partials in the output's dtype, at most one partial per
        ``SPLIT_K_MIN_TERMS`` terms: a 32-term sum is never split."""
        if dtype not in (torch.float16, torch.bfloat16):
            return 2.0 * eps(dtype) * math.sqrt(max(1, n))
        bound = 2.0 * eps(torch.float32) * math.sqrt(max(1, n))
        splits = math.ceil(max(1, n) / SPLIT_K_MIN_TERMS)
        if self.math.reduced_reduction and splits > 1:
            bound += 2.0 * eps(dtype) * math.sqrt(splits)
        return bound

    def allowed_steps(self, op: str, module: bool = False) -> list[str]:
        """Reduced-precision steps this op (``module``: a module call, which may hold matmuls and
        convolutions) may legitimately show on this run."""
        steps = list(self.established)
        if (self.math.tf32_matmul and (module or is_matmul_like(op))) \
                or (self.math.tf32_conv and (module or is_convolution(op))) or (self.math.tf32_rnn and is_rnn(op)):
            steps.append(TF32)
        return steps

    def sums(self, le: Any, n: int = 1) -> float:
        """The accumulation bound of a call's ``n``-term sums, and of the terms its measurement
        itself summed in float32 (``LocalError.own_terms``: a self-check's product with its
        output's width), whichever is larger."""
        measured_in = torch.float64 if le.dtype == torch.float64 else torch.float32
        return max(self.accumulation(le.dtype, n), self.accumulation(measured_in, le.own_terms))

    def floor(self, le: Any, op: str, n: int = 1) -> float:
        """The largest local error a legitimate kernel makes for this call."""
        r = self.rules
        out = max(r.least_floor(le.floor, le.dtype), self.sums(le, n))
        for step in self.allowed_steps(op):
            if le.steps.get(step, 0) > 0:
                out = max(out, r.precision_factor * le.steps[step])
        return out

    def beyond(self, le: Any, op: str, n: int = 1) -> bool:
        return le.local > self.floor(le, op, n)


def far_above(logs: list[float], at_least: float = -math.inf) -> dict[int, float]:
    """Index into ``logs`` (log errors of one op kind on one run; -inf: no error) -> how many
    times its kind's median it is, for the entries far above that median: OUTLIER_Z robust
    standard deviations (1.4826 MAD) and OUTLIER_MIN_FACTOR times above it, and above ``at_least``.
    Empty below MIN_POPULATION finite entries."""
    finite = [x for x in logs if math.isfinite(x)]
    if len(finite) < MIN_POPULATION:
        return {}
    mid = statistics.median(finite)
    spread = 1.4826 * statistics.median(abs(x - mid) for x in finite)
    bar = max(mid + max(OUTLIER_Z * spread, math.log(OUTLIER_MIN_FACTOR)), at_least)
    return {i: math.exp(x - mid) for i, x in enumerate(logs) if math.isfinite(x) and x > bar}


def outliers(calls: list[tuple[Any, Any]], steps: list[str] = (), sums: list[float] | None = None) -> dict[int, str]:
    """Index into ``calls`` ((key, LocalError) of one op kind, one dtype, one run) -> why it is
    far above its kind's level. Judged on log(local / legitimate error) (``far_above``); the
    legitimate error is the CPU's, or a reduced-precision step's that the run allows (``steps``),
    so a call that is off exactly as TF32 makes it is never an outlier. ``sums``: each call's
    accumulation-order bound (``Floors.accumulation`` of its reduction length), which an outlier
    also exceeds: a kind mixes sums of other lengths and cancellations, and a call within what
    any order of its own additions gives (an fp32 matmul 7x its kind's median at 4e-7, under
    its 32-term bound of 1.3e-6) is not wrong, however far from the others."""
    logs = []
    for _, le in calls:
        base = max([le.floor, eps(le.dtype) / 2] + [le.steps.get(s, 0.0) for s in steps])
        logs.append(math.log(le.local / base) if le.local > 0 and base > 0 else -math.inf)
    population = sum(1 for x in logs if math.isfinite(x))
    far = far_above(logs, math.log(OUTLIER_MIN_FACTOR))  # (a call within its bound still sets the level)
    return {i: f"{calls[i][1].local:.3g} is {factor:.3g}x its kind's median level on this run ({population} calls)"
            for i, factor in far.items() if sums is None or calls[i][1].local > sums[i]}
