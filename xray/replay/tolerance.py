"""Does a backend agree with the baseline? Output by output, by the one rule of ``xray.numerics``.

Replay runs the baseline and the backend at the same dtype and has no fp64 reference to measure
the op's noise against, so each output is judged with the noise level ``noise.assumed`` gives
for its dtype (or the backend's compute dtype: fp16 presets): ``|got - ref| <= K_NOISE x level x
max(|ref|, rms(ref)) + smallest normal``; integers and bools exactly, except a selection's indices
(sort, topk, argmax...): they agree when they pick equal values of the input, however each kernel
breaks ties (``xray.numerics.selections``, compare's rule too).

Outputs are reported one by one: which agree, which differ, and why when it is known. A
secondary output whose shape or dtype kind differs while the primary output agrees is not a
wrong number but another definition (the export's SDPA decomposition returns the attention
weights where eager's kernel returns the logsumexp): that is ``SECONDARY_DIFFERS``, not a
``MISMATCH``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from ..backends.base import ReplayStatus
from ..numerics import noise
from ..numerics.selections import differing_picks, has_index_output

# What is known about outputs a decomposition defines differently (op name part -> note).
KNOWN_SECONDARY = {
    "scaled_dot_product": "the export's SDPA decomposition returns another tensor (attention weights, an "
                          "intermediate) where eager's fused kernel returns the logsumexp",
}


@dataclass
class BackendAgreement:
    """The backend's outputs against the baseline's: overall status and one note per output."""

    ok: bool
    max_abs: float | None  # largest |got - ref| over compared outputs (None when nothing was compared)
    max_rel: float | None  # largest |got - ref| / |ref| over elements with |ref| > 1e-3 rms(ref)
    message: str | None = None
    status: ReplayStatus = ReplayStatus.OK  # OK, MISMATCH or SECONDARY_DIFFERS
    outputs: list[str] = field(default_factory=list)  # "agrees" / "differs: ..." per output index
    mean_abs: float | None = None  # mean |got - ref| over every compared element
    mean_rel: float | None = None  # mean |got - ref| / |ref| over the elements max_rel reads


class _Means:
    """Mean absolute and relative error over every compared element of every output."""

    def __init__(self) -> None:
        self.abs_sum = self.rel_sum = 0.0
        self.n = self.n_rel = 0

    def add(self, ref: torch.Tensor, got: torch.Tensor) -> None:
        r, g = ref.detach().double().reshape(-1), got.detach().double().reshape(-1)
        d = (g - r).abs()
        finite = torch.isfinite(d)
        self.abs_sum += float(d[finite].sum())
        self.n += int(finite.sum())
        big = (r.abs() > 1e-3 * float(r.pow(2).mean().sqrt())) & finite
        self.rel_sum += float((d[big] / r[big].abs()).sum())
        self.n_rel += int(big.sum())

    @property
    def values(self) -> tuple[float | None, float | None]:
        return (self.abs_sum / self.n if self.n else None, self.rel_sum / self.n_rel if self.n_rel else None)


def judge_backend(ref: list[torch.Tensor], got: list[torch.Tensor], precision: torch.dtype | None = None,
                  op: str = "", arguments: Callable[[], Mapping[str, Any] | None] | None = None) -> BackendAgreement:
    """Judge every output; ``precision`` overrides the dtype whose noise level applies (fp16
    presets); ``op`` names the op, for the reason a secondary output differs. ``arguments``
    gives the call's arguments by name (read only where a selection's indices differ: they hold
    the input the indices point into)."""
    notes: list[str] = []
    layout_only: list[int] = []  # outputs that differ in shape or dtype kind: another definition
    numeric_bad = False
    worst_abs = worst_rel = 0.0
    compared = False
    means = _Means()
    for i in range(max(len(ref), len(got))):
        if i >= len(ref) or i >= len(got):
            notes.append(f"output {i}: only the {'backend' if i >= len(ref) else 'baseline'} returns it")
            layout_only.append(i)
            continue
        r, g = ref[i], got[i]
        note = _layout_note(r, g)
        if note:
            notes.append(f"output {i}: {note}")
            layout_only.append(i)
            continue
        if r.numel() == 0:
            notes.append(f"output {i}: agrees (empty)")
            continue
        dtype = precision if precision is not None and r.dtype.is_floating_point else r.dtype
        v = noise.judge(g.to(r.dtype) if g.dtype != r.dtype else g, r, noise.assumed(dtype))
        compared = True
        if r.is_floating_point():
            means.add(r, g)
        if not v.ok and (ties := _ties_only(op, i, arguments, r, g)) is not None:
            notes.append(f"output {i}: agrees up to the order of ties ({ties} of {r.numel()} indices name "
                         "another of equal values)")  # a distance between indices is no error
            continue
        worst_abs = max(worst_abs, v.max_abs_err)
        worst_rel = max(worst_rel, v.max_rel_err)
        if v.ok:
            notes.append(f"output {i}: agrees (max abs err {v.max_abs_err:.3g})")
        else:
            numeric_bad = True
            notes.append(f"output {i}: differs: {v.bad}/{v.numel} elements beyond {noise.K_NOISE:g} x the "
                         f"{_name(dtype)} noise level {noise.assumed(dtype).level:.3g} "
                         f"(max abs err {v.max_abs_err:.3g})")
    primary_agrees = bool(ref) and bool(got) and 0 not in layout_only and not numeric_bad
    if not layout_only and not numeric_bad:
        status = ReplayStatus.OK
    elif primary_agrees:
        status = ReplayStatus.SECONDARY_DIFFERS
        why = next((text for key, text in KNOWN_SECONDARY.items() if key in op), None)
        notes.append("secondary output(s) defined differently, not compared" + (f": {why}" if why else ""))
    else:
        status = ReplayStatus.MISMATCH
    ok = status == ReplayStatus.OK
    return BackendAgreement(ok, worst_abs if compared else None, worst_rel if compared else None,
                            None if ok else "; ".join(notes), status, notes, *means.values)


def judge_quantized(ref: list[torch.Tensor], got: list[torch.Tensor], allowed: list[float | None],
                    scheme: str = "int8") -> BackendAgreement:
    """A quantized program's outputs against the float baseline: each float output's NSR within
    its scheme's budget ``allowed`` (``xray.replay.quant_budget``), other outputs exactly; the error
    columns are measured as for floats."""
    from ..numerics.quantization import nsr

    notes, bad = [], False
    worst_abs = worst_rel = 0.0
    means = _Means()
    if len(ref) != len(got):
        return BackendAgreement(False, None, None, f"{len(got)} outputs, baseline has {len(ref)}",
                                ReplayStatus.MISMATCH, [])
    for i, (r, g) in enumerate(zip(ref, got)):
        note = _layout_note(r, g)
        if note:
            notes.append(f"output {i}: {note}")
            bad = True
            continue
        if not r.numel():
            continue
        budget = allowed[i] if i < len(allowed) else None
        if budget is None or not r.is_floating_point():
            same = bool(torch.equal(r, g.to(r.dtype)))
            bad |= not same
            notes.append(f"output {i}: {'agrees' if same else 'differs'} (exact)")
            continue
        means.add(r, g)
        d = (g.double() - r.double()).abs()
        worst_abs = max(worst_abs, float(d.max()))
        big = r.abs() > 1e-3 * float(r.double().pow(2).mean().sqrt())
        if bool(big.any()):
            worst_rel = max(worst_rel, float((d[big] / r.double()[big].abs()).max()))
        measured = nsr(r, g)
        within = measured <= budget
        bad |= not within
        notes.append(f"output {i}: {'within' if within else 'beyond'} {scheme} (NSR {measured:.3g}, "
                     f"budget {budget:.3g})")
    status = ReplayStatus.MISMATCH if bad else ReplayStatus.OK
    return BackendAgreement(not bad, worst_abs, worst_rel, "; ".join(notes) if bad else None, status, notes,
                            *means.values)


def _ties_only(op: str, i: int, arguments: Callable[[], Mapping[str, Any] | None] | None,
               ref: torch.Tensor, got: torch.Tensor) -> int | None:
    """How many indices of output ``i`` differ from the baseline's only by naming another of equal
    values, when that is all that differs; else None."""
    if arguments is None or not has_index_output(op) or ref.dtype.is_floating_point:
        return None
    call = arguments()
    differ = None if call is None else differing_picks(op, i, call, ref, got.to(ref.dtype))
    if differ is None or bool(differ.any()):
        return None
    return int((ref != got.to(ref.dtype)).sum())


def judge_layout(ref: list[torch.Tensor], got: list[torch.Tensor]) -> BackendAgreement:
    """Output count, shapes and dtypes only, for outputs whose values are random or uninitialized.
    Float dtypes may differ, as in ``judge_backend`` (fp16 presets return float16)."""
    notes = []
    if len(ref) != len(got):
        notes.append(f"{len(got)} outputs, baseline has {len(ref)}")
    for i, (r, g) in enumerate(zip(ref, got)):
        note = _layout_note(r, g)
        if note:
            notes.append(f"output {i}: {note}")
    ok = not notes
    return BackendAgreement(ok, None, None, "; ".join(notes) or None, ReplayStatus.OK if ok else ReplayStatus.MISMATCH, notes)


def _layout_note(r: torch.Tensor, g: torch.Tensor) -> str | None:
    """A shape difference, or a dtype difference that matters (float outputs may differ: fp16
    presets return float16)."""
    if tuple(r.shape) != tuple(g.shape):
        return f"shape {tuple(g.shape)}, baseline {tuple(r.shape)}"
    if r.dtype != g.dtype and not (r.dtype.is_floating_point and g.dtype.is_floating_point):
        return f"dtype {g.dtype}, baseline {r.dtype}"
    return None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
