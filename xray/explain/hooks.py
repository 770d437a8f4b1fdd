"""One forward of a model with module hooks: capture every module call's inputs and output
(the bench), or graft bench values in (the target).

A *place* is a named module; its calls are matched between runs by their order (the k-th call
of ``model.layers.0.mlp`` on one side is its k-th call on the other).
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from . import trees
from .spec import Spec


@dataclass
class Call:
    args: Any
    kwargs: dict
    output: Any = None


@dataclass
class Capture:
    """Every module call of one run, and the run's final output."""

    calls: dict[str, list[Call]] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)  #: places in the order their first call returned
    returned: list[tuple[str, int]] = field(default_factory=list)  #: every (place, call) in the order it returned
    final: torch.Tensor | None = None


@dataclass
class Plan:
    """What a target run does at each place."""

    graft: frozenset[str] = frozenset()  #: replace these places' outputs by the bench's
    graft_calls: frozenset[tuple[str, int]] = frozenset()  #: ... these single calls' outputs
    feed: frozenset[str] = frozenset()  #: run these places on the bench's inputs (their local error)
    bench: Capture | None = None
    capture: bool = False  #: record every call (inputs and outputs)


@dataclass
class RunResult:
    final: torch.Tensor
    capture: Capture | None
    local: dict[str, float] = field(default_factory=dict)  #: place -> output error on bench inputs


def places(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every named submodule (the root is the whole model: not a place)."""
    return [(n, m) for n, m in model.named_modules() if n]


@contextlib.contextmanager
def _hooked(model: torch.nn.Module, plan: Plan, result: dict) -> Iterator[Capture]:
    cap = Capture()
    counts: dict[str, int] = {}
    local: dict[str, float] = result.setdefault("local", {})
    handles = []

    def bench_call(name: str, k: int) -> Call | None:
        calls = plan.bench.calls.get(name, []) if plan.bench else []
        return calls[k] if k < len(calls) else None

    def pre(name: str):
        def hook(module, args, kwargs):
            k = counts.get(name, 0)
            counts[name] = k + 1
            if plan.capture:
                cap.calls.setdefault(name, []).append(Call(trees.snapshot(args), trees.snapshot(kwargs)))
            if name in plan.feed and (b := bench_call(name, k)) is not None:
                return trees.graft(b.args, args), trees.graft(b.kwargs, kwargs)
            return None
        return hook

    def post(name: str):
        def hook(module, args, kwargs, output):
            k = counts[name] - 1
            if plan.capture:
                cap.calls[name][k].output = trees.snapshot(output)
                cap.returned.append((name, k))
                if k == 0:
                    cap.finished.append(name)
            b = bench_call(name, k)
            if b is None:
                return None
            if name in plan.feed:
                local[name] = max(local.get(name, 0.0), trees.error(output, b.output))
            if name in plan.graft or (name, k) in plan.graft_calls:
                return trees.graft(b.output, output)
            return None
        return hook

    try:
        for name, m in places(model):
            handles.append(m.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(m.register_forward_hook(post(name), with_kwargs=True))
        yield cap
    finally:
        for h in handles:
            h.remove()


def fresh(tree: Any) -> Any:
    """A copy of the example inputs for one forward: a model may write to its inputs in place
    (``x.mul_(2)``), and every run, bench or target, must start from the factory's values."""
    try:
        return copy.deepcopy(tree)
    except (RuntimeError, TypeError):  # a non-leaf tensor or an object that refuses deepcopy
        return trees.snapshot(tree)


def run(model: torch.nn.Module, args: tuple, kwargs: dict, spec: Spec, plan: Plan | None = None,
        below: Any = None, above: Any = None) -> RunResult:
    """One forward under ``spec`` following ``plan``. ``below`` and ``above`` (callables returning
    context managers) wrap the forward inside the precision mode, in that order: a fault injector
    or a backend's own dispatch mode goes below, the recorder or an op graft above it."""
    plan = plan or Plan()
    result: dict = {}
    args, kwargs = fresh(args), fresh(kwargs)  # outside the recorder and the op grafts: not the model's calls
    with contextlib.ExitStack() as stack:
        cap = stack.enter_context(_hooked(model, plan, result))
        stack.enter_context(spec.running())
        for cm in (below, above):
            if cm is not None:
                stack.enter_context(cm())
        out = model(*args, **kwargs)
    final = trees.final_output(out)
    cap.final = final
    return RunResult(final, cap if plan.capture else None, result.get("local", {}))
