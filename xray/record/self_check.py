"""A linear op's self-check at record time (a matmul, a convolution, a sum or mean, a fused
attention, forward or backward (its query, key and value gradients); a normalization, forward
or backward, and a floating dtype conversion, recomputed on rows or whole): its local error without saving its tensors.

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
from .elementwise_check import elementwise_check, rerun_op
from ..numerics.kernel_families import saved_probabilities, saved_softmax
from ..numerics.rules import PRECISION_STEPS, round_mantissa

assert CHECK_SIZE == 1 + len(PRECISION_STEPS)  # the residual, then each precision step's (NaN: not measured)

# Under inference_mode (no autograd key) a dispatch mode sees composite ops whole: linear, matmul,
# conv2d and scaled_dot_product_attention are recorded, not the mm, convolution or fused kernel
# they become elsewhere; they are checked alike.
MATMULS = ("aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default",
           "aten.linear.default", "aten.matmul.default", "aten._grouped_mm.default")
CONVOLUTIONS = ("aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default")
SUMS = ("aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.mean.default")
# fused attention kernels (CPU's, CUDA's flash, memory-efficient and cuDNN ones): the first output
# is the attention's output (forward) or the query's gradient (backward)
FUSED_ATTENTION = ("aten._scaled_dot_product_flash_attention_for_cpu.default",
                   "aten._scaled_dot_product_flash_attention.default",
                   "aten._scaled_dot_product_efficient_attention.default",
                   "aten._scaled_dot_product_cudnn_attention.default")
ATTENTION = FUSED_ATTENTION + ("aten.scaled_dot_product_attention.default",)
ATTENTION_BACKWARD = tuple(name.replace(".default", "_backward.default") for name in FUSED_ATTENTION)
# normalizations, forward: (output, mean, rstd) of the fused kernels (cudnn's third output is its
# saved inverse deviation, its fourth its own workspace), the output alone of the composite ops an
# inference_mode forward records whole
LAYER_NORMS = ("aten.native_layer_norm.default", "aten.layer_norm.default")
RMS_NORMS = ("aten._fused_rms_norm.default", "aten.rms_norm.default")
GROUP_NORMS = ("aten.native_group_norm.default", "aten.group_norm.default")
BATCH_NORMS = ("aten.native_batch_norm.default", "aten._native_batch_norm_legit.default",
               "aten._native_batch_norm_legit.no_stats", "aten._native_batch_norm_legit_no_training.default",
               "aten.cudnn_batch_norm.default", "aten.miopen_batch_norm.default", "aten.batch_norm.default")
NORMS = LAYER_NORMS + RMS_NORMS + GROUP_NORMS + BATCH_NORMS
# their backwards: the input gradient first (a batch norm's weight and bias gradients next)
RMS_NORM_BACKWARDS = ("aten._fused_rms_norm_backward.default",)
LAYER_NORM_BACKWARDS = ("aten.native_layer_norm_backward.default",) + RMS_NORM_BACKWARDS
GROUP_NORM_BACKWARDS = ("aten.native_group_norm_backward.default",)
BATCH_NORM_BACKWARDS = ("aten.native_batch_norm_backward.default", "aten.cudnn_batch_norm_backward.default",
                        "aten.miopen_batch_norm_backward.default")
NORM_BACKWARDS = LAYER_NORM_BACKWARDS + GROUP_NORM_BACKWARDS + BATCH_NORM_BACKWARDS
# a conversion between floating dtypes (autocast's casts of weights and activations)
CASTS = ("aten._to_copy.default",)
CAST_MAX = 1 << 24  # elements: a larger conversion is not checked (``_cast``)
OPS = frozenset(MATMULS + CONVOLUTIONS + SUMS + ATTENTION + ATTENTION_BACKWARD + CASTS + NORMS + NORM_BACKWARDS)
SEED = 0x5EED_F4E1  # fixed: both runs draw the same r for an output of the same width
DEGREES = 64  # products summed in the residual at least (rows x vectors): its spread about 9 %
MAX_VECTORS = 16
QUERY_ROWS = 16  # a fused attention's query rows checked per batch and head, at least (``_query_rows``)
NORM_ROWS = DEGREES  # a normalization's rows (groups, channels) checked, at most (``_norm_rows``)
NORM_ELEMENTS = 1 << 16  # and the values they read, at most (one row at least): a float64 copy of 512 KiB
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


def checked(name: str) -> bool:
    """Whether ``self_checks`` takes calls of ``name``: the ops above, and every elementwise op
    (elementwise_check.py)."""
    return name in OPS or rerun_op(name) is not None


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
    elif name == "aten._grouped_mm.default":  # a mixture of experts' matmuls, one call
        return _grouped_matmul(bound, out, wide)
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


def _grouped_matmul(bound: dict, out: torch.Tensor, wide: torch.dtype) -> Check | None:
    """The ``Check`` of ``_grouped_mm``: batched (3-D by 3-D, no offsets: a ``bmm``), or the rows
    of a 2-D ``self`` split into groups at the cumulative ``offs``, group g's rows times
    ``mat2[g]`` (a mixture of experts' tokens sorted by expert). Contracted over the output's
    last dimension as ``_matmul``. Not checked: rows past the last offset (no group writes them:
    the output's norm would read uninitialised memory), offsets along K (an expert weight's
    gradient), a bias."""
    a, b, offs = bound.get("self"), bound.get("mat2"), bound.get("offs")
    if not (_plain(a) and _plain(b)) or bound.get("bias") is not None or b.dim() != 3:
        return None
    if offs is None and a.dim() == 3:
        return _matmul("aten.bmm.default", {"self": a, "mat2": b}, out, wide)
    if offs is None or a.dim() != 2 or out.dim() != 2 or offs.dim() != 1 or len(offs) != b.shape[0]:
        return None
    ends = [int(x) for x in offs.tolist()]
    if any(e0 > e1 for e0, e1 in zip([0] + ends, ends)) or ends[-1] != a.shape[0]:
        return None
    k = _vectors(a.shape[0])
    r = _signs_on(out.shape[-1], k, out.device, wide)

    def reference(fn):
        x, weights = fn(a).to(wide), fn(b).to(wide) @ r  # (G, K, k): each expert's weight contracted
        return torch.cat([x[s:e] @ weights[g] for g, (s, e) in enumerate(zip([0] + ends, ends))])
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
        v = x.to(_exact(out.device, wide))
        made = v.sum(dims)
    terms = torch.linalg.vector_norm(v).to(wide) * scale  # (no precision steps: a sum has no TF32 step)
    return Check(out.to(wide), (made * scale).reshape(out.shape).to(wide), None, (x,), 1, terms)


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
        keys = torch.arange(kw.shape[-2], device=q.device) if positions is not None else None
        scores = _masked_scores(qw, kw, scale, positions, keys, mask)
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


def _masked_scores(qw: torch.Tensor, kw: torch.Tensor, scale: float, queries: torch.Tensor | None,
                   keys: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor:
    """``scale q k^T`` with a causal mask (query and key positions, top-left aligned as the fused
    kernels': query i sees keys 0..i; None: not causal) and the call's mask (boolean: where kept;
    else added), in ``qw``'s dtype."""
    scores = (qw @ kw.transpose(-2, -1)) * scale
    if queries is not None:
        scores = scores.masked_fill(keys[None, :] > queries[:, None], -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.to(qw.dtype)
    return scores


def _attention_key_value(name: str, bound: dict, outs: list, wide: torch.dtype) -> dict[int, Check]:
    """The ``Check``s of a fused attention backward's key and value gradients (outputs 1 and 2),
    from the math form on a subset of key rows (``_query_rows`` of the keys): a key's gradients
    read its own key and value and every query, ``dV_j = sum_i P_ij dO_i`` and ``dK_j = scale
    sum_i P_ij (dO_i v_j - D_i) q_i`` with ``D_i = dO_i . O_i``, so with the probabilities built
    from the logsumexp and output the forward saved, the chosen keys' columns of P cost what the
    query gradient's rows do. Grouped heads sum each key's gradient over its query heads. Only
    where the arguments hold what the forward saved (else each column needs every query's whole
    row). ``dK`` is measured against its terms before ``D`` is taken from them, as the query
    gradient; ``dV``, a product of P with the output gradient as the forward's output is of P with
    the values, against its own norm (its terms with ``|dO|`` would read a 5 % error as 1 %)."""
    q, k, v, g = (bound.get(n) for n in ("query", "key", "value", "grad_out"))
    g = bound.get("grad_out_") if g is None else g
    saved = saved_softmax(bound)
    mask = bound.get("attn_mask", bound.get("attn_bias"))
    if saved is None or not all(_plain(t) for t in (q, k, v, g, *saved)) or len(outs) < 3 \
            or (mask is not None and not _plain(mask) and mask.dtype != torch.bool) \
            or bound.get("dropout_p", 0.0) or q.dim() != 4 or q.shape[-3] % k.shape[-3]:
        return {}
    saved_out, lse = saved
    scale = bound.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    heads, groups = q.shape[-3], q.shape[-3] // k.shape[-3]
    keys = _query_rows(k.shape[-2], k.shape[0] * k.shape[1], k.device)
    k_rows, v_rows = (t if keys is None else t.index_select(-2, keys) for t in (k, v))
    if mask is not None and mask.dim() >= 1 and mask.shape[-1] > 1 and keys is not None:
        mask = mask.index_select(-1, keys)
    queries = key_at = None  # a causal mask's query and key positions
    if bound.get("is_causal"):
        queries = torch.arange(q.shape[-2], device=q.device)
        key_at = torch.arange(k.shape[-2], device=q.device) if keys is None else keys
    dots = (g.to(wide) * saved_out.to(wide)).sum(-1, keepdim=True)

    def per_key_head(t: torch.Tensor) -> torch.Tensor:  # (B, H, keys, d) -> (B, H / groups, keys, d)
        return t if groups == 1 else t.reshape(t.shape[0], heads // groups, groups, *t.shape[2:]).sum(2)

    def compute(fn):  # (dK, dV, dK's terms' norm) on the chosen keys
        qw, kw, vw, gw = (fn(t).to(wide) for t in (q, k_rows, v_rows, g))
        if groups > 1:
            kw, vw = (t.repeat_interleave(groups, dim=-3) for t in (kw, vw))
        scores = _masked_scores(qw, kw, scale, queries, key_at, mask)
        probs = saved_probabilities(scores, lse)
        dprobs = gw @ vw.transpose(-2, -1)
        dv = per_key_head(probs.transpose(-2, -1) @ gw)
        dk = per_key_head(((probs * (dprobs - dots)).transpose(-2, -1) @ qw) * scale)
        terms = torch.linalg.vector_norm(per_key_head(((probs * dprobs).transpose(-2, -1) @ qw) * scale))
        return dk, dv, terms
    dk, dv, terms = compute(_same)
    checks = {}
    for slot, reference, of_terms in ((1, dk, terms), (2, dv, None)):
        out = outs[slot]
        if not _plain(out) or tuple(out.shape) != tuple((k if slot == 1 else v).shape):
            continue
        got = (out if keys is None else out.index_select(-2, keys)).to(wide)
        checks[slot] = Check(got, reference, lambda fn, i=slot - 1: compute(fn)[i], (q, k, v), 1, of_terms, part=True)
    return checks


class _Rows:
    """A normalization's rows as a (rows, n) matrix: a layer or RMS norm's normalised slices,
    a group norm's groups, a batch norm's channels (dimension 1); each of its statistics is one
    value per row. Only the rows ``_norm_rows`` picks: a row's outputs (and its input
    gradient) read only that row, so a subset is checked exactly, at a bounded cost."""

    def __init__(self, name: str, x: torch.Tensor, bound: dict):
        self.groups = None
        if name in LAYER_NORMS + RMS_NORMS + LAYER_NORM_BACKWARDS:
            self.kind, shape = "last", tuple(bound.get("normalized_shape") or ())
            if not shape or tuple(x.shape[-len(shape):]) != shape:
                raise ValueError("normalized_shape is not the input's last dimensions")
            self.n = math.prod(shape)
            self.count = x.numel() // max(1, self.n)
        elif name in GROUP_NORMS + GROUP_NORM_BACKWARDS:
            self.kind, self.groups = "group", bound.get("group", bound.get("num_groups"))
            if type(self.groups) is not int or self.groups < 1 or x.dim() < 2 or x.shape[1] % self.groups:
                raise ValueError("not a group count of the input's channels")
            self.count = x.shape[0] * self.groups
            self.n = x.numel() // max(1, self.count)
        else:
            if x.dim() < 2:
                raise ValueError("a batch norm of no channels")
            self.kind, self.count = "channel", x.shape[1]
            self.n = x.numel() // max(1, self.count)
        if self.count < 1 or self.n < 1:
            raise ValueError("an empty normalization")
        self.rows = _norm_rows(self.count, self.n, x.device)
        self.channels = x.shape[1] if x.dim() > 1 else 1

    def picked(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor of the input's shape, as (rows, n)."""
        if self.kind == "channel":
            t = t if self.rows is None else t.index_select(1, self.rows)
            return t.transpose(0, 1).reshape(-1, self.n)
        t = t.reshape(self.count, self.n)
        return t if self.rows is None else t.index_select(0, self.rows)

    def per_row(self, t: torch.Tensor) -> torch.Tensor:
        """A statistic of one value per row (a mean, an rstd, a per-channel gradient), as (rows,)."""
        t = t.reshape(self.count)
        return t if self.rows is None else t.index_select(0, self.rows)

    def affine(self, a: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        """A weight or bias in ``dtype``, broadcast against (rows, n)."""
        if a is None:
            return None
        a = a.to(dtype)
        if self.kind == "last":
            return a.reshape(1, self.n)
        if self.kind == "channel":
            return (a if self.rows is None else a.index_select(0, self.rows))[:, None]
        per = self.channels // self.groups  # a group's channels, each over its spatial size
        a = a.reshape(self.groups, per, 1).expand(self.groups, per, self.n // per).reshape(self.groups, self.n)
        rows = torch.arange(self.count, device=a.device) if self.rows is None else self.rows
        return a.index_select(0, rows % self.groups)


def _exact(device: torch.device, wide: torch.dtype) -> torch.dtype:
    """float64 where the device has it (CPU, CUDA, XPU), else ``wide``."""
    return torch.float64 if device.type in ("cpu", "cuda", "xpu") else wide


def _normalization(name: str, bound: dict, outs: list, wide: torch.dtype) -> dict[int, Check] | None:
    """The ``Check`` of each output of a normalization (its output; a fused kernel's mean and
    rstd too) from its definition, on ``_Rows``' rows in float64 where the device has it: each
    row centred by its mean (not an RMS norm's) and scaled by ``1 / sqrt(var + eps)``, then by
    its weight and bias; a batch norm outside training by its running statistics.

    Each output is measured against its terms (``Check.terms``): the output against
    ``(|x| + |mean|) rstd c |w| + |b|``, the mean against ``|x| / n``, rstd against ``rstd c``,
    with ``c = 1 + mean^2 rstd^2``: a kernel that takes the variance as ``E[x^2] - mean^2`` in
    one pass loses that factor to cancellation, legitimately, and a mean that cancels rounds at
    its terms' scale. A wrong eps, group count, axis, weight or statistic is far beyond that."""
    x, w, b = bound.get("input"), bound.get("weight"), bound.get("bias")
    if not _plain(x) or any(t is not None and not _plain(t) for t in (w, b)):
        return None
    rows, exact = _Rows(name, x, bound), _exact(x.device, wide)
    eps = bound.get("eps", bound.get("epsilon"))
    eps = torch.finfo(x.dtype).eps if eps is None and name in RMS_NORMS else eps  # (an RMS norm's default)
    training = name not in BATCH_NORMS or bound.get("running_mean") is None or bound.get("running_var") is None \
        or bool(bound.get("training", name != "aten._native_batch_norm_legit_no_training.default"))
    if type(eps) not in (int, float):
        return None
    v = rows.picked(x).to(exact)
    if not training:
        mean = rows.per_row(bound["running_mean"]).to(exact)[:, None]
        var = rows.per_row(bound["running_var"]).to(exact)[:, None]
        centred = v - mean
    elif name in RMS_NORMS:
        mean, centred = v.new_zeros(v.shape[0], 1), v
        var = v.square().mean(1, keepdim=True)
    else:  # two passes (var_mean's float64 Welford costs 4x them)
        mean = v.mean(1, keepdim=True)
        centred = v - mean
        var = centred.square().mean(1, keepdim=True)
    rstd = (var + eps).rsqrt_()
    wa, ba = rows.affine(w, exact), rows.affine(b, exact)
    y = centred * rstd
    y = y.mul_(wa) if wa is not None else y
    y = y.add_(ba) if ba is not None else y
    scale = rstd * (mean * rstd).square_().add_(1)  # rstd c
    size = v.abs().add_(mean.abs()).mul_(scale)
    size = size.mul_(wa.abs()) if wa is not None else size
    size = size.add_(ba.abs()) if ba is not None else size
    made = {0: (y, torch.linalg.vector_norm(size))}
    if training and name not in RMS_NORMS:  # the fused kernels' saved statistics
        made[1] = (mean, torch.linalg.vector_norm(v) / rows.n)
    if training:
        made[len(made)] = (rstd, torch.linalg.vector_norm(scale))
    return _row_checks(rows, made, outs, x)


def _normalization_backward(name: str, bound: dict, outs: list, wide: torch.dtype) -> dict[int, Check] | None:
    """The ``Check`` of a normalization backward's input gradient, and of its weight and bias
    gradients (a batch norm's: a sum over each of its rows; the others': ``_affine_gradients``),
    from its formula in pointwise ops and means, on ``_Rows``' rows, not the fused kernel it checks: ``rstd (wg - mean(wg) - xhat mean(wg xhat))``
    (an RMS norm's without ``mean(wg)``; a batch norm's outside training ``rstd wg``), with
    ``wg`` the weighted output gradient and ``xhat`` the input normalised by the statistics its
    forward saved (a batch norm outside training: its running ones). The input gradient is
    measured against the larger of its norm and ``rstd wg``'s (its terms: what it subtracts
    cancels), a sum against its terms' norm (``_centred_terms``)."""
    g, x, w = bound.get("grad_out", bound.get("grad_output")), bound.get("input"), bound.get("weight")
    if not (_plain(g) and _plain(x)) or g.shape != x.shape or (w is not None and not _plain(w)):
        return None
    rows, exact = _Rows(name, x, bound), _exact(x.device, wide)
    if name in BATCH_NORM_BACKWARDS:
        mean, rstd = bound.get("save_mean"), bound.get("save_invstd", bound.get("save_var"))
        training = bool(bound.get("train", True)) and _plain(mean) and _plain(rstd) and mean.numel() > 0
        if not training:
            rm, rv, eps = bound.get("running_mean"), bound.get("running_var"), bound.get("eps", bound.get("epsilon"))
            if not (_plain(rm) and _plain(rv)) or type(eps) not in (int, float):
                return None
            mean, rstd = rows.per_row(rm).to(exact), torch.rsqrt(rows.per_row(rv).to(exact) + eps)
        else:
            mean, rstd = rows.per_row(mean).to(exact), rows.per_row(rstd).to(exact)
    else:
        saved, training = (bound.get("mean"), bound.get("rstd")), True
        if not _plain(saved[1]) or (name not in RMS_NORM_BACKWARDS and not _plain(saved[0])):
            return None
        rstd = rows.per_row(saved[1]).to(exact)
        mean = rows.per_row(saved[0]).to(exact) if saved[0] is not None else torch.zeros_like(rstd)
    gv, xv = rows.picked(g).to(exact), rows.picked(x).to(exact)
    xhat = (xv - mean[:, None]) * rstd[:, None]
    wa = rows.affine(w, exact)
    wg = gv * wa if wa is not None else gv
    if training:
        inner = wg - xhat * (wg * xhat).mean(1, keepdim=True)
        inner = inner if name in RMS_NORM_BACKWARDS else inner - wg.mean(1, keepdim=True)
    else:
        inner = wg
    made = {0: (rstd[:, None] * inner, torch.linalg.vector_norm(rstd[:, None] * wg))}
    if name in BATCH_NORM_BACKWARDS:  # one row sum per channel
        made[1] = ((gv * xhat).sum(1), _centred_terms(gv, xv, mean[:, None], rstd[:, None]))
        made[2] = (gv.sum(1), torch.linalg.vector_norm(gv))
    else:
        made.update(_affine_gradients(rows, g, x, saved, exact, name in RMS_NORM_BACKWARDS))
    return _row_checks(rows, made, outs, x)


def _centred_terms(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """The terms' norm of ``sum(g xhat)``, ``xhat = (x - mean) rstd``: ``|g| (|x| + |mean|) rstd``,
    as the kernel's rounding of ``x - mean`` is ``x``'s, not the difference's."""
    return torch.linalg.vector_norm(g.abs() * (x.abs() + mean.abs()) * rstd)


def _affine_gradients(rows: _Rows, g: torch.Tensor, x: torch.Tensor, saved: tuple, exact: torch.dtype,
                      rms: bool) -> dict[int, tuple]:
    """A layer, RMS or group norm backward's weight and bias gradients (outputs 1 and 2; an RMS
    norm's weight gradient is its output 1), ``sum(grad_out xhat)`` and ``sum(grad_out)`` over
    every row for each weight element: a layer norm's over its rows, a group norm's over its
    batch and spatial positions. On a subset of those elements (``_norm_rows``), each summed whole,
    with the statistics its forward saved (``saved``: mean, rstd). Each as ``_row_checks`` takes
    it: (reference, its terms' norm, how to pick the same elements of the output).

    None for half-precision gradients: a kernel may accumulate them in their own dtype (torch's
    CPU layer norm backward under bf16 is 1 % off exact at 256 rows, 5 % at 4096), where compare's
    floors assume a float32 accumulation; that kernel would read as wrong on every bf16 step."""
    if g.dtype in (torch.float16, torch.bfloat16):
        return {}
    if rows.kind == "last":  # a weight element per normalised position: columns of (rows, n)
        count, n = rows.count, rows.n
        cols = _norm_rows(n, count, x.device)

        def part(t: torch.Tensor) -> torch.Tensor:  # (rows, elements)
            t = t.reshape(count, n)
            return t if cols is None else t.index_select(1, cols)

        stat = [t.reshape(count, 1).to(exact) if t is not None else None for t in saved]
        axes, size = 0, n
    else:  # a group norm: a weight element per channel, over (batch, its spatial positions)
        batch, channels = x.shape[0], rows.channels
        spatial = x.numel() // max(1, batch * channels)
        cols = _norm_rows(channels, batch * spatial, x.device)

        def part(t: torch.Tensor) -> torch.Tensor:  # (batch, channels, spatial)
            t = t.reshape(batch, channels, spatial)
            return t if cols is None else t.index_select(1, cols)

        group = (torch.arange(channels, device=x.device) if cols is None else cols) // (channels // rows.groups)
        stat = [t.reshape(batch, rows.groups).index_select(1, group).to(exact)[..., None] if t is not None else None
                for t in saved]
        axes, size = (0, 2), channels
    gv, xv = part(g).to(exact), part(x).to(exact)
    mean = stat[0] if stat[0] is not None and not rms else torch.zeros_like(stat[1])
    xhat = (xv - mean) * stat[1]

    def pick(out: torch.Tensor) -> torch.Tensor:
        out = out.reshape(size)
        return out if cols is None else out.index_select(0, cols)

    made = {1: ((gv * xhat).sum(axes), _centred_terms(gv, xv, mean, stat[1]), pick, size)}
    if not rms:
        made[2] = (gv.sum(axes), torch.linalg.vector_norm(gv), pick, size)
    return made


def _row_checks(rows: _Rows, made: dict, outs: list, x: torch.Tensor) -> dict[int, Check]:
    """``Check``s of the outputs ``made`` holds (output index: (reference on the rows, its
    terms' norm), for output 0 of the input's shape and the others one value per row; or
    (reference, terms, how to pick the same elements of the output, its element count))."""
    checks = {}
    for k, (reference, terms, *how) in made.items():
        out = outs[k] if k < len(outs) else None
        pick, size = how if how else (rows.picked, x.numel()) if k == 0 else (rows.per_row, rows.count)
        if not _plain(out) or out.numel() != size:
            continue
        # measured in the reference's dtype: rounding it to the output's would add its own error
        got = pick(out).to(reference.dtype).reshape(reference.shape)
        checks[k] = Check(got, reference, None, (x,), 1, terms, part=True)
    return checks


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
    return _drawn(length, rows, device)


def _drawn(count: int, rows: int, device: torch.device) -> torch.Tensor | None:
    """``rows`` of ``count`` indices, sorted, drawn from ``count`` alone (the same on both runs:
    ``torch.randperm`` from a CPU generator seeded with ``SEED ^ count``); None: all of them."""
    if rows >= count:
        return None
    gen = torch.Generator().manual_seed(SEED ^ count)
    return torch.randperm(count, generator=gen)[:rows].sort().values.to(device)


@functools.lru_cache(maxsize=256)
def _norm_rows(count: int, n: int, device: torch.device) -> torch.Tensor | None:
    """The rows of a normalization of ``count`` rows of ``n`` values each that it is checked
    on: ``NORM_ROWS`` of them, fewer where they would read over ``NORM_ELEMENTS`` values (at least
    one), drawn from the shape alone, so that both runs check the same rows; None: all of them.
    An error confined to rows outside the subset is not seen by the check (its statistics and
    sample still see it)."""
    return _drawn(count, max(1, min(NORM_ROWS, NORM_ELEMENTS // max(1, n))), device)


@functools.lru_cache(maxsize=64)
def _ones_on(n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.ones(n, device=device, dtype=dtype)


def self_checks(name: str, bound: dict, outs: list, defer: bool = False,
                norms: list | None = None, mixed: bool = False) -> dict[int, Any]:
    """{output index: (residual, step residuals...)} of a checked op's outputs (``bound``: its
    arguments by schema name; ``outs``: its outputs, in order): its first output's, and a
    normalization's mean and rstd too. Empty when the call is not one this checks (another op, a
    subclass, sparse or quantized tensors, a grouped convolution, attention with dropout) or the
    check cannot run; an output is left out where its output is non-finite or all zero.
    ``norms``: each output's norm where its statistics give it (``stats.norm_of``; None where
    not), so that the check need not read the output once more.

    ``defer`` (an accelerator's call): the values as a tensor on the output's device, NaN where
    a tuple would be None, read with the batched statistics at the next flush, so that the check
    adds no host synchronisation; its steps are then always measured (cheap there). ``mixed``:
    the run computes in half precision somewhere (an elementwise op's float32 outputs are then
    checked too: elementwise_check.py)."""
    first = outs[0] if outs else None
    if not _plain(first) or first.numel() == 0:
        return {}
    try:
        with torch.no_grad():
            if name not in OPS:
                got = elementwise_check(name, bound, first, defer, mixed)
                return {} if got is None else {0: got}
            wide = _wide(first.device, first, *(v for v in bound.values() if isinstance(v, torch.Tensor)))
            if name in NORMS + NORM_BACKWARDS:
                made = (_normalization if name in NORMS else _normalization_backward)(name, bound, outs, wide) or {}
            else:
                got = _convolution(name, bound, first, wide) if name in CONVOLUTIONS else \
                    _sum(name, bound, first, wide) if name in SUMS else \
                    _attention(name, bound, first, wide) if name in ATTENTION + ATTENTION_BACKWARD else \
                    _cast(bound, first, wide) if name in CASTS else \
                    _matmul(name, bound, first, wide)
                made = {} if got is None else {0: got}
                if name in ATTENTION_BACKWARD:
                    made.update(_attention_key_value(name, bound, outs, wide))
            measured = {k: _measured(name, check, outs[k], wide, defer,
                                     norms[k] if norms is not None and k < len(norms) else None)
                        for k, check in made.items()}
            return {k: v for k, v in measured.items() if v is not None}
    except (RuntimeError, TypeError, ValueError, IndexError):  # an unusual device, layout or argument: none
        return {}


def self_check(name: str, bound: dict, out: Any, defer: bool = False, norm: float | None = None) -> Any:
    """``self_checks`` of the first output alone (``out``), or None."""
    return self_checks(name, bound, [out], defer, [norm]).get(0)


def _measured(name: str, check: Check, out: torch.Tensor, wide: torch.dtype, defer: bool,
              norm: float | None) -> Any:
    """One output's (residual, step residuals...) from its ``Check`` (``self_checks``)."""
    got_r, exact, reference, operands, k, of_terms, part = check
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
