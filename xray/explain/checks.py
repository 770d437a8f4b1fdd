"""What must hold before a graft means anything: the bench's output is finite, and the bench
gives the same output when run twice on the same input.

Every share is a difference of final errors measured against the bench's one output. A bench
that is NaN leaves nothing to measure against; a bench whose output moves between runs (dropout
in train mode, a random draw in ``forward``) makes each graft's difference partly run-to-run
noise, which explain would otherwise blame on whichever module drew it.
"""
from __future__ import annotations

import torch

from . import hooks
from .spec import Spec
from .trees import error


class NonFiniteBench(ValueError):
    """The bench's own final output holds NaN, or no finite value at all."""


class NotDeterministic(ValueError):
    """Two bench runs on the same input give different final outputs."""


def bench_is_finite(final: torch.Tensor, spec: Spec) -> None:
    """Refuse a bench output with a NaN or without one finite value. A lone Inf can be meant
    (a masked logit is -inf), and the final error already compares the Inf patterns; a NaN is
    never an answer."""
    finite = torch.isfinite(final)
    nans = int(torch.isnan(final).sum())
    if nans or not bool(finite.any()):
        bad = final.numel() - int(finite.sum())
        raise NonFiniteBench(f"the bench ({spec}) itself is non-finite: {bad} of {final.numel()} output values are "
                             f"NaN/Inf ({nans} NaN), so there is nothing to measure the target against; fix the bench "
                             "run first (xray compare shows where its NaN is born)")


def bench_repeats(model: torch.nn.Module, args: tuple, kwargs: dict, spec: Spec, first: hooks.Capture) -> None:
    """Run the bench again and refuse when its output moved, naming the first module whose
    output differs between the two runs (where the draw is made)."""
    again = hooks.run(model, args, kwargs, spec).final
    if not _differs(again, first.final):
        return
    third = hooks.run(model, args, kwargs, spec, hooks.Plan(capture=True)).capture
    where = next((f"{name} ({type(model.get_submodule(name)).__name__})" for name, k in third.returned
                  if k < len(first.calls.get(name, ())) and _differs(third.calls[name][k].output,
                                                                    first.calls[name][k].output)),
                 "the model's own code: no module's output differs")
    raise NotDeterministic(f"cannot tell: the model is not deterministic ({where}): two bench ({spec}) runs on the "
                           "same input give different outputs, so no graft's difference could be told from "
                           "run-to-run noise; call model.eval() (dropout), or make the randomness reproducible")


def _differs(a, b) -> bool:
    """Any difference at all (the normwise error is 0 only for equal values and NaN/Inf patterns)."""
    return error(a, b) != 0.0
