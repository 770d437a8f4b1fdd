"""What quantization may cost one replayed call's outputs (``quant=...`` presets).

The budget is ``xray.numerics.quantization``'s, the one ``xray drift`` applies per layer, under
the preset's scheme: each float input rounded as the scheme stores it (static int8: per tensor),
weights (constants of two or more dims) as the scheme rounds them (int8 per output channel, int4
in groups of 32), carried through the op by its rule (products add NSRs, sums add noise
powers...), plus ``MARGIN`` times the op's own rounding (static int8: its output; dynamic int8:
a product's activation inputs) and a float32 kernel's error where the scheme leaves the op float.
It is computed from the float call in the worker, so the parent judges the backend's output
against its baseline with it.
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


def allowed_nsr(module: torch.nn.Module, inputs: tuple, outputs: list[torch.Tensor],
                scheme: str | None = None) -> list[float | None]:
    """Per output: the NSR the scheme's quantization of this call may leave (None for integer outputs)."""
    sch = q.scheme(scheme)
    acts = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    brought = [(sch.output_nsr(t), float(t.detach().double().pow(2).mean())) for t in acts]
    brought += [(q.weight_nsr(w, sch), float(w.detach().double().pow(2).mean()))
                for w in [*module.parameters(), *module.buffers()] if w.is_floating_point() and w.dim() >= 2]
    kind = op_kind(module)
    own_in = sch.input_nsr(kind, [(t, t) for t in acts])
    out = []
    for y in outputs:
        if not y.is_floating_point() or not y.numel():
            out.append(None)
            continue
        power = float(y.detach().double().pow(2).mean())
        inherited = q.combine(kind, brought, power)
        own = sch.output_nsr(y) + own_in
        out.append(q.Budget(inherited, inherited, own, q.activation_step(y), float_noise=sch.float_noise).allowed)
    return out
