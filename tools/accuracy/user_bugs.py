"""A user's own bug in a model's code: one call of a torch function made with a wrong argument.

Kernel faults (faults.py) corrupt what a right call returns; a user's bug is a right kernel
called wrongly: an attention mask left out, a wrong scale, a norm's eps, GELU's approximation, a
Linear's bias dropped, a wrong constant, GELU and SiLU swapped, a square weight transposed, a
softmax over the wrong dimension, a sum's term left out. ``WrongArgument`` applies one to the ``call``-th
applicable call of its kind, as a ``TorchFunctionMode``: above autograd and the recorder, so the
recorded ATen calls hold the wrong argument, as the user's code would make them. The ATen calls
made inside that call (``CallsInside``, entered below the recorder) are its ground truth: a
first divergence that names one of them names the bug. A call the bug leaves out (a dropped
term runs no ATen call on the target) is named by the bench's calls inside it instead
(``WrongArgument(..., mark_only=True)`` on the bench).

    python tools/sweep_architectures.py --scenarios user-bug --faults 2
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .faults import in_backward

_SDPA = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SIGNATURES = {  # positional parameter names of the functions changed below
    F.scaled_dot_product_attention: _SDPA,
    F.layer_norm: ("input", "normalized_shape", "weight", "bias", "eps"),
    F.group_norm: ("input", "num_groups", "weight", "bias", "eps"),
    F.gelu: ("input", "approximate"),
    F.silu: ("input", "inplace"),
    F.linear: ("input", "weight", "bias"),
    F.softmax: ("input", "dim", "_stacklevel", "dtype"),
}
if hasattr(F, "rms_norm"):
    _SIGNATURES[F.rms_norm] = ("input", "normalized_shape", "weight", "eps")
_NORMS = tuple(f for f in (F.layer_norm, F.group_norm, getattr(F, "rms_norm", None)) if f is not None)
# (``x * 0.5`` and ``0.5 * x`` reach a function mode as Tensor.mul(x, 0.5); ``x + eps`` as Tensor.add)
_SCALAR_OPS = (torch.Tensor.mul, torch.Tensor.div, torch.mul, torch.div)
_ADDS = (torch.Tensor.add, torch.add)
_SOFTMAXES = (F.softmax, torch.softmax, torch.Tensor.softmax)


def _dropped_mask(func, a: dict) -> dict | None:
    if func is not F.scaled_dot_product_attention or (a.get("attn_mask") is None and not a.get("is_causal")):
        return None
    return {**a, "attn_mask": None, "is_causal": False}


def _attention_scale(func, a: dict) -> dict | None:
    if func is not F.scaled_dot_product_attention:
        return None
    scale = a.get("scale")
    return {**a, "scale": 2 * (1 / math.sqrt(a["query"].shape[-1]) if scale is None else scale)}


def _norm_eps(func, a: dict) -> dict | None:
    """A norm's eps 1e4 times its own (1e-6 read as 1e-2): a functional norm's, or the small
    constant a hand-written RMS norm adds to its variance."""
    if func in _NORMS:
        eps = a.get("eps")
        return {**a, "eps": 1e4 * (1e-5 if eps is None else eps)}
    if func in _ADDS and len(a) == 2 and isinstance(a.get(1), float) and 0 < a[1] <= 1e-3 \
            and isinstance(a.get(0), torch.Tensor):
        return {**a, 1: a[1] * 1e4}
    return None


def _gelu_approximation(func, a: dict) -> dict | None:
    if func is not F.gelu:
        return None
    return {**a, "approximate": "none" if a.get("approximate", "none") == "tanh" else "tanh"}


def _dropped_bias(func, a: dict) -> dict | None:
    if func is not F.linear or a.get("bias") is None:
        return None
    return {**a, "bias": None}


def _wrong_activation(func, a: dict) -> tuple | None:
    """GELU run as SiLU and SiLU as GELU (a config's ``hidden_act`` read wrong): another
    function, so the change returns it with its arguments."""
    if func is F.gelu:
        return F.silu, {"input": a["input"]}
    if func is F.silu:
        return F.gelu, {"input": a["input"]}
    return None


def _transposed_weight(func, a: dict) -> dict | None:
    """A square Linear weight used transposed (a checkpoint converter's layout bug)."""
    w = a.get("weight")
    if func is not F.linear or not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[0] != w.shape[1]:
        return None
    return {**a, "weight": w.t()}


def _wrong_constant(func, a: dict) -> dict | None:
    """A tensor scaled by a wrong Python constant (an attention or embedding scale): x 1.25."""
    if func not in _SCALAR_OPS or len(a) != 2 or not isinstance(a.get(0), torch.Tensor) \
            or not isinstance(a.get(1), float) or a[1] in (0.0, 1.0, -1.0) or not math.isfinite(a[1]):
        return None
    return {**a, 1: a[1] * 1.25}


def _softmax_dim(func, a: dict) -> dict | None:
    """A softmax over the other one of its input's last two dimensions (attention probabilities
    normalised over the queries, a router's over the tokens): ``dim=-1`` read as ``-2``."""
    if func not in _SOFTMAXES:
        return None
    x, key = (a["input"], "dim") if "input" in a else (a.get(0), "dim" if "dim" in a else 1)
    dim = a.get(key)
    if not isinstance(x, torch.Tensor) or not isinstance(dim, int) or x.dim() < 2:
        return None
    last = dim % x.dim()
    if last < x.dim() - 2:
        return None
    other = 2 * x.dim() - 3 - last  # the last two dimensions swapped
    return {**a, key: other} if x.shape[other] > 1 else None


def _unchanged(t: torch.Tensor) -> torch.Tensor:
    return t


def _dropped_term(func, a: dict) -> tuple | None:
    """A sum of two same-shape tensors that keeps its second term alone (``residual + h`` written
    ``h``: a residual connection dropped; ``h + residual``: a sublayer skipped; an embedding or
    a rotary half not added). No ATen call runs in its place."""
    if func not in _ADDS or set(a) != {0, 1}:
        return None
    x, y = a[0], a[1]
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x is y or x.dim() < 2 \
            or x.shape != y.shape or not (x.is_floating_point() and y.is_floating_point()):
        return None  # (not the dtypes: an fp32 bench and a bf16 autocast target count the same calls)
    return _unchanged, {0: y}


BUGS: dict[str, Callable[[Any, dict], dict | None]] = {
    "dropped-mask": _dropped_mask, "attention-scale": _attention_scale, "norm-eps": _norm_eps,
    "gelu-approximation": _gelu_approximation, "dropped-bias": _dropped_bias, "wrong-constant": _wrong_constant,
    "wrong-activation": _wrong_activation, "transposed-weight": _transposed_weight,
    "softmax-dim": _softmax_dim, "dropped-term": _dropped_term,
}


@dataclass(frozen=True)
class UserBug:
    """The ``call``-th (0-based) forward call to which bug ``kind`` applies, made with it."""

    kind: str
    call: int

    def __str__(self) -> str:
        return f"{self.kind} at its call {self.call}"


def _named(func, args: tuple, kwargs: dict) -> dict:
    names = _SIGNATURES.get(func)
    if names is None:  # a method or an operator: positions
        return {**dict(enumerate(args)), **kwargs}
    return {**dict(zip(names, args)), **kwargs}


def _call(func, a: dict):
    positional = [a[i] for i in sorted(k for k in a if isinstance(k, int))]
    return func(*positional, **{k: v for k, v in a.items() if not isinstance(k, int)})


class WrongArgument(TorchFunctionMode):
    """Counts the forward calls ``kind`` applies to (``calls``) and, where ``bug`` is given, makes
    its ``call``-th one with the wrong argument (``mark_only``: as it was, on the bench, to note
    the calls made inside it); ``active`` while that call runs, ``hit`` once it has."""

    def __init__(self, kind: str, bug: UserBug | None = None, mark_only: bool = False) -> None:
        super().__init__()
        self.change, self.bug, self.mark_only = BUGS[kind], bug, mark_only
        self.calls, self.active, self.hit = 0, False, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if in_backward():
            return func(*args, **kwargs)
        try:
            named = _named(func, args, kwargs)
            changed = self.change(func, named)
        except Exception:  # noqa: BLE001 - an argument this bug does not read as it expects
            changed = None
        if changed is None:
            return func(*args, **kwargs)
        index, self.calls = self.calls, self.calls + 1
        if self.bug is None or index != self.bug.call:
            return func(*args, **kwargs)
        self.active, self.hit = True, True
        if self.mark_only:
            changed = {**dict(enumerate(args)), **kwargs}
        elif isinstance(changed, tuple):  # another function (wrong-activation, dropped-term)
            func, changed = changed
        try:
            return _call(func, changed)
        finally:
            self.active = False


class CallsInside(TorchDispatchMode):
    """(op, direction, index among that op's calls) of every ATen call made while ``bug`` is
    active, counted as CorruptCall counts: the calls the wrong argument went into."""

    def __init__(self, bug: WrongArgument) -> None:
        super().__init__()
        self.bug = bug
        self.counts: dict[tuple[str, str], int] = {}
        self.calls: list[tuple[str, str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        key = (str(func), "backward" if in_backward() else "forward")
        index = self.counts.get(key, 0)
        self.counts[key] = index + 1
        if self.bug.active:
            self.calls.append((*key, index))
        return func(*args, **(kwargs or {}))
