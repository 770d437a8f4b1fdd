"""Stepping outside the active TorchDispatchModes for xray's own tensor work.

The recorder's statistics, the writer's conversion of saved copies and the module debugger's
bookkeeping run torch ops: with a dispatch mode active (xray's own tracer, or another one below
it) those ops would be recorded or intercepted. This is the one way out, shared by all of them.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.utils._python_dispatch import _disable_current_modes

_NO_MODES = nullcontext()  # reusable: nullcontext keeps no state between uses


def no_dispatch_modes():
    """A context with every dispatch mode off. Without any mode it returns one shared no-op
    context: the module debugger enters this twice per module call, and a fresh nullcontext
    per call cost twice as much."""
    return _disable_current_modes() if torch._C._len_torch_dispatch_stack() > 0 else _NO_MODES
