"""Faults and noise below xray's recorder: dispatch modes entered *before* ``xray.begin_dump``.

A mode entered first sits under the recorder on the mode stack, so the recorder records what
these modes return as the op's own output, as a buggy (or lower-precision) kernel would
produce it. Their own tensor work happens inside ``__torch_dispatch__`` with the mode popped,
so the recorder above never sees it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from xray.record.encode import bind_inputs, op_info, recorded_result

Corruption = Callable[[torch.Tensor], torch.Tensor]


def in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _spread(numel: int, n: int) -> list[int]:
    """n positions spread over the tensor (not all at its start, where a few rows may be padding)."""
    return sorted({(numel * (2 * i + 1)) // (2 * n) for i in range(n)})


def relative(eps: float) -> Corruption:
    """Every element off by the same relative error (a kernel computing at lower precision)."""
    return lambda t: t * (1 + eps)


def few_elements(n: int = 3, eps: float = 1e-2) -> Corruption:
    def corrupt(t: torch.Tensor) -> torch.Tensor:
        t, scale = t.clone(memory_format=torch.contiguous_format), t.abs().mean()
        flat = t.view(-1)
        for i in _spread(flat.numel(), n):
            flat[i] = flat[i] * (1 + eps) + eps * scale  # relative, and visible on a zero element too
        return t
    return corrupt


def spike(factor: float = 8.0) -> Corruption:
    """One element jumps by ``factor`` times the tensor's mean magnitude."""
    def corrupt(t: torch.Tensor) -> torch.Tensor:
        t = t.clone(memory_format=torch.contiguous_format)
        flat = t.view(-1)
        flat[flat.numel() // 3] += factor * t.abs().mean()
        return t
    return corrupt


def zero_column(col: int = 1) -> Corruption:
    def corrupt(t: torch.Tensor) -> torch.Tensor:
        t = t.clone(memory_format=torch.contiguous_format)
        t[..., col % t.shape[-1]] = 0
        return t
    return corrupt


def int_bump() -> Corruption:
    """An integer result off by one in one element (a wrong position id, a wrong index)."""
    def corrupt(t: torch.Tensor) -> torch.Tensor:
        t = t.clone(memory_format=torch.contiguous_format)
        t.view(-1)[t.numel() // 2] += 1
        return t
    return corrupt


class CorruptCall(TorchDispatchMode):
    """Corrupt the ``output``-th tensor output (0-based, ``tensor_outputs``' order; of an op that
    returns nothing but writes, like ``_foreach_addcdiv_``, the ``output``-th tensor it wrote) of
    the ``call``-th call (0-based) of ``op`` in ``direction``.

    ``hit`` says whether it fired; ``shape`` is the corrupted output's shape (a check on the
    ground truth found in the dump)."""

    def __init__(self, op: str, call: int, corrupt: Corruption, direction: str = "forward", output: int = 0) -> None:
        super().__init__()
        self.op, self.call, self.corrupt, self.direction, self.output = op, call, corrupt, direction, output
        self.calls = 0
        self.hit = False
        self.shape: tuple | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func) != self.op or (in_backward() != (self.direction == "backward")):
            return out
        index, self.calls = self.calls, self.calls + 1
        if index != self.call:
            return out
        info = op_info(func)
        if info.written_results:  # returns nothing: corrupt what it wrote, in place
            written = tensor_outputs(recorded_result(info, out, bind_inputs(info, args, kwargs or {})))
            if self.output < len(written):
                target = written[self.output]
                self.hit, self.shape = True, tuple(target.shape)
                target.copy_(self.corrupt(target))
            return out
        results = list(out) if isinstance(out, (tuple, list)) else [out]
        slots = [i for i, t in enumerate(results) if isinstance(t, torch.Tensor) and t.numel() > 0]
        if self.output >= len(slots):
            return out
        i = slots[self.output]
        self.hit, self.shape = True, tuple(results[i].shape)
        results[i] = self.corrupt(results[i])
        return type(out)(results) if isinstance(out, (tuple, list)) else results[0]


def tensor_outputs(result: Any) -> list[torch.Tensor]:
    """A call's tensor outputs with elements, in order (a list output's tensors in place): the
    slots ``CorruptCall``'s ``output`` counts."""
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in tensor_outputs(r)]
    return [result] if isinstance(result, torch.Tensor) and result.numel() > 0 else []


def round_mantissa(t: torch.Tensor, bits: int = 10) -> torch.Tensor:
    """Round float32 values to ``bits`` mantissa bits, nearest-even (what TF32 math does to inputs)."""
    drop = 23 - bits
    i = t.view(torch.int32)  # same element size: a view for any strides, and the result keeps them
    half = (1 << (drop - 1)) - 1 + ((i >> drop) & 1)
    return ((i + half) & ~((1 << drop) - 1)).view(torch.float32)


# The matmul-like ops and which of their arguments are matmul operands (TF32 rounds those only).
MATMUL_OPERANDS = {
    "aten.mm.default": (0, 1), "aten.bmm.default": (0, 1), "aten.addmm.default": (1, 2),
    "aten.baddbmm.default": (1, 2), "aten.convolution.default": (0, 1),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (0, 1, 2),
}


class ReducedPrecisionMatmul(TorchDispatchMode):
    """Run every float32 matmul/conv/attention on inputs rounded to a 10-bit mantissa
    (TF32-like); the recorded inputs stay the float32 ones, as on a TF32 device."""

    def __init__(self, bits: int = 10) -> None:
        super().__init__()
        self.bits = bits

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        operands = MATMUL_OPERANDS.get(str(func))
        if operands and not in_backward():
            args = tuple(round_mantissa(a, self.bits) if i in operands and isinstance(a, torch.Tensor)
                         and a.dtype == torch.float32 else a for i, a in enumerate(args))
        return func(*args, **(kwargs or {}))


class StorageReaders(TorchDispatchMode):
    """Note (op, direction, index among that op's calls) of the calls reading ``tensor``'s
    storage, up to and including the first one that is not a view: a changed parameter is
    first seen there (``aten.t`` of a Linear weight, then the ``mm`` that reads it)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.ptr = tensor.untyped_storage().data_ptr()
        self.counts: dict[tuple[str, str], int] = {}
        self.readers: list[tuple[str, str, int]] = []
        self.done = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        key = (str(func), "backward" if in_backward() else "forward")
        index = self.counts.get(key, 0)
        self.counts[key] = index + 1
        if not self.done and any(self._reads(a) for a in (*args, *(kwargs or {}).values())):
            self.readers.append((*key, index))
            self.done = not func.is_view
        return func(*args, **(kwargs or {}))

    def _reads(self, a) -> bool:
        if isinstance(a, (list, tuple)):
            return any(self._reads(x) for x in a)
        return isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == self.ptr


class FusedRmsNormKernel:
    """A fused RMS norm kernel registered for CPU, as CUDA has one: inside this context F.rms_norm
    dispatches ``aten._fused_rms_norm`` (and its backward ``_fused_rms_norm_backward``) as one
    call, where CPU otherwise runs pow, mean, add, rsqrt and muls. It computes as CUDA's does:
    float32 statistics, the result cast back to the input's dtype. Registered only while entered
    (torch.library), so nothing else in the process sees it."""

    def __enter__(self) -> "FusedRmsNormKernel":
        self.lib = torch.library.Library("aten", "IMPL")
        self.lib.impl("_fused_rms_norm", _fused_rms_norm, "CPU")
        self.lib.impl("_fused_rms_norm_backward", _fused_rms_norm_backward, "CPU")
        return self

    def __exit__(self, *exc) -> None:
        self.lib._destroy()


def _rstd(x: torch.Tensor, shape: list[int], eps: float | None) -> torch.Tensor:
    dims = tuple(range(-len(shape), 0))
    e = torch.finfo(x.dtype).eps if eps is None else eps
    return torch.rsqrt(x.float().pow(2).mean(dims, keepdim=True) + e)


def _fused_rms_norm(x, shape, weight, eps):
    rstd = _rstd(x, shape, eps)
    out = (x.float() * rstd).to(x.dtype)
    return (out * weight if weight is not None else out), rstd


def _fused_rms_norm_backward(grad, x, shape, rstd, weight, mask):
    """The closed form CUDA's kernel computes (xray's reference for this op, kernel_families), at
    float32 and cast back: autograd is off inside a kernel."""
    from xray.numerics.kernel_families import reference_of

    dx, dw = reference_of("aten._fused_rms_norm_backward.default")(
        {"grad_out": grad.float(), "input": x.float(), "normalized_shape": shape, "rstd": rstd.float(),
         "weight": None if weight is None else weight.float(), "output_mask": mask})
    return (None if dx is None else dx.to(x.dtype)), (None if dw is None else dw.to(weight.dtype))


class CudnnRnnKernel:
    """A cuDNN-like RNN kernel registered for CPU, as CUDA has one: inside this context nn.LSTM
    and nn.GRU (unidirectional, unpacked, no projection) dispatch one ``aten._cudnn_rnn`` for all
    their layers, and their backward one ``_cudnn_rnn_backward``, as CUDA's ``_cudnn_impl`` does,
    where CPU runs ``mkldnn_rnn_layer`` per layer. It computes as cuDNN does under its default
    ``torch.backends.cudnn.allow_tf32``: each step's GEMMs on operands rounded to TF32, the gates
    in float32. Registered only while entered (torch.library), and the RNN modules' ``_VF`` is
    restored after."""

    def __init__(self, bits: int | None = 10) -> None:
        self.bits = bits

    def __enter__(self) -> "CudnnRnnKernel":
        import torch.nn.modules.rnn as rnn

        self.lib = torch.library.Library("aten", "IMPL")
        self.lib.impl("_cudnn_rnn", self._forward, "CPU")
        self.lib.impl("_cudnn_rnn_backward", self._backward, "CPU")
        self.module, self.saved = rnn, rnn._VF
        rnn._VF = _CudnnVF(self.saved)
        return self

    def __exit__(self, *exc) -> None:
        self.module._VF = self.saved
        self.lib._destroy()

    def _round(self, t: torch.Tensor) -> torch.Tensor:
        """TF32's operand rounding (round_mantissa's nearest-even), written without bit views so
        torch.func can differentiate through it: the gradient passes straight through."""
        if self.bits is None or t.dtype != torch.float32:
            return t
        scale = 2.0 ** (self.bits + 1)  # frexp's mantissa is in [0.5, 1): bits + 1 significant bits
        m, e = torch.frexp(t)
        return t + (torch.ldexp(torch.round(m * scale) / scale, e) - t).detach()

    def _run(self, v: dict):
        """(output, h_n, c_n) of the layers, step by step."""
        x = v["input"].transpose(0, 1) if v["batch_first"] else v["input"]  # (T, B, F)
        weights, per, lstm = list(v["weight"]), int(v["weight_stride0"]), int(v["mode"]) == 2
        hs, cs = [], []
        for layer in range(int(v["num_layers"])):
            w_ih, w_hh, *bias = weights[layer * per:(layer + 1) * per]
            b_ih, b_hh = bias if bias else (None, None)
            h = v["hx"][layer]
            c = v["cx"][layer] if lstm else None
            gi = self._round(x) @ self._round(w_ih).t() + (b_ih if b_ih is not None else 0)  # every step at once
            outs = []
            for t in range(x.shape[0]):
                gh = self._round(h) @ self._round(w_hh).t() + (b_hh if b_hh is not None else 0)
                if lstm:
                    i, f, g, o = (gi[t] + gh).chunk(4, -1)
                    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(c)
                else:  # GRU: r, z, n
                    ir, iz, in_ = gi[t].chunk(3, -1)
                    hr, hz, hn = gh.chunk(3, -1)
                    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
                    h = (1 - z) * torch.tanh(in_ + r * hn) + z * h
                outs.append(h)
            x = torch.stack(outs)
            hs.append(h)
            cs.append(c)
        out = x.transpose(0, 1) if v["batch_first"] else x
        return out, torch.stack(hs), (torch.stack(cs) if lstm else v["hx"].new_empty(0))

    def _forward(self, input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size, num_layers,
                 batch_first, dropout, train, bidirectional, batch_sizes, dropout_state):
        v = dict(input=input, weight=weight, weight_stride0=weight_stride0, hx=hx, cx=cx, mode=mode,
                 num_layers=num_layers, batch_first=batch_first)
        with torch.no_grad():
            out, hy, cy = self._run(v)
        return out, hy, cy, input.new_empty(0), input.new_empty(0)

    def _backward(self, input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy, grad_cy,
                  mode, hidden_size, proj_size, num_layers, batch_first, dropout, train, bidirectional, batch_sizes,
                  dropout_state, reserve, output_mask):
        """Autograd through the same steps: the gradients cuDNN's backward computes. A kernel
        runs below autograd (its keys excluded), so they are let back in for the recomputation."""
        exclude = torch._C._dispatch_tls_local_exclude_set()
        for key in (torch._C.DispatchKey.AutogradCPU, torch._C.DispatchKey.ADInplaceOrView):
            exclude = exclude.remove(key)
        with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
            x, h0 = input.detach().requires_grad_(), hx.detach().requires_grad_()
            c0 = cx.detach().requires_grad_() if cx is not None else None
            ws = [w.detach().requires_grad_() for w in weight]
            outs = self._run(dict(input=x, weight=ws, weight_stride0=weight_stride0, hx=h0, cx=c0, mode=mode,
                                  num_layers=num_layers, batch_first=batch_first))
            pairs = [(t, g) for t, g in zip(outs, (grad_output, grad_hy, grad_cy)) if g is not None and t.numel()]
            wrt = [x, h0] + ([c0] if c0 is not None else []) + ws
            grads = torch.autograd.grad([t for t, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
        gw = [g if g is not None else torch.zeros_like(w) for g, w in zip(grads[len(wrt) - len(ws):], ws)]
        mask = list(output_mask)
        gcx = grads[2] if c0 is not None else None
        return (grads[0] if mask[0] else None), (grads[1] if mask[1] else None), (gcx if mask[2] else None), \
            (gw if mask[3] else [])


class _CudnnVF:
    """torch._VF with lstm and gru sent through ``aten._cudnn_rnn`` where CUDA's cuDNN path
    would take them (unidirectional, unpacked, no projection); anything else runs as before."""

    def __init__(self, real) -> None:
        self.real = real

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def _cudnn(self, mode: int, input, hx, cx, weights, has_biases, num_layers, dropout, train, bidirectional,
               batch_first):
        out, hy, cy, _, _ = torch.ops.aten._cudnn_rnn(input, list(weights), 4 if has_biases else 2, None, hx, cx, mode,
                                                      hx.shape[-1], 0, num_layers, batch_first, dropout, train,
                                                      bidirectional, [], None)
        return out, hy, cy

    def lstm(self, *args):
        if len(args) != 9 or not isinstance(args[1], (tuple, list)) or args[7] or args[1][0].shape != args[1][1].shape:
            return self.real.lstm(*args)
        input, (hx, cx), weights, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
        return self._cudnn(2, input, hx, cx, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first)

    def gru(self, *args):
        if len(args) != 9 or not isinstance(args[1], torch.Tensor) or args[7]:
            return self.real.gru(*args)
        input, hx, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
        out, hy, _ = self._cudnn(3, input, hx, None, weights, has_biases, num_layers, dropout, train, bidirectional,
                                 batch_first)
        return out, hy
