"""Kernel families: device- or backend-specific implementations of one computation.

Why: CPU runs ``_scaled_dot_product_flash_attention_for_cpu`` where CUDA runs
``_scaled_dot_product_efficient_attention`` (or cudnn's, or flash's), and its backward likewise;
a batch norm is ``native_batch_norm`` on CPU, ``cudnn_batch_norm`` on CUDA (``miopen_`` on ROCm,
``_native_batch_norm_legit_no_training`` in an exported program); F.rms_norm is one
``_fused_rms_norm`` kernel on CUDA and several ops on CPU; a multi-layer LSTM or GRU is one
``_cudnn_rnn`` on CUDA, ``mkldnn_rnn_layer`` per layer on CPU; a linear layer is an
``addmm`` on one side and a ``linear`` on the other; a cast is ``_to_copy`` or ``copy_``. These are
one computation, so alignment pairs them as one kind, compares only the outputs they share (the
attention output, not a kernel's logsumexp or RNG seed), and recomputes their local error with one
device-neutral reference: the public op, in float64, on CPU; a generated test of a member calls
that public op, so each device picks its own kernel. Every such rule reads this table.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import torch

Reference = Callable[[dict[str, Any]], torch.Tensor]


def _sdpa(v: dict[str, Any]) -> torch.Tensor:
    """F.scaled_dot_product_attention on the call's query/key/value (B, H, L, E)."""
    import torch.nn.functional as F

    q, k, val = v["query"], v["key"], v["value"]
    mask = v.get("attn_mask", v.get("attn_bias", v.get("bias")))
    gqa = q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3]
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, val, attn_mask=mask, dropout_p=0.0,
                                          is_causal=bool(v.get("is_causal", False)), scale=v.get("scale"),
                                          enable_gqa=gqa)


def _sdpa_bmhk(v: dict[str, Any]) -> torch.Tensor:
    """The varlen forward kernels (_efficient/_flash_attention_forward) take (B, L, H, E)."""
    if v.get("cu_seqlens_q", v.get("cum_seq_q")) is not None:
        raise ValueError("variable-length attention: no public-op reference")
    causal = v.get("is_causal", v.get("custom_mask_type", 0) == 1)
    t = {**v, "query": v["query"].transpose(1, 2), "key": v["key"].transpose(1, 2),
         "value": v["value"].transpose(1, 2), "is_causal": bool(causal), "attn_bias": v.get("bias")}
    return _sdpa(t).transpose(1, 2)


def _attention_backward(v: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of query, key and value, by autograd through the public op: every
    backward kernel (CPU flash, CUDA efficient/flash/cudnn) takes the forward's own arguments
    plus the output gradient, under names that differ a little."""
    if float(v.get("dropout_p", 0.0) or 0.0) > 0.0:
        raise ValueError("attention backward with dropout: the kernel's random mask has no reference")
    if v.get("cum_seq_q") is not None:
        raise ValueError("variable-length attention: no public-op reference")
    grad = v.get("grad_out", v.get("grad_out_"))
    with torch.enable_grad():
        q, k, val = (v[n].detach().requires_grad_() for n in ("query", "key", "value"))
        out = _sdpa({**v, "query": q, "key": k, "value": val})
        return torch.autograd.grad(out, (q, k, val), grad.to(out.dtype))


def saved_softmax(v: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """An attention backward's (output, logsumexp) from its forward, where the logsumexp holds
    one value per query, the natural log of its scaled scores' row sum (CPU's and CUDA flash
    kernels' layout; the efficient kernel pads its rows to 32), else None."""
    q, val, out, lse = v.get("query"), v.get("value"), v.get("out"), v.get("logsumexp")
    if not all(isinstance(t, torch.Tensor) for t in (q, val, out, lse)) or tuple(lse.shape) != tuple(q.shape[:-1]) \
            or tuple(out.shape) != (*q.shape[:-1], val.shape[-1]):
        return None
    return out, lse


def saved_probabilities(scores: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The attention probabilities a fused backward builds: ``exp(scores - lse)`` with the
    forward's saved logsumexp (a fully masked query's is -inf: its probabilities 0)."""
    sums = lse.to(scores.dtype)[..., None]
    return torch.where(torch.isfinite(sums), torch.exp(scores - sums), torch.zeros((), dtype=scores.dtype))


def _cpu_flash_backward(v: dict[str, Any], out: torch.Tensor, lse: torch.Tensor) -> tuple | None:
    """CPU's fused backward on the call's arguments and saved statistics, or None where it does
    not take them (another device, grouped heads, a mask it refuses). The saved-statistics
    reference runs it at the call's own dtype: what CPU's kernel makes there is the floor a
    legitimate fused backward is judged by, which the plain formula (its matmuls and one exp,
    rounded fewer times) would set too low."""
    q, k, val, grad = v["query"], v["key"], v["value"], v.get("grad_out", v.get("grad_out_"))
    mask = v.get("attn_mask", v.get("attn_bias"))
    if not q.is_cpu or k.shape[-3] != q.shape[-3] or (mask is not None and mask.dtype == torch.bool):
        return None
    try:
        return tuple(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
            grad.to(q.dtype), q, k, val, out.to(q.dtype), lse.to(torch.float32),  # (the kernel saves it in float32)
            0.0, bool(v.get("is_causal", False)), attn_mask=mask, scale=v.get("scale")))
    except (RuntimeError, TypeError, ValueError):
        return None


def _attention_backward_from_saved(v: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of query, key and value as the fused backward computes them, from what its
    forward saved: the probabilities from its logsumexp, ``P = exp(scale q k^T + mask - lse)``,
    and the row sums from its output, ``D = rowsum(dO * out)``; then ``dV = P^T dO``, ``dS = P
    (dO v^T - D)``, ``dQ = scale dS k``, ``dK = scale dS^T q``. A forward that rounded (TF32,
    bf16) saved an output and a logsumexp a little off the exact ones for these q, k, v: the
    backward's result carries that, and the public op's autograd (``_attention_backward``), which
    recomputes them exactly, would read it as the backward's own error. Where the forward's
    saved statistics are of another layout (``saved_softmax``), the public op's."""
    q, k, val, grad = v["query"], v["key"], v["value"], v.get("grad_out", v.get("grad_out_"))
    saved = saved_softmax(v)
    if saved is None or q.dim() != 4 or v.get("cum_seq_q") is not None or float(v.get("dropout_p", 0.0) or 0.0) > 0.0:
        return _attention_backward(v)
    out, lse = saved
    if q.dtype != torch.float64 and (native := _cpu_flash_backward(v, out, lse)) is not None:
        return native
    dtype = q.dtype  # half precision computed in float32, as the fused kernels accumulate, then rounded
    q, k, val, out, grad = (t.to(torch.float64 if dtype == torch.float64 else torch.float32)
                            for t in (q, k, val, out, grad))
    groups = q.shape[-3] // k.shape[-3]
    kr, vr = (t.repeat_interleave(groups, dim=-3) for t in (k, val)) if groups > 1 else (k, val)
    scale = v.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = (q @ kr.transpose(-2, -1)) * scale
    if v.get("is_causal"):  # top-left aligned, as the fused kernels: query i sees keys 0..i
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    mask = v.get("attn_mask", v.get("attn_bias"))
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.to(scores.dtype)
    probs = saved_probabilities(scores, lse)
    dv = probs.transpose(-2, -1) @ grad
    ds = probs * (grad @ vr.transpose(-2, -1) - (grad * out).sum(-1, keepdim=True))
    dq, dk = (ds @ kr) * scale, (ds.transpose(-2, -1) @ q) * scale
    if groups > 1:  # each key and value head served ``groups`` query heads: their gradients add up
        dk, dv = (t.unflatten(-3, (k.shape[-3], groups)).sum(-3) for t in (dk, dv))
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)


def _batch_norm(v: dict[str, Any]) -> torch.Tensor:
    """F.batch_norm on the call's arguments: running statistics in eval, the batch's in training
    (the running ones are the caller's copies, so their update is harmless)."""
    import torch.nn.functional as F

    training = bool(v.get("training", v.get("train", False)))
    momentum = v.get("momentum", v.get("exponential_average_factor", 0.1))
    return F.batch_norm(v["input"], v.get("running_mean"), v.get("running_var"), v.get("weight"), v.get("bias"),
                        training=training, momentum=float(momentum or 0.0), eps=float(v.get("eps", v.get("epsilon"))))


def _batch_norm_backward(v: dict[str, Any]) -> tuple[torch.Tensor | None, ...]:
    """The gradients of input, weight and bias, by autograd through F.batch_norm. What a kernel
    saved for backward differs (cudnn's and miopen's ``save_var`` is an inverse deviation), so
    the batch's statistics are recomputed; a kernel given none ran in eval mode. Gradients the
    call did not ask for (``output_mask``) are None, as the kernel's own are."""
    saved = v.get("save_mean")
    training = v.get("train", v.get("update", saved is not None and saved.numel() > 0))
    grad = v.get("grad_out", v.get("grad_output"))
    mask = list(v.get("output_mask") or (True, True, True))
    with torch.enable_grad():
        x = v["input"].detach().requires_grad_()
        w, b = (t.detach().requires_grad_() if t is not None else None for t in (v.get("weight"), v.get("bias")))
        if w is not None and b is None:
            b = torch.zeros_like(w, requires_grad=True)
        out = _batch_norm({"input": x, "weight": w, "bias": b, "running_mean": v.get("running_mean"),
                           "running_var": v.get("running_var"), "training": bool(training),
                           "eps": v.get("eps", v.get("epsilon"))})
        wanted = [t for t in (x, w, b) if t is not None]
        grads = iter(torch.autograd.grad(out, wanted, grad.to(out.dtype)))
        full = [next(grads) if t is not None else None for t in (x, w, b)]
    return tuple(g if keep else None for g, keep in zip(full, mask))


def _rms_norm_backward(v: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of input and weight of y = x * rstd * w, given the kernel's saved ``rstd``
    (an input of the call: no eps is passed), by the closed form
    dx = rstd * (g w) - x * rstd^3 * mean(g w x) and dw = sum(g * x * rstd) over the batch dims."""
    x, g, rstd, w = v["input"], v["grad_out"], v["rstd"], v.get("weight")
    dims = tuple(range(-len(v["normalized_shape"]), 0))
    gw = g * w if w is not None else g
    dx = rstd * gw - x * rstd.pow(3) * (gw * x).mean(dims, keepdim=True)
    dw = None
    if w is not None:
        batch = tuple(range(x.dim() - len(dims)))
        dw = (g * x * rstd).sum(batch) if batch else g * x * rstd
    mask = list(v.get("output_mask") or (True, True))
    return dx if mask[0] else None, dw if mask[1] else None


# cuDNN's and MIOpen's RNN modes (cudnnRNNMode_t), as torch's public RNN ops
_RNN_MODES = {0: "rnn_relu", 1: "rnn_tanh", 2: "lstm", 3: "gru"}


def _rnn(v: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A multi-layer RNN kernel (CUDA's ``_cudnn_rnn``, ROCm's ``miopen_rnn``) as torch's public
    op (``torch._VF.lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``: CPU runs it as oneDNN's
    ``mkldnn_rnn_layer`` per layer, or as matmuls per step) on the kernel's own arguments:
    output, h_n, and c_n (an empty tensor but for an LSTM, as the kernels return)."""
    mode = _RNN_MODES.get(int(v["mode"]))
    if mode is None:
        raise ValueError(f"RNN mode {v['mode']!r}: no public-op reference")
    if v.get("train") and float(v.get("dropout") or 0.0) > 0.0 and int(v["num_layers"]) > 1:
        raise ValueError("RNN with dropout between layers: the kernel's random mask has no reference")
    per = int(v["weight_stride0"])  # weights per layer and direction: w_ih, w_hh[, b_ih, b_hh][, w_hr]
    weights, hx, cx = list(v["weight"]), v["hx"], v.get("cx")
    state = (hx, cx) if mode == "lstm" else hx
    common = (weights, per in (4, 5), int(v["num_layers"]), float(v.get("dropout") or 0.0), bool(v.get("train")),
              bool(v["bidirectional"]))
    sizes = list(v.get("batch_sizes") or [])
    fn = getattr(torch._VF, mode)
    if sizes:  # a packed sequence: the input is its data
        out = fn(v["input"], torch.tensor(sizes, dtype=torch.int64), state, *common)
    else:
        out = fn(v["input"], state, *common, bool(v["batch_first"]))
    if mode == "lstm":
        return out[0], out[1], out[2]
    return out[0], out[1], hx.new_empty(0)


def _rnn_backward(v: dict[str, Any]) -> tuple[Any, ...]:
    """``_cudnn_rnn_backward``/``miopen_rnn_backward``: the gradients of input, h_0, c_0 and every
    weight, by autograd through ``_rnn``; None where ``output_mask`` asks for none (the kernel
    then returns no tensor there)."""
    mask = list(v.get("output_mask") or (True, True, True, True))
    with torch.enable_grad():
        x, hx = v["input"].detach().requires_grad_(), v["hx"].detach().requires_grad_()
        cx = v["cx"].detach().requires_grad_() if v.get("cx") is not None else None
        weights = [w.detach().requires_grad_() for w in v["weight"]]
        out, hy, cy = _rnn({**v, "input": x, "hx": hx, "cx": cx, "weight": weights})
        pairs = [(t, g) for t, g in ((out, v.get("grad_output")), (hy, v.get("grad_hy")), (cy, v.get("grad_cy")))
                 if g is not None and t.numel()]
        wrt = [x, hx] + ([cx] if cx is not None else []) + weights
        grads = torch.autograd.grad([t for t, _ in pairs], wrt, [g.to(t.dtype) for t, g in pairs], allow_unused=True)
    gx, ghx = grads[0], grads[1]
    gcx = grads[2] if cx is not None else None
    gw = [g if g is not None else torch.zeros_like(w) for g, w in zip(grads[len(wrt) - len(weights):], weights)]
    return (gx if mask[0] else None, ghx if mask[1] else None, gcx if mask[2] else None, gw if mask[3] else [])


def _conv(v: dict[str, Any]) -> torch.Tensor:
    import torch.nn.functional as F

    x, w = v["input"], v["weight"]
    if v.get("transposed"):  # the op itself: its float64 CPU kernel is the reference
        return torch.ops.aten.convolution.default(x, w, v.get("bias"), v.get("stride"), v.get("padding"),
                                                  v.get("dilation"), True, v.get("output_padding"), v.get("groups", 1))
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
    return fn(x, w, v.get("bias"), stride=v.get("stride", 1), padding=v.get("padding", 0),
              dilation=v.get("dilation", 1), groups=v.get("groups", 1))


def _layer_norm(v: dict[str, Any]) -> torch.Tensor:
    import torch.nn.functional as F

    return F.layer_norm(v["input"], list(v["normalized_shape"]), v.get("weight"), v.get("bias"),
                        float(v.get("eps", 1e-5)))


def _rms_norm(v: dict[str, Any]) -> torch.Tensor:
    import torch.nn.functional as F

    return F.rms_norm(v["input"], list(v["normalized_shape"]), v.get("weight"), v.get("eps"))


def _grouped_mm(v: dict[str, Any]) -> torch.Tensor:
    """``torch._grouped_mm`` as one matmul per group (it refuses float64): ``offs`` ends each
    group along a's rows (2-D a, 3-D b: an MoE's experts), b's columns (3-D a, 2-D b) or the
    shared dimension (2-D a and b: their weight gradients); 3-D a and b are a batch."""
    a, b, offs, bias = v["self"], v["mat2"], v.get("offs"), v.get("bias")
    if a.dim() == 3 and b.dim() == 3:
        out = torch.bmm(a, b)
    else:
        if offs is None:
            raise ValueError("grouped mm of a 2-D operand without offs")
        ends = [int(x) for x in offs.tolist()]
        spans = list(zip([0] + ends[:-1], ends))
        if a.dim() == 2 and b.dim() == 3:
            out = torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(spans)], 0)
        elif a.dim() == 3 and b.dim() == 2:
            out = torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(spans)], 1)
        else:
            out = torch.stack([a[:, s:e] @ b[s:e] for s, e in spans])
    if bias is not None:
        out = out + bias
    out_dtype = v.get("out_dtype")
    return out.to(out_dtype) if out_dtype is not None and out.dtype != torch.float64 else out


@dataclass(frozen=True)
class Family:
    """``members``: op names without overload (``aten.addmm``); ``primary``: how many leading
    outputs carry the computation's value (the rest are kernel-specific: logsumexp, RNG state,
    debug masks), None when all do; ``reference``: the public op on the call's arguments by
    schema name, None when the op's own float64 run is the reference already."""

    name: str
    members: frozenset[str]
    primary: int | None = None
    reference: Reference | None = None
    implied: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()  # member -> arguments its name implies
    public: bool = True  # the reference calls the public op (on a device: that device's kernel), not a formula
    # a member's argument name -> the family's for it (a CUDA attention kernel's attn_bias is the
    # CPU kernel's attn_mask; cudnn's epsilon is eps): compare's argument check reads both sides so
    aliases: tuple[tuple[str, str], ...] = ()
    # outputs that are the kernel's own bytes (an RNN's workspace: uninitialised where inference
    # has nothing to keep for a backward): never compared, even against the same kernel; the
    # backward that reads them is
    workspace: tuple[int, ...] = ()
    # the local error's reference where it differs from ``reference``: the kernel's algorithm on
    # every argument it reads, what its forward saved included (an attention backward's
    # logsumexp and output), so that the forward's rounding is not read as the backward's own
    from_saved: Reference | None = None

    def argument_names(self, inputs: dict) -> dict:
        """``inputs`` (by schema name) under the family's names for them."""
        names = dict(self.aliases)
        return {names.get(n, n): v for n, v in inputs.items()}


def _aten(*names: str) -> frozenset[str]:
    return frozenset(f"aten.{n}" for n in names)


_ATTENTION_ARGUMENTS = (("attn_bias", "attn_mask"), ("bias", "attn_mask"))
_BATCH_NORM_ARGUMENTS = (("epsilon", "eps"), ("exponential_average_factor", "momentum"))

FAMILIES: tuple[Family, ...] = (
    Family("scaled_dot_product_attention", _aten(
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
        "_scaled_dot_product_attention_math_for_mps", "_scaled_dot_product_fused_attention_overrideable"),
        primary=1, reference=_sdpa, aliases=_ATTENTION_ARGUMENTS),
    Family("attention_forward_bmhk", _aten("_efficient_attention_forward", "_flash_attention_forward"),
           primary=1, reference=_sdpa_bmhk, aliases=_ATTENTION_ARGUMENTS),
    Family("scaled_dot_product_attention_backward", _aten(
        "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
        "_scaled_dot_product_fused_attention_overrideable_backward"),
        primary=3, reference=_attention_backward, aliases=_ATTENTION_ARGUMENTS,
        from_saved=_attention_backward_from_saved),
    Family("batch_norm", _aten(
        "batch_norm", "native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training", "_batch_norm_with_update", "_batch_norm_no_update"),
        primary=1, reference=_batch_norm, aliases=_BATCH_NORM_ARGUMENTS,
        implied=(("aten._batch_norm_with_update", (("training", True),)),
                 ("aten._native_batch_norm_legit_no_training", (("training", False),)),
                 ("aten._batch_norm_no_update", (("training", False),)))),
    Family("batch_norm_backward", _aten(
        "native_batch_norm_backward", "cudnn_batch_norm_backward", "miopen_batch_norm_backward",
        "batch_norm_backward"), primary=3, reference=_batch_norm_backward, aliases=_BATCH_NORM_ARGUMENTS),
    Family("convolution", _aten(
        "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution",
        "miopen_convolution", "_nnpack_spatial_convolution", "thnn_conv2d", "_slow_conv2d_forward",
        "_conv_depthwise2d", "conv_depthwise3d", "slow_conv3d_forward", "_mps_convolution"),
        primary=1, reference=_conv),
    # CUDA runs a whole multi-layer RNN as one _cudnn_rnn (output, h_n, c_n, then its workspace
    # and weight buffer), where CPU runs mkldnn_rnn_layer per layer or matmuls per step
    Family("rnn", _aten("_cudnn_rnn", "miopen_rnn"), primary=3, reference=_rnn, workspace=(3,)),
    Family("rnn_backward", _aten("_cudnn_rnn_backward", "miopen_rnn_backward"), reference=_rnn_backward),
    # oneDNN's one-layer kernel: output, h_n, c_n, then its workspace (the kernel's own bytes)
    Family("rnn_layer", _aten("mkldnn_rnn_layer"), primary=3, workspace=(3,)),
    Family("layer_norm", _aten("native_layer_norm", "layer_norm", "_fused_layer_norm"), primary=1,
           reference=_layer_norm),
    Family("rms_norm", _aten("rms_norm", "_fused_rms_norm"), primary=1, reference=_rms_norm),
    Family("rms_norm_backward", _aten("_fused_rms_norm_backward"), primary=2, reference=_rms_norm_backward,
           public=False),
    # a linear layer with a bias, and one without: F.linear on a non-contiguous input runs
    # mm then add(bias) where a contiguous one runs addmm, and a device's layout (cudnn's) can
    # make either side either; an mm's output lacks the bias an addmm's holds, so they are two
    # kinds, and a region of one side's ops stands for the other's (the fused addmm+activation
    # kernel, _addmm_activation, likewise: its output is the activation's)
    Family("linear", _aten("linear", "addmm")),
    Family("matmul", _aten("mm", "matmul")),
    # an MoE's experts in one call; a closed form, as its kernel takes no float64
    Family("grouped_mm", _aten("_grouped_mm"), reference=_grouped_mm, public=False),
    Family("copy", _aten("_to_copy", "copy", "to", "_copy_from", "_copy_from_and_resize")),
)

_BY_OP: dict[str, Family] = {m: f for f in FAMILIES for m in f.members}


@lru_cache(maxsize=4096)  # read per row by attribution's rules: a few hundred ops
def packet(op: str) -> str:
    """``aten.addmm.default`` and ``aten.copy_.default`` -> ``aten.addmm``, ``aten.copy``."""
    parts = op.split(".")
    return f"{parts[0]}.{parts[1].rstrip('_')}" if len(parts) >= 2 else op


@lru_cache(maxsize=4096)  # a million records name a few hundred ops: look each up once
def family_of(op: str) -> Family | None:
    return _BY_OP.get(packet(op)) if op else None


def kind_of(op: str) -> str | None:
    """The family name that stands for ``op`` in alignment, or None when it has none."""
    f = family_of(op)
    return f"family:{f.name}" if f else None


def primary_outputs(op: str) -> int | None:
    """How many leading outputs of ``op`` its family compares across members (None: all)."""
    f = family_of(op)
    return f.primary if f else None


@lru_cache(maxsize=4096)  # one closure per op name, not one per recomputed call
def reference_of(op: str) -> Reference | None:
    """The device-neutral public op that recomputes a family member's primary outputs, given the
    call's arguments by schema name (with what the member's name implies: a ``_no_training``
    kernel has no ``training`` argument). It returns one tensor, or a tuple of the primaries."""
    f = family_of(op)
    return _with_implied(f, op, f.reference) if f is not None else None


def local_reference_of(op: str) -> Reference | None:
    """``reference_of``, or the family's reference from what the kernel's forward saved
    (``Family.from_saved``): what a call's local error is measured against."""
    f = family_of(op)
    return _with_implied(f, op, f.from_saved or f.reference) if f is not None else None


def _with_implied(f: Family, op: str, reference: Reference | None) -> Reference | None:
    """``reference`` given, besides the call's arguments, what the member's name implies."""
    if reference is None:
        return None
    implied = dict(dict(f.implied).get(packet(op), ()))
    return (lambda values: reference({**values, **implied})) if implied else reference


def runs_public_op(op: str) -> bool:
    """Whether ``op``'s reference calls its family's public op, so that on a device it runs that
    device's own kernel (a generated test may then call it in place of ``op``); False for a
    closed-form reference, which only the CPU reference runs."""
    f = family_of(op)
    return f is not None and f.reference is not None and f.public


_OUT_INDEX = re.compile(r"^out(\d+)")


def kernel_specific(bench_op: str, target_op: str, tensor: str, shapes: tuple | None = None) -> str | None:
    """Why output ``tensor`` of a pair of family members is not compared, or None. Two members
    share only the family's primary outputs: a CUDA kernel's logsumexp, philox seed and offset
    have no CPU counterpart of the same meaning. One member on both sides compares them all,
    unless ``shapes`` (bench's, target's) differ: the same op returns a placeholder where a
    device has nothing to save (CPU's eval-mode ``native_batch_norm`` gives an empty
    ``save_mean``, CUDA's one of C uninitialised elements)."""
    if not bench_op or not target_op:
        return None
    fb, ft = family_of(bench_op), family_of(target_op)
    if fb is None or fb is not ft or fb.primary is None:
        return None
    m = _OUT_INDEX.match(tensor or "")
    if m is not None and int(m.group(1)) in fb.workspace:
        return f"the kernel's own bytes ({fb.name}'s workspace, which its backward reads): not compared"
    same_op = packet(bench_op) == packet(target_op)
    if same_op and (shapes is None or shapes[0] == shapes[1]):
        return None
    if m is None or int(m.group(1)) < fb.primary:
        return None
    if same_op:
        return (f"kernel-specific output of {fb.name} (shaped {shapes[0]} on the bench, "
                f"{shapes[1]} on the target: a placeholder where one device saves nothing): not compared")
    return f"kernel-specific output of {fb.name} ({packet(bench_op)} vs {packet(target_op)}): not compared"


def primary_shapes(op: str, shapes: tuple) -> tuple:
    """The output shapes alignment compares: the family's primary outputs only."""
    f = family_of(op)
    return shapes if f is None or f.primary is None else tuple(shapes[:f.primary])

