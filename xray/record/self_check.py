"""A linear op's self-check at record time (a matmul, a convolution, a sum or mean, a layer
norm's backward, a fused attention; and a floating dtype conversion, recomputed whole): its local
error without saving its tensors.

A record kept with statistics only cannot be recomputed by compare, and a matmul's or a
convolution's sampled output elements each read a whole row, column or window that the samples
do not hold. Freivalds' check needs neither: contract the output's feature dimension with a
random vector r of +-1. For a matmul ``C = A @ B``, ``C r`` and ``A (B r)`` agree up to
rounding; for a convolution, ``sum_c r_c y_c`` and one convolution with the weight ``sum_c r_c
w_c`` (one output channel) do. ``|C r - A (B r)| / |C|`` estimates the normwise error ``|C - AB|
/ |C|`` (over r, the numerator's mean square is exactly ``|C - AB|``'s, Frobenius). Divided by
``|C|`` itself, not by ``|C r|``: a gradient whose rows happen to be near orthogonal to r
(TIPSv2's value projection: ``|C r|`` 50x below its expectation) would read 7 % for 0.14 %. An
output of few rows (a batch of 4) takes several vectors, so that at least ``DEGREES`` products
are summed: with one vector and 4 rows, a 5 % error read 1 %.

It costs a read of the operands and the output and products with a few output features, against
the op's full cost: a 5 % bug in a bf16 layer's gradient reads 5e-2 where bf16's own rounding
reads 2e-3, whatever its statistics say. It runs in float32 (float64 for float64 operands): its
own rounding, a sum of K products' and one of N outputs', stays within the accumulation bound
compare allows the kernel (``Floors.accumulation``), and a copy of a weight in float64 would cost
a third of the product it checks. Where the residual is beyond that bound, the reduced-precision
steps (float32 operands rounded to 10 and 7 mantissa bits: what TF32 or bf16 math would make)
are measured the same way, so compare can tell TF32 from a bug (docs/format.md, "Self-checks").
Computed below the dispatcher on the call's own device, on copies: the user's tensors and
numbers are untouched. (tools/bench_record.py measures what it costs a recording.)
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import torch

from ..dump.model import CHECK_SIZE
from ..numerics.kernel_families import saved_probabilities, saved_softmax
from ..numerics.rules import PRECISION_STEPS, round_mantissa

assert CHECK_SIZE == 1 + len(PRECISION_STEPS)  # the residual, then each precision step's (NaN: not measured)

# Under inference_mode (no autograd key) a dispatch mode sees composite ops whole: linear, matmul,
# conv2d and scaled_dot_product_attention are recorded, not the mm, convolution or fused kernel
# they become elsewhere; they are checked alike.
MATMULS = ("aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default",
           "aten.linear.default", "aten.matmul.default")
CONVOLUTIONS = ("aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default")
SUMS = ("aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.mean.default")
NORM_BACKWARD = "aten.native_layer_norm_backward.default"
# fused attention kernels (CPU's, CUDA's flash, memory-efficient and cuDNN ones): the first output
# is the attention's output (forward) or the query's gradient (backward)
FUSED_ATTENTION = ("aten._scaled_dot_product_flash_attention_for_cpu.default",
                   "aten._scaled_dot_product_flash_attention.default",
                   "aten._scaled_dot_product_efficient_attention.default",
                   "aten._scaled_dot_product_cudnn_attention.default")
ATTENTION = FUSED_ATTENTION + ("aten.scaled_dot_product_attention.default",)
ATTENTION_BACKWARD = tuple(name.replace(".default", "_backward.default") for name in FUSED_ATTENTION)
# a conversion between floating dtypes (autocast's casts of weights and activations)
CASTS = ("aten._to_copy.default",)
CAST_MAX = 1 << 24  # elements: a larger conversion is not checked (``_cast``)
OPS = frozenset(MATMULS + CONVOLUTIONS + (NORM_BACKWARD,) + SUMS + ATTENTION + ATTENTION_BACKWARD + CASTS)
SEED = 0x5EED_F4E1  # fixed: both runs draw the same r for an output of the same width
DEGREES = 64  # products summed in the residual at least (rows x vectors): its spread about 9 %
MAX_VECTORS = 16
QUERY_ROWS = 16  # a fused attention's query rows checked per batch and head, at least (``_query_rows``)
# The reference in terms of the operands (A, B; or input, weight), each passed through ``fn``
Reference = Callable[[Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]


class Check(NamedTuple):
    """What a checked op's branch gives ``self_check``: its output contracted (``got``), the
    exact reference contracted alike, the reference with its operands rounded (``stepped``: for
    the precision steps; None where it has none), the operands, the vectors' count ``k``, and
    its terms' norm where the residual is measured against the larger of it and the output's
    (a sum that cancels), else None. ``part``: True where ``got`` is a part of the output itself
    (a fused attention's checked query rows), whose own norm is then the output's."""

    got: torch.Tensor
    exact: torch.Tensor
    stepped: Reference | None
    operands: tuple
    k: int
    terms: torch.Tensor | None = None
    part: bool = False


@functools.lru_cache(maxsize=256)
def _signs(n: int, k: int = 1) -> torch.Tensor:
    """``k`` vectors of +-1 of length ``n`` as the columns of an (n, k) matrix (CPU, float64),
    the same on every run and platform."""
    gen = torch.Generator().manual_seed(SEED ^ n)
    return torch.randint(0, 2, (n, k), generator=gen, dtype=torch.int64).to(torch.float64) * 2 - 1


@functools.lru_cache(maxsize=256)
def _signs_on(n: int, k: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``_signs`` where the check runs: converted once per width, device and dtype, not per call."""
    return _signs(n, k).to(device, dtype)


def _vectors(rows: int) -> int:
    """How many vectors an output of ``rows`` rows (products per vector) is checked with."""
    return min(MAX_VECTORS, max(1, -(-DEGREES // max(1, rows))))


def _wide(device: torch.device, *operands: torch.Tensor) -> torch.dtype:
    """float64 for float64 operands where the device has it (CPU, CUDA), else float32."""
    wide = any(t.dtype == torch.float64 for t in operands if isinstance(t, torch.Tensor))
    return torch.float64 if wide and device.type in ("cpu", "cuda", "xpu") else torch.float32


def _plain(t: Any) -> bool:
    """A dense floating tensor: a plain one or a Parameter (a weight), not a subclass that dispatches."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided and t.is_floating_point()


def _matmul(name: str, bound: dict, out: torch.Tensor, wide: torch.dtype) -> Check | None:
    """The ``Check`` of ``out = beta * input + alpha * A @ B``, contracted over
    the output's last dimension."""
    if name in ("aten.mm.default", "aten.bmm.default"):
        added, a, b, beta, alpha = None, bound.get("self"), bound.get("mat2"), 0.0, 1.0
    elif name == "aten.matmul.default":  # (a vector operand: none)
        added, a, b, beta, alpha = None, bound.get("self"), bound.get("other"), 0.0, 1.0
        if not (_plain(a) and _plain(b)) or a.dim() < 2 or b.dim() < 2:
            return None
    elif name == "aten.linear.default":  # input @ weight^T + bias
        w, added = bound.get("weight"), bound.get("bias")
        a, b, beta, alpha = bound.get("input"), w.t() if _plain(w) and w.dim() == 2 else None, float(added is not None), 1.0
    else:
        beta, alpha = bound.get("beta", 1), bound.get("alpha", 1)
        if not all(type(x) in (int, float) for x in (beta, alpha)):
            return None
        a, b = (bound.get("mat1"), bound.get("mat2")) if name == "aten.addmm.default" else \
            (bound.get("batch1"), bound.get("batch2"))
        added, beta, alpha = bound.get("self"), float(beta), float(alpha)
    if not (_plain(a) and _plain(b)) or (beta != 0 and not _plain(added)):
        return None
    k = _vectors(out.numel() // max(1, out.shape[-1]))
    r = _signs_on(out.shape[-1], k, out.device, wide)  # (n, k): bmm's batches too
    base = 0.0
    if beta != 0:  # a bias of the output's width broadcasts after the product; another shape, expanded first
        added = added.to(wide)
        base = beta * ((added if added.shape[-1] == out.shape[-1] else added.expand(out.shape)) @ r)

    def reference(fn):
        product = fn(a).to(wide) @ (fn(b).to(wide) @ r)
        return product if beta == 0 and alpha == 1 else base + alpha * product  # (mm's, bmm's: no more ops)
    return Check(out.to(wide) @ r, reference(_same), reference, (a, b), k)


def _convolution(name: str, bound: dict, out: torch.Tensor, wide: torch.dtype) -> Check | None:
    """The ``Check`` of a convolution (one group, or depthwise; transposed: one
    group), contracted over its output channels: a convolution with one output channel. A
    composite ``conv1d/2d/3d`` is ``convolution`` with ``transposed`` False (string padding: none)."""
    if name != "aten.convolution.default":
        spatial = out.dim() - 2
        given = {key: bound.get(key, default) for key, default in (("stride", 1), ("padding", 0), ("dilation", 1))}
        if isinstance(given["padding"], str) or spatial < 1:
            return None
        given = {key: [v] * spatial if type(v) is int else v for key, v in given.items()}
        bound = {**bound, **given, "transposed": False, "output_padding": [0] * spatial}
    x, w, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
    groups, transposed = bound.get("groups", 1), bool(bound.get("transposed"))
    if not (_plain(x) and _plain(w)) or (bias is not None and not _plain(bias)) or type(groups) is not int \
            or out.dim() < 3:
        return None
    if groups not in (1, out.shape[1]) or (groups > 1 and (transposed or w.shape[1] != 1)):
        return None  # grouped, not depthwise: the contraction would cost the whole convolution
    k = _vectors(out.numel() // max(1, out.shape[1]))
    r = _signs_on(out.shape[1], k, out.device, wide)  # (channels, k)
    spatial = "".join("xyz"[:out.dim() - 2])
    args = [bound.get(name) for name in ("stride", "padding", "dilation")]
    base = (bias.to(wide)[:, None] * r).sum(0).view(1, k, *([1] * (out.dim() - 2))) if bias is not None else 0.0

    def contract(y):  # (N, C, ...) -> (N, k, ...): the output channels against each vector
        if k == 1:  # the common case, a multiply and a sum (einsum would permute the whole output)
            return (y * r.view(1, -1, *([1] * (out.dim() - 2)))).sum(1, keepdim=True)
        return torch.einsum(f"nc{spatial},ck->nk{spatial}", y, r)

    def reference(fn):
        xw, ww = fn(x).to(wide), fn(w).to(wide)
        if groups == 1:  # k convolutions of one output channel each (a transposed weight: (in, out, ...))
            weights = torch.einsum("ic...,ck->ik...", ww, r) if transposed else torch.einsum("c...,ck->k...", ww, r)
            return torch.ops.aten.convolution.default(xw, weights, None, *args, transposed,
                                                      bound.get("output_padding"), 1) + base
        y = torch.ops.aten.convolution.default(xw, ww, None, *args, False, bound.get("output_padding"), groups)
        return contract(y) + base  # depthwise: as cheap as reading its output
    return Check(contract(out.to(wide)), reference(_same), reference, (x, w), k)


def _sum(name: str, bound: dict, out: torch.Tensor, wide: torch.dtype) -> Check | None:
    """The ``Check`` of a sum or mean over some dimensions: recomputed whole by
    another kernel (a product with a vector of ones where the summed dimensions are a contiguous
    tensor's last ones, else a float64 reduction where the device has it: a float32 reduction
    would be the very kernel it checks, and would agree with a device's wrong one), and measured
    against the larger of its output's and its terms' norms: the rounding of a sum that cancels
    (a bias gradient, a norm backward's row sums) is its terms' eps, not its output's."""
    x = bound.get("self")
    if not _plain(x) or x.dim() == 0 and name.endswith(".dim"):
        return None
    dim = bound.get("dim")
    dims = sorted(range(x.dim()) if not dim else {d % max(1, x.dim()) for d in dim})
    count = max(1, x.numel() // max(1, out.numel()))
    scale = 1.0 / count if name.startswith("aten.mean") else 1.0
    if x.is_contiguous() and dims == list(range(x.dim() - len(dims), x.dim())):
        v = x.to(wide).reshape(-1, count)
        made = v @ _ones_on(count, x.device, wide)
    else:
        exact = torch.float64 if out.device.type in ("cpu", "cuda", "xpu") else wide
        v = x.to(exact)
        made = v.sum(dims)
    terms = torch.linalg.vector_norm(v).to(wide) * scale  # (no precision steps: a sum has no TF32 step)
    return Check(out.to(wide), (made * scale).reshape(out.shape).to(wide), None, (x,), 1, terms)


def _layer_norm_backward(bound: dict, out: torch.Tensor, wide: torch.dtype) -> Check | None:
    """The ``Check`` of a layer norm backward's input gradient, from its formula in
    pointwise ops and means (not the fused kernel it checks): ``rstd (wg - mean(wg) - xhat
    mean(wg xhat))`` with ``wg`` the weighted output gradient and ``xhat`` the normalised input,
    measured against the larger of its output's norm and ``rstd wg``'s (its terms': what it
    subtracts cancels)."""
    g, x, mean, rstd, w = (bound.get(n) for n in ("grad_out", "input", "mean", "rstd", "weight"))
    shape = bound.get("normalized_shape")
    if not all(_plain(t) for t in (g, x, mean, rstd)) or (w is not None and not _plain(w)) or not shape \
            or tuple(out.shape) != tuple(x.shape):
        return None
    axes = tuple(range(x.dim() - len(shape), x.dim()))
    gw, xw, rw = g.to(wide), x.to(wide), rstd.to(wide)
    xhat = (xw - mean.to(wide)) * rw
    wg = gw * w.to(wide) if w is not None else gw
    made = rw * (wg - wg.mean(axes, keepdim=True) - xhat * (wg * xhat).mean(axes, keepdim=True))
    terms = torch.linalg.vector_norm(rw * wg)  # (no precision steps: a norm has no TF32 step)
    return Check(out.to(wide), made, None, (g, x), 1, terms)


def _attention(name: str, bound: dict, out: torch.Tensor, wide: torch.dtype) -> Check | None:
    """The ``Check`` of a fused attention's output, or its backward's query
    gradient, from the math form (``softmax(scale q k^T + mask) v`` and its gradient, in
    ``wide``): other kernels than the fused one it checks; its precision steps round q, k, v (and
    the output gradient). Grouped heads repeat the keys and values; a call with dropout is not
    checked (its draws are not in the arguments). The
    backward is measured against the larger of its output's norm and its terms' (``scale dS k``
    before the softmax's row sums cancel); where its arguments hold what its forward saved (a
    logsumexp of one natural-log value per query, and the output), its probabilities and row
    sums are built from them, as the fused backward builds its own."""
    q, k, v = (bound.get(n) for n in ("query", "key", "value"))
    mask = bound.get("attn_mask", bound.get("attn_bias"))
    if not all(_plain(t) for t in (q, k, v)) or (mask is not None and not _plain(mask) and mask.dtype != torch.bool) \
            or bound.get("dropout_p", 0.0) or q.dim() != 4 or q.shape[-3] % k.shape[-3] \
            or tuple(out.shape) != tuple(q.shape if name in ATTENTION_BACKWARD else (*q.shape[:-1], v.shape[-1])):
        return None
    scale = bound.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    g = bound.get("grad_out", bound.get("grad_out_"))
    if name in ATTENTION_BACKWARD and not _plain(g):
        return None
    causal = bool(bound.get("is_causal"))
    # what the backward's forward saved (kernel_families.saved_softmax): the backward builds its
    # probabilities and row sums from them, so a forward's rounding is not read as its own
    saved = saved_softmax(bound) if name in ATTENTION_BACKWARD else None
    saved_out, lse = saved if saved is not None and all(_plain(t) for t in saved) else (None, None)
    rows = _query_rows(q.shape[-2], q.shape[0] * q.shape[1], q.device)
    if rows is not None:  # every batch's and head's same query rows (their output's, their gradient's)
        q, out = q.index_select(-2, rows), out.index_select(-2, rows)
        g = g.index_select(-2, rows) if g is not None else None
        if lse is not None:
            saved_out, lse = saved_out.index_select(-2, rows), lse.index_select(-1, rows)
        if mask is not None and mask.dim() >= 2 and mask.shape[-2] > 1:
            mask = mask.index_select(-2, rows)
    positions = None  # a causal mask's query positions, top-left aligned as the fused kernels': i sees keys 0..i
    if causal:
        positions = rows if rows is not None else torch.arange(q.shape[-2], device=q.device)

    def compute(fn):  # (reference, its terms' norm); fn: the steps' rounding of the operands
        qw, kw, vw = (fn(t).to(wide) for t in (q, k, v))
        if k.shape[-3] != q.shape[-3]:
            kw, vw = (t.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3) for t in (kw, vw))
        scores = (qw @ kw.transpose(-2, -1)) * scale
        if positions is not None:
            keep = torch.arange(scores.shape[-1], device=scores.device) <= positions[:, None]
            scores = scores.masked_fill(~keep, -math.inf)
        if mask is not None:
            scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.to(wide)
        probs = torch.softmax(scores, -1) if lse is None else saved_probabilities(scores, lse)
        if name in ATTENTION:
            return probs @ vw, None
        gw = fn(g).to(wide)
        dprobs = gw @ vw.transpose(-2, -1)
        dots = (gw * (probs @ vw if saved_out is None else saved_out.to(wide))).sum(-1, keepdim=True)
        terms = torch.linalg.vector_norm(((probs * dprobs) @ kw) * scale)  # before the row sums cancel
        return ((probs * (dprobs - dots)) @ kw) * scale, terms
    exact, terms = compute(_same)
    return Check(out.to(wide), exact, lambda fn: compute(fn)[0], (q, k, v), 1, terms, part=rows is not None)


def _cast(bound: dict, out: torch.Tensor, wide: torch.dtype) -> Check | None:
    """The ``Check`` of a conversion between floating dtypes on one device, recomputed through
    float64: every float dtype converts to it exactly, so the reference is one rounding to the
    output's dtype (to nearest, ties to even, as the conversion's) by another kernel than the one
    checked. A right conversion reads 0 to the bit; a few wrong elements, which its sample and
    its statistics (within bf16's rounding of its input's) can miss, read their share of the
    output's norm. Not above ``CAST_MAX`` elements: the float64 copy would cost 8 bytes an
    element, and a normwise residual no longer sees a few elements there anyway (three doubled
    among 16M read about 4e-4, under bf16's floor)."""
    x = bound.get("self")
    if not _plain(x) or x.device != out.device or tuple(x.shape) != tuple(out.shape) or x.numel() > CAST_MAX:
        return None
    exact = x.to(torch.float64).to(out.dtype)
    # equal (on the host, where asking costs no synchronisation): the residual is 0, with no more passes
    got = out if out.is_cpu and torch.equal(out, exact) else out.to(wide)
    return Check(got, exact if got is out else exact.to(wide), None, (x,), 1)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


@functools.lru_cache(maxsize=256)
def _query_rows(length: int, groups: int, device: torch.device) -> torch.Tensor | None:
    """The query rows a fused attention of ``length`` queries, ``groups`` batches x heads, is
    checked on: ``QUERY_ROWS`` of them (more where few groups would sum under ``DEGREES`` rows),
    drawn from the shape alone, so that both runs check the same rows; None: all of them.

    A query row's output (and its gradient) reads its own query and every key and value, so a
    subset is checked exactly at a subset's cost: the math form materialises a length x length
    score matrix per head, which at 512 tokens costs three times the fused kernel it checks. An
    error in every row (a wrong scale, a dropped or shifted mask, a wrong kernel) is read whole;
    one in a few rows only is seen where it touches a checked row."""
    rows = max(QUERY_ROWS, -(-DEGREES // max(1, groups)))
    if rows >= length:
        return None
    gen = torch.Generator().manual_seed(SEED ^ length)
    return torch.randperm(length, generator=gen)[:rows].sort().values.to(device)


@functools.lru_cache(maxsize=64)
def _ones_on(n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.ones(n, device=device, dtype=dtype)


def self_check(name: str, bound: dict, out: Any, defer: bool = False, norm: float | None = None) -> Any:
    """(residual, step residuals...) of a checked op's first output (``bound``: its arguments by
    schema name), or None when the call is not one this checks (another op, a subclass, sparse or
    quantized tensors, a grouped convolution, attention with dropout, a non-finite or all-zero
    output) or the check cannot run. ``norm``: the output's norm where its statistics give it
    (``stats.norm_of``), so that the check need not read the output once more.

    ``defer`` (an accelerator's call): the values as a tensor on the output's device, NaN where
    a tuple would be None, read with the batched statistics at the next flush, so that the check
    adds no host synchronisation; its steps are then always measured (cheap there)."""
    if name not in OPS or not _plain(out) or out.numel() == 0:
        return None
    try:
        with torch.no_grad():
            wide = _wide(out.device, out, *(v for v in bound.values() if isinstance(v, torch.Tensor)))
            got = _convolution(name, bound, out, wide) if name in CONVOLUTIONS else \
                _sum(name, bound, out, wide) if name in SUMS else \
                _layer_norm_backward(bound, out, wide) if name == NORM_BACKWARD else \
                _attention(name, bound, out, wide) if name in ATTENTION + ATTENTION_BACKWARD else \
                _cast(bound, out, wide) if name in CASTS else \
                _matmul(name, bound, out, wide)
            if got is None:
                return None
            got_r, exact, reference, operands, k, of_terms, part = got
            step_ops = reference is not None and all(t.dtype == torch.float32 for t in operands)
            error = torch.linalg.vector_norm(got_r - exact)
            own = norm if not (part or defer) else None  # |C| from its statistics: one read of C fewer
            if own is None:  # |C R|'s expectation (R's k columns); a NaN or Inf anywhere makes a norm non-finite
                size = torch.linalg.vector_norm(got_r if part else out.to(wide))
                norms = torch.stack([error, size if of_terms is None else torch.maximum(size, of_terms)])
            if defer:  # tensors only, in float64 as the floats below: NaN for "no check", read at the flush
                norms = norms.to(torch.float64)
                scale = norms[1] * math.sqrt(k)
                usable = torch.isfinite(norms).all() & (scale > 0)
                steps = [torch.linalg.vector_norm(reference(lambda t, b=bits: round_mantissa(t, b)) - exact)
                         .to(torch.float64) / scale if step_ops else scale * math.nan for bits in PRECISION_STEPS.values()]
                values = torch.stack([norms[0] / scale, *steps])
                return torch.where(usable, values, torch.full_like(values, math.nan))
            if own is None:
                error, scale = norms.tolist()  # one read
            else:
                error, terms = (float(error), 0.0) if of_terms is None else torch.stack([error, of_terms]).tolist()
                scale = max(own, terms)
            scale *= math.sqrt(k)
            if not (math.isfinite(error) and math.isfinite(scale)) or scale == 0:
                return None
            residual, steps = error / scale, [math.nan] * len(PRECISION_STEPS)
            summed = 1 if not step_ops else \
                operands[0].shape[-1] if name != "aten.convolution.default" else operands[1][0].numel()
            if step_ops and residual > 2 * torch.finfo(out.dtype).eps * math.sqrt(max(1, summed)):  # the sums' bound
                for i, bits in enumerate(PRECISION_STEPS.values()):
                    rounded = reference(lambda t, b=bits: round_mantissa(t, b))
                    steps[i] = float(torch.linalg.vector_norm(rounded - exact)) / scale
            return (residual, *steps)
    except (RuntimeError, TypeError, ValueError, IndexError):  # an unusual device, layout or argument: none
        return None
