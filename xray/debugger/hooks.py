"""Per-module hooks that capture forward inputs, parameters and outputs, and their gradients.

Why not ``register_full_backward_hook``: it wraps outputs in a custom autograd Function whose
results are views, and ``ReLU(inplace=True)`` downstream then fails ("a view ... is being
modified inplace"). Instead, multi-grad hooks on the outputs give the module's grad_output,
and multi-grad hooks on the inputs give the gradient w.r.t. each input tensor. Hooks leave the
autograd graph untouched, so gradients stay bitwise identical. The price: an input shared by
several modules (q/k/v projections) reports its total gradient, summed over all its consumers;
giving each module its own share needs an identity node per module, and that node changed the
engine's accumulation order (measured: last-bit differences in the attention gradients).
Parameter gradients come from hooks on the parameters (summed over all calls of the step).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from .capture import CallKey, TensorCapture
from ..record.flatten import flatten_kwargs, flatten_tensors
from ..record.tracer import no_dispatch_modes

_dispatch_modes = torch._C._len_torch_dispatch_stack  # > 0 while a TorchDispatchMode is on


class ModuleHooks:
    """Installs hooks on every submodule of one model for one step; ``remove()`` takes them off."""

    def __init__(self, model: torch.nn.Module, capture: TensorCapture, next_seq: Callable[[], int],
                 *, backward: bool, on_error: Callable[[Exception], None]) -> None:
        self.model = model
        self.capture = capture
        self.next_seq = next_seq
        self.backward = backward
        self.on_error = on_error
        self.step = 0
        # A module reachable under two names keeps its first (named_modules' de-duplication).
        self.paths = {m: name for name, m in model.named_modules()}
        self.calls: dict[str, int] = {}  # module path -> calls so far this step
        self._stack: list[tuple[torch.nn.Module, CallKey, list]] = []
        self._bw_seq: dict[tuple[str, int], int] = {}
        self._handles: list = []
        self._grad_handles: list = []
        self.active = False
        self._params_hooked: set[int] = set()
        # Per module, resolved once: its path, class name and own parameter dict. The dict is
        # the module's live ``_parameters``, so a parameter swapped between steps is seen (and
        # named_parameters() per module per step was half of install()'s cost).
        self._info = {m: (path, type(m).__name__, m._parameters) for m, path in self.paths.items()}

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def install(self, step: int) -> None:
        """Capture ``step`` from now on (the module hooks are registered unless still there)."""
        self.step = step
        self.calls.clear()
        self._bw_seq.clear()
        self._params_hooked.clear()
        if not self._handles:
            for m in self._info:
                self._handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
                self._handles.append(m.register_forward_hook(self._post, with_kwargs=True))
        self.active = True

    def deactivate(self) -> None:
        """Stop capturing but leave the module hooks registered, inert (they return at once),
        for the next selected step: registering and removing 2 hooks per module cost ~0.8 ms a
        step on a 4-layer Llama. Gradient hooks on tensors and parameters always go."""
        self.active = False
        for h in self._grad_handles:
            h.remove()
        self._grad_handles = []
        self._stack.clear()

    def remove(self) -> None:
        self.deactivate()
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- forward -------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        if not self.active:
            return None
        try:
            if _dispatch_modes():  # dump_torch_api's tracer must not see our own tensor work
                with no_dispatch_modes():
                    self._enter(module, args, kwargs)
            else:  # the usual case, without a context manager's two Python calls per hook
                self._enter(module, args, kwargs)
        except Exception as e:  # a debugger bug must never break the user's forward
            self.on_error(e)
        return None

    def _enter(self, module, args, kwargs):
        path, cls, params = self._info[module]
        index = self.calls.get(path, 0)
        self.calls[path] = index + 1
        call = CallKey(self.step, self.next_seq(), path, cls, index, "forward")
        grad_mode = self.backward and torch.is_grad_enabled()
        capture = self.capture.capture
        # Numbered as flatten_tensors((args, kwargs)) numbers them; each keyword tensor also
        # notes its argument's name, so replay can pass it back by name.
        inputs = flatten_tensors(args)
        for i, t in enumerate(inputs):
            capture(call, "forward_input", str(i), t)
        for keyword, t in flatten_kwargs(kwargs):
            capture(call, "forward_input", str(len(inputs)), t, False, keyword)
            inputs.append(t)
        grad_inputs = [(i, t) for i, t in enumerate(inputs) if t.requires_grad] if grad_mode else []
        for name, p in params.items():
            if p is None:  # Linear(bias=False) registers its bias as None
                continue
            capture(call, "forward_params", name, p, True)
            if grad_mode and p.requires_grad and id(p) not in self._params_hooked:
                self._params_hooked.add(id(p))
                self._grad_handles.append(p.register_hook(functools.partial(self._param_grad, path, cls, name)))
        self._stack.append((module, call, grad_inputs))

    def _post(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any):
        if not self.active:
            return None
        # Pop back to this module even if an inner module raised and never ran its own hook.
        while self._stack and self._stack[-1][0] is not module:
            self._stack.pop()
        if not self._stack:
            return None
        _, call, grad_inputs = self._stack.pop()
        try:
            if _dispatch_modes():
                with no_dispatch_modes():
                    self._exit(call, output, grad_inputs)
            else:
                self._exit(call, output, grad_inputs)
        except Exception as e:
            self.on_error(e)
        return None

    def _exit(self, call: CallKey, output: Any, grad_inputs: list) -> None:
        outputs = flatten_tensors(output)
        capture = self.capture.capture
        for i, t in enumerate(outputs):
            capture(call, "forward_output", str(i), t)
        if self.backward and torch.is_grad_enabled():
            self._hook_backward(call, outputs, grad_inputs)

    # -- backward ------------------------------------------------------------------------
    def _hook_backward(self, call: CallKey, outputs: list[torch.Tensor], grad_inputs: list) -> None:
        grad_outs = [(i, t) for i, t in enumerate(outputs) if t.requires_grad]
        if grad_outs:
            self._grad_handles.append(torch.autograd.graph.register_multi_grad_hook(
                [t for _, t in grad_outs],
                functools.partial(self._grads, call, "backward_input", [i for i, _ in grad_outs]), mode="all"))
        if grad_inputs:
            self._grad_handles.append(torch.autograd.graph.register_multi_grad_hook(
                [t for _, t in grad_inputs],
                functools.partial(self._grads, call, "backward_output", [i for i, _ in grad_inputs]), mode="all"))

    def _bw_call(self, path: str, cls: str, call_index: int) -> CallKey:
        key = (path, call_index)
        seq = self._bw_seq.get(key)
        if seq is None:
            seq = self._bw_seq[key] = self.next_seq()
        return CallKey(self.step, seq, path, cls, call_index, "backward")

    def _grads(self, fwd: CallKey, role: str, indices: list[int], grads) -> None:
        try:
            with no_dispatch_modes():  # dump_torch_api's tracer must not see our own tensor work
                call = self._bw_call(fwd.path, fwd.cls, fwd.call_index)
                for i, g in zip(indices, grads):
                    if g is not None:
                        self.capture.capture(call, role, str(i), g)
        except Exception as e:
            self.on_error(e)

    def _param_grad(self, path: str, cls: str, name: str, grad: torch.Tensor) -> None:
        # The parameter's gradient summed over every call; it belongs to the first call,
        # whose backward runs last.
        try:
            with no_dispatch_modes():  # dump_torch_api's tracer must not see our own tensor work
                self.capture.capture(self._bw_call(path, cls, 0), "params_grad", name, grad)
        except Exception as e:
            self.on_error(e)
        return None
