"""Track which nn.Module is running, forward and backward, through global module hooks.

Global hooks see every module of every model without the user passing the model in. Paths are
the qualified names from the outermost module seen (``model.layers.0.self_attn.q_proj``); the
outermost module itself has the empty path. Backward attribution uses multi-grad hooks rather
than full backward hooks, because full backward hooks wrap outputs in a custom autograd
Function that breaks ``ReLU(inplace=True)`` and similar in-place code downstream.

The stack also names module state for the data edges (``producers``): each module's own
parameters and buffers under ``<module path>.<name>``, when its tree is first named and again
each time it is entered (a parameter may have been replaced since).

Module hooks are process-wide but a recording belongs to one thread (dispatch modes are
thread-local): the forward hooks act only on the thread that installed them, so another model
running in another thread is neither recorded nor able to disturb the stack. The backward
hooks need no filter: they are registered by that thread's forwards only, and fire on
whichever autograd thread runs their backward. A hook never raises into the user's code: an
internal error goes to ``on_error`` and the stack stops.
"""
from __future__ import annotations

import threading
import weakref
from collections import Counter
from typing import Any, Callable

import torch
from torch.nn.modules import module as nn_module
from torch.utils.weak import WeakIdKeyDictionary

from ..dump.dispatch_modes import no_torch_function
from ..dump.model import fit_name
from .flatten import flatten_tensors
from .producers import Producers

ModuleFrame = tuple[str, str]  # (path, class name)


def _grad_tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in flatten_tensors(value) if t.requires_grad]


class ModuleStack:
    """Maintains the stack of running modules; calls ``on_enter(frame, module, args)`` before a
    forward and ``on_exit(frame, call_index, kwargs, output, <on_enter's result>)`` after it returns."""

    def __init__(self, *, on_enter: Callable | None = None, on_exit: Callable | None = None,
                 backward: bool = False, producers: Producers | None = None,
                 on_error: Callable[[Exception], None] | None = None,
                 on_pass: Callable[[], None] | None = None) -> None:
        self.forward_stack: list[ModuleFrame] = []
        self.backward_stack: list[ModuleFrame] = []
        self.on_enter = on_enter
        self.on_exit = on_exit
        self.backward = backward
        self.calls: Counter[str] = Counter()
        self._paths: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # id(module) -> (weak reference, frame, state sources, its _parameters, its _buffers, state
        # count): what each entry of the module needs, worked out at its first entry (the hooks
        # run for every module call).
        self._known: dict[int, tuple] = {}
        self._sweep_known_at = 1024
        self._roots = 0
        self._handles: list = []
        self._objects: list[tuple[Any, Any]] = []  # (module, on_enter's result), parallel to forward_stack
        self._bw_task = -1
        self.producers = producers
        self.on_error = on_error
        self.on_pass = on_pass  # called as an outermost module call begins
        self.owner: int | None = None  # the thread whose modules are tracked; None: none

    # -- life cycle -------------------------------------------------------------------
    def install(self) -> None:
        self.owner = threading.get_ident()
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, with_kwargs=True, always_call=True),
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.owner = None
        drop_stale_hook_flags()

    def disown(self) -> None:
        """Track no thread any more (a forked child's copy, or after an internal error)."""
        self.owner = None

    # -- queries ----------------------------------------------------------------------
    def current(self, in_backward: bool) -> list[ModuleFrame]:
        if in_backward:
            task = torch._C._current_graph_task_id()
            if task != self._bw_task:  # a new backward pass: forget stale frames
                self._bw_task = task
                self.backward_stack.clear()
            return self.backward_stack
        return self.forward_stack

    def path_of(self, module: torch.nn.Module) -> str:
        path = self._paths.get(module)
        if path is None:
            if self.forward_stack:  # created on the fly inside a parent's forward
                parent = self.forward_stack[-1][0]
                path = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
                self._name_tree(module, path)
            else:  # a new outermost module
                prefix = "" if self._roots == 0 else f"{type(module).__name__}{self._roots}"
                self._roots += 1
                self._name_tree(module, prefix)
            path = self._paths[module]
        return path

    def _name_tree(self, root: torch.nn.Module, prefix: str) -> None:
        for name, sub in root.named_modules(remove_duplicate=False):
            if sub not in self._paths:
                # a path longer than the reader's MAX_NAME is cut here, once, for every record and source
                path = self._paths[sub] = fit_name(f"{prefix}.{name}" if prefix and name else (name or prefix))
                self._name_state(sub, path)

    def _name_state(self, module: torch.nn.Module, path: str) -> None:
        """Register the module's own parameters and buffers under their qualified names."""
        if self.producers is None:
            return
        for state, name, src in self._state_sources(module, path):
            self.producers.name_source(state.get(name), src)

    @staticmethod
    def _state_sources(module: torch.nn.Module, path: str) -> tuple[tuple[dict, str, str], ...]:
        """(the module's parameter or buffer dict, a name in it, its data-edge source) for each."""
        dot = f"{path}." if path else ""
        return (tuple((module._parameters, name, f"param:{dot}{name}") for name in module._parameters)
                + tuple((module._buffers, name, f"buffer:{dot}{name}") for name in module._buffers))

    def _known_module(self, module: torch.nn.Module) -> tuple:
        """``module``'s (weak reference, frame, state sources, ...), learnt once; again when its
        state dicts were replaced or a parameter or buffer registered or removed since (lazy
        modules, parametrizations)."""
        known = self._known.get(id(module))
        if (known is not None and known[0]() is module and known[3] is module._parameters
                and known[4] is module._buffers and known[5] == len(module._parameters) + len(module._buffers)):
            return known
        path = self.path_of(module)
        if len(self._known) >= self._sweep_known_at:  # modules made on the fly, then dropped
            self._known = {k: v for k, v in self._known.items() if v[0]() is not None}
            self._sweep_known_at = max(1024, 2 * len(self._known))
        known = self._known[id(module)] = (weakref.ref(module), (path, fit_name(type(module).__name__)),
                                           self._state_sources(module, path), module._parameters,
                                           module._buffers, len(module._parameters) + len(module._buffers))
        return known

    # -- hooks ------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        if threading.get_ident() != self.owner:
            return
        try:
            with no_torch_function():  # its torch calls are not the model's (dump/dispatch_modes.py)
                self._enter(module, args)
        except Exception as e:  # noqa: BLE001 - never into the user's forward
            self._broken(e)

    def _post(self, module: torch.nn.Module, args: tuple, *rest: Any) -> None:
        if threading.get_ident() != self.owner:
            return
        try:
            with no_torch_function():  # its torch calls are not the model's (dump/dispatch_modes.py)
                self._exit(module, rest)
        except Exception as e:  # noqa: BLE001 - never into the user's forward
            self._broken(e)

    def _broken(self, e: Exception) -> None:
        self.owner = None
        if self.on_error is not None:
            self.on_error(e)

    def _enter(self, module: torch.nn.Module, args: tuple) -> None:
        if not self.forward_stack and self.on_pass is not None:
            self.on_pass()
        _, frame, state, *_ = self._known_module(module)
        if state and self.producers is not None:  # a parameter may have been replaced since
            name_source = self.producers.name_source
            for owner, name, src in state:
                name_source(owner.get(name), src)
        self.forward_stack.append(frame)
        # on_enter's result (the module's inputs) rides in the same entry as the module, so the
        # two can never get out of step when a module raises.
        self._objects.append((module, self.on_enter(frame, module, args) if self.on_enter is not None else None))
        if self.backward and torch.is_grad_enabled():
            inputs = _grad_tensors(args)
            if inputs:  # gradients w.r.t. the inputs ready: this module's backward is over
                torch.autograd.graph.register_multi_grad_hook(
                    inputs, lambda grads, f=frame: self._bw_exit(f), mode="any")

    def _exit(self, module: torch.nn.Module, rest: tuple) -> None:
        # Pop back to this module even if an inner module raised and never ran its own hook.
        while self._objects and self._objects[-1][0] is not module:
            self._objects.pop()
            self.forward_stack.pop()
        if not self._objects:
            return
        if len(rest) != 2:  # always_call after forward raised: hook(module, args, None); no record
            self._objects.pop()
            self.forward_stack.pop()
            return
        kwargs, output = rest
        frame = self.forward_stack[-1]
        call_index = self.calls[frame[0]]
        self.calls[frame[0]] += 1
        if self.on_exit is not None:  # while the module is still on the stack
            self.on_exit(frame, call_index, kwargs, output, self._objects[-1][1])
        self._objects.pop()
        self.forward_stack.pop()
        if self.backward and torch.is_grad_enabled():
            outputs = _grad_tensors(output)
            if outputs:  # gradients w.r.t. the outputs arrive: this module's backward starts
                torch.autograd.graph.register_multi_grad_hook(
                    outputs, lambda grads, f=frame: self._bw_enter(f), mode="any")

    def _bw_enter(self, frame: ModuleFrame) -> None:
        self.current(True).append(frame)

    def _bw_exit(self, frame: ModuleFrame) -> None:
        stack = self.current(True)
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] == frame:
                del stack[i]
                break


def drop_stale_hook_flags() -> None:
    """Removing a global forward hook registered ``with_kwargs`` leaves its id in torch's
    ``_global_forward_hooks_with_kwargs`` (torch 2.13), and torch.compile then warns of global
    hooks on every later compiled module call: the recorder's hooks are gone, their flags go too."""
    from torch.nn.modules import module as nn_module

    flags = getattr(nn_module, "_global_forward_hooks_with_kwargs", None)
    hooks = getattr(nn_module, "_global_forward_hooks", {})
    for hook_id in [k for k in (flags or {}) if k not in hooks]:
        del flags[hook_id]
