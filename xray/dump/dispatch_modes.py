"""Stepping outside the active TorchDispatchModes and TorchFunctionModes for xray's own tensor work.

The recorder's statistics, the writer's conversion of saved copies and the module debugger's
bookkeeping run torch ops: with a dispatch mode active (xray's own tracer, or another one below
it) those ops would be recorded or intercepted, and a user's function mode (a counter, ``with
torch.device(...)``, which places new tensors) would see and change them as the model's own.
This is the one way out, shared by all of them.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import _disable_current_modes

no_torch_function = torch._C.DisableTorchFunction  # function modes off (and subclasses' handlers)


@contextmanager
def _neither():
    with torch._C.DisableTorchFunction(), _disable_current_modes():
        yield


def no_dispatch_modes():
    """A context with every dispatch mode and every function mode off. Without a dispatch mode
    it is torch's C context alone: the module debugger enters this twice per module call."""
    return _neither() if torch._C._len_torch_dispatch_stack() > 0 else torch._C.DisableTorchFunction()
