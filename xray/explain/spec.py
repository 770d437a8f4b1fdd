"""SPEC: a device and a precision mode, ``cpu``, ``cpu:bf16``, ``cpu:fp16``, ``cuda:tf32``, ``cuda:bf16``.

Parsed here and nowhere else. A mode is how the run computes, not what the weights are stored
in: ``bf16``/``fp16`` run the model under ``torch.autocast`` (storage stays fp32, as in mixed
precision training and inference), ``tf32`` lets float32 matmuls and convolutions round their
inputs to TF32 (CUDA), ``fp32`` (the default) is plain float32. ``bf16-cast``/``fp16-cast`` store
the model itself in that dtype (``model.to(dtype)``), as a half-precision deployment does.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils._pytree import tree_map

from ..numerics import math_settings

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ("fp32", "bf16", "fp16", "tf32", "bf16-cast", "fp16-cast")


class SpecError(ValueError):
    """A SPEC that cannot be parsed or run here."""


@dataclass(frozen=True)
class Spec:
    device: str  #: torch device string: "cpu", "cuda", "cuda:1", "mps"
    mode: str = "fp32"  #: one of MODES

    @property
    def device_type(self) -> str:
        return torch.device(self.device).type

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return _DTYPES.get(self.mode)

    @property
    def cast_dtype(self) -> torch.dtype | None:
        """The storage dtype of a ``*-cast`` mode (the whole model is converted), else None."""
        return _DTYPES.get(self.mode.removesuffix("-cast")) if self.mode.endswith("-cast") else None

    def __str__(self) -> str:
        return self.device if self.mode == "fp32" else f"{self.device}:{self.mode}"

    def prepare(self, model: torch.nn.Module, inputs: Any) -> tuple[torch.nn.Module, Any]:
        """The model and inputs as this spec runs them: a copy moved (and for ``*-cast``
        converted) when anything changes, else the same objects."""
        here = next((p.device for p in model.parameters()), torch.device("cpu"))
        if self.cast_dtype is not None or torch.device(self.device) != here:
            model = copy.deepcopy(model).to(self.device)
            if self.cast_dtype is not None:
                model = model.to(self.cast_dtype)
        return model, move(inputs, self.device, self.cast_dtype)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The precision mode around one forward (inference: no_grad)."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            if self.autocast_dtype is not None:
                stack.enter_context(torch.autocast(self.device_type, dtype=self.autocast_dtype))
            if self.mode == "tf32":
                stack.enter_context(math_settings.tf32())
            elif self.device_type == "cuda":  # fp32 means fp32: no TF32 rounding left on by the user
                stack.enter_context(math_settings.tf32(False))
            yield


def move(tree: Any, device: str | torch.device, float_dtype: torch.dtype | None = None) -> Any:
    """Every tensor of ``tree`` on ``device``; floating ones converted to ``float_dtype`` if given."""
    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if float_dtype is not None and t.is_floating_point():
            return t.to(device=device, dtype=float_dtype)
        return t.to(device)
    return tree_map(one, tree)


def parse_spec(text: str) -> Spec:
    """``cuda:bf16`` -> Spec("cuda", "bf16"); ``cuda:1:bf16`` and ``cpu`` work too."""
    text = (text or "").strip()
    device, mode = text, "fp32"
    head, sep, tail = text.rpartition(":")
    if sep and tail in MODES:
        device, mode = head, tail
    elif sep and not tail.isdigit():
        raise SpecError(f"SPEC {text!r}: unknown precision mode {tail!r}; use one of {', '.join(MODES)}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SpecError(f"SPEC {text!r}: {device!r} is not a torch device (cpu, cuda, cuda:1, mps)") from None
    if mode == "tf32" and dev.type != "cuda":
        raise SpecError(f"SPEC {text!r}: tf32 is a CUDA matmul mode; on {dev.type} use fp32, bf16 or fp16")
    return Spec(device, mode)


def check_available(spec: Spec) -> None:
    """Refuse a device this machine does not have, in one line."""
    kind = spec.device_type
    if kind == "cuda" and not torch.cuda.is_available():
        raise SpecError(f"SPEC {spec}: no CUDA device here")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise SpecError(f"SPEC {spec}: no MPS device here")
