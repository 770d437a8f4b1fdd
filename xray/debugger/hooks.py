"""Capture every module's forward inputs, parameters, buffers and outputs (wrappers around each
forward, see ModuleHooks), and their gradients (hooks on tensors). Parameters and buffers are
named by their qualified name in the model (``source``), so readers keep them apart from inputs.

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
import threading
from typing import Any, Callable

import torch

from ..record.flatten import flatten_kwargs, flatten_tensors
from ..dump.dispatch_modes import no_dispatch_modes
from .capture import CallKey, TensorCapture, call_key


def _user_modes() -> bool:
    """A TorchDispatchMode (dump_torch_api's tracer) or a TorchFunctionMode is on: neither may see
    the debugger's own tensor work (dump/dispatch_modes.py)."""
    return torch._C._len_torch_dispatch_stack() > 0 or torch._C._is_torch_function_mode_enabled()


_thread = threading.get_ident
_ABSENT = object()
_NO_COPY = ("xray PrecisionDebugger: a module cannot be copied or pickled between start() and stop(); "
            "do it before start() or after stop()")


class CapturedForward:
    """The wrapper set in a module's ``__dict__`` while capturing (see ModuleHooks).

    A class rather than a closure for one reason: a copy made mid-step (copy.deepcopy, pickle)
    would carry a wrapper that runs the *original* module's forward, so it refuses with the
    reason. It carries ``__wrapped__``, so ``inspect.signature(module.forward)`` still reads the
    real signature (transformers validates ``generate``'s keywords with it).
    """

    __slots__ = ("__wrapped__", "_hooks", "_module")

    def __init__(self, hooks: "ModuleHooks", module: torch.nn.Module, forward: Callable) -> None:
        self.__wrapped__ = forward
        self._hooks = hooks
        self._module = module

    def __call__(self, *args, **kwargs):
        hooks = self._hooks
        if not hooks.active or _thread() != hooks.thread:  # another thread's call is not ours
            return self.__wrapped__(*args, **kwargs)
        entered = hooks._enter(self._module, args, kwargs)
        output = self.__wrapped__(*args, **kwargs)
        if entered is not None:
            hooks._exit(entered, output)
        return output

    def __deepcopy__(self, memo):
        raise TypeError(_NO_COPY)

    def __reduce_ex__(self, protocol):
        raise TypeError(_NO_COPY)


def _reaches(forward: Any, target: Callable | None) -> bool:
    """Whether ``target`` is ``forward`` or inside it, following ``__wrapped__`` links."""
    for _ in range(64):  # a chain of wrappers is short; a cycle must not hang us
        if forward is None or target is None:
            return False
        if forward is target:
            return True
        forward = getattr(forward, "__wrapped__", None)
    return False


class ModuleHooks:
    """Captures every submodule of one model during one step: ``install(step)`` puts a wrapper
    in front of each module's ``forward``, ``remove()`` takes them all off.

    Why wrappers and not ``register_forward_pre_hook``/``register_forward_hook``: a module with
    hooks leaves ``nn.Module.__call__``'s fast path for its slower general one (measured in
    tools/bench_debugger.py), and a pre/post pair needs a stack to carry each call from one hook
    to the other. A wrapper (CapturedForward) is one frame around the forward, set in the
    instance's ``__dict__`` (where ``__call__`` looks ``forward`` up first) and deleted
    afterwards, so the model carries nothing between steps. Unlike a forward hook, it sees the
    output the forward returned, before any user forward hook rewrites it.
    """

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
        self._bw_seq: dict[tuple[str, int], int] = {}
        # (module, our wrapper, what its __dict__ held under "forward" before: usually nothing)
        self._wrapped: list[tuple[torch.nn.Module, Callable, Any]] = []
        self._wrappers: dict[torch.nn.Module, Callable] = {}  # module -> its last wrapper
        self._grad_handles: list = []
        self._params_hooked: set[int] = set()
        self.active = False  # the wrappers capture only while True (a copy made after stop() is inert)
        # ... and only calls made on the thread that called install(): the wrappers sit on the
        # module itself, so a second thread running the same model (a serving or evaluation
        # thread) passes through them too. Its calls are neither recorded nor disturbed.
        # Gradients arrive on whichever thread the autograd engine uses, and are the recorded
        # calls' own (hooks on their tensors), so backward needs no such check.
        self.thread: int | None = None
        # Per module, resolved once: its path, class name and own parameter and buffer dicts.
        # The dicts are the module's live ones, so a parameter swapped between steps is seen.
        self._info = {m: (path, type(m).__name__, m._parameters, m._buffers) for m, path in self.paths.items()}
        # id(tensor) -> "param:<name>" / "buffer:<name>", by named_parameters()' names (a tied
        # weight keeps its first name); a tensor swapped in later is named by its module's path.
        self._sources = {id(t): f"{kind}:{name}" for kind, named in (("buffer", model.named_buffers()),
                                                                    ("param", model.named_parameters()))
                         for name, t in named}

    def install(self, step: int) -> None:
        """Capture ``step``: wrap every module's forward (unless still wrapped)."""
        self.step = step
        self.thread = _thread()
        self.calls.clear()
        self._bw_seq.clear()
        self._params_hooked.clear()
        if not self._wrapped:
            for m in self._info:
                before = m.__dict__.get("forward", _ABSENT)
                if before is not _ABSENT and _reaches(before, self._wrappers.get(m)):
                    continue  # ours is still inside another tool's wrapper: it wakes up with us
                self._wrapped.append((m, self._wrapper(m), before))
            for m, wrapper, _ in self._wrapped:
                m.__dict__["forward"] = wrapper
        self.active = True

    def remove(self) -> None:
        """Stop capturing and restore every forward. A module whose forward someone else
        replaced meanwhile keeps theirs; if theirs wraps ours (``__wrapped__``, as
        functools.wraps sets it), ours stays inside, inert until the next ``install``."""
        self.active = False
        for h in self._grad_handles:
            h.remove()
        self._grad_handles = []
        for m, wrapper, before in self._wrapped:
            if m.__dict__.get("forward") is wrapper:
                if before is _ABSENT:
                    del m.__dict__["forward"]
                else:
                    m.__dict__["forward"] = before
        self._wrapped = []

    # -- forward -------------------------------------------------------------------------
    def _wrapper(self, module: torch.nn.Module) -> Callable:
        """The wrapper around ``module.forward`` as it is now, kept from step to step while that
        forward stays the same."""
        forward = module.forward  # a new bound method each time, equal while nothing changed
        cached = self._wrappers.get(module)
        if cached is not None and cached.__wrapped__ == forward:
            return cached
        wrapper = CapturedForward(self, module, forward)
        self._wrappers[module] = wrapper
        return wrapper

    def _enter(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        """Capture the inputs and parameters; returns what ``_exit`` needs (None after an error:
        a debugger bug must never break the user's forward)."""
        try:
            if _user_modes():
                with no_dispatch_modes():
                    return self._capture_inputs(module, args, kwargs)
            # the usual case, without a context manager's two Python calls per module call
            return self._capture_inputs(module, args, kwargs)
        except Exception as e:
            self.on_error(e)
            return None

    def _capture_inputs(self, module, args, kwargs):
        path, cls, params, buffers = self._info[module]
        index = self.calls.get(path, 0)
        self.calls[path] = index + 1
        call = call_key((self.step, self.next_seq(), path, cls, index, "forward"))
        grad_mode = self.backward and torch.is_grad_enabled()
        capture = self.capture.capture
        # Numbered as flatten_tensors((args, kwargs)) numbers them; each keyword tensor also
        # notes its argument's name, so replay can pass it back by name.
        inputs = flatten_tensors(args)
        for i, t in enumerate(inputs):
            capture(call, "forward_input", str(i), t)
        if kwargs:
            for keyword, t in flatten_kwargs(kwargs):
                capture(call, "forward_input", str(len(inputs)), t, "", keyword)
                inputs.append(t)
        grad_inputs = [(i, t) for i, t in enumerate(inputs) if t.requires_grad] if grad_mode else []
        for name, p in params.items():
            if p is None:  # Linear(bias=False) registers its bias as None
                continue
            capture(call, "forward_params", name, p, self._source(p, "param", path, name))
            if grad_mode and p.requires_grad and id(p) not in self._params_hooked:
                self._params_hooked.add(id(p))
                self._grad_handles.append(p.register_hook(functools.partial(self._param_grad, path, cls, name)))
        for name, b in buffers.items():
            if b is not None:
                capture(call, "forward_buffers", name, b, self._source(b, "buffer", path, name))
        return call, grad_inputs

    def _source(self, t: torch.Tensor, kind: str, path: str, name: str) -> str:
        source = self._sources.get(id(t))
        if source is None or not source.startswith(kind):
            source = f"{kind}:{path}.{name}" if path else f"{kind}:{name}"
        return source

    def _exit(self, entered: tuple, output: Any) -> None:
        if not self.active:  # an error inside the forward stopped the capture
            return
        try:
            if _user_modes():
                with no_dispatch_modes():
                    self._capture_outputs(*entered, output)
            else:
                self._capture_outputs(*entered, output)
        except Exception as e:
            self.on_error(e)

    def _capture_outputs(self, call: CallKey, grad_inputs: list, output: Any) -> None:
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
