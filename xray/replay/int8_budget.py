"""What static int8 quantization may cost one replayed call's outputs (``quant=int8`` presets).

The budget is ``xray.numerics.quantization``'s, the one ``xray drift`` applies per layer: each
float input rounded per tensor (activations) or per output channel (weights, constants of two
or more dims), carried through the op by its rule (products add NSRs, sums add noise powers...),
plus ``MARGIN`` times one rounding of the output itself. It is computed from the float call in
the worker, so the parent judges the backend's output against its baseline with it.
"""
from __future__ import annotations

import torch

from ..numerics import quantization as q


def op_kind(module: torch.nn.Module) -> str:
    """The rule's name for the call: ``mm`` for ``aten.mm.default``, ``linear`` for ``nn.Linear``."""
    op = getattr(module, "op", None)
    if op is not None:
        return str(op).split(".")[1] if str(op).count(".") >= 2 else str(op)
    return type(module).__name__.lower()


def allowed_nsr(module: torch.nn.Module, inputs: tuple, outputs: list[torch.Tensor]) -> list[float | None]:
    """Per output: the NSR int8 quantization of this call may leave (None for integer outputs)."""
    brought = [(q.activation_nsr(t), float(t.detach().double().pow(2).mean()))
               for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    brought += [(q.weight_nsr(w), float(w.detach().double().pow(2).mean()))
                for w in [*module.parameters(), *module.buffers()] if w.is_floating_point() and w.dim() >= 2]
    kind = op_kind(module)
    out = []
    for y in outputs:
        if not y.is_floating_point() or not y.numel():
            out.append(None)
            continue
        power = float(y.detach().double().pow(2).mean())
        inherited = q.combine(kind, brought, power)
        own = q.activation_nsr(y)
        out.append(q.Budget(inherited, inherited, own, q.activation_step(y)).allowed)
    return out
