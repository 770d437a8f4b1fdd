"""``fix``: the fewest modules to keep in the bench's precision (fp32 islands) for the target's
final error to fall under a bound.

explain's one-at-a-time grafts rank the places by the error their own code makes (self share);
a bisection over that ranking finds the shortest prefix whose islands reach the bound, every
trial a real run of the target with ``islands.keep_in_fp32`` applied; then each chosen module is
dropped in turn if the bound still holds without it. The printed code is ``keep_in_fp32``'s own
source and one call.
"""
from __future__ import annotations

import copy
import inspect
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from . import analysis, hooks, islands
from .trees import error


@dataclass
class Fix:
    bench: str
    target: str
    max_error: float
    error_before: float
    error_after: float | None = None
    modules: list[str] = field(default_factory=list)
    ops: dict[str, list[str]] = field(default_factory=dict)  #: the finer fix: module -> ATen ops kept in fp32
    error_after_ops: float | None = None
    op_code: str = ""
    found: bool = False
    code: str = ""
    trials: list[dict] = field(default_factory=list)  #: every island set run, with its final error
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Trials:
    """Runs the target with a set of islands, once per distinct set."""

    def __init__(self, runs: analysis.Runs, log: list[dict]) -> None:
        self.runs, self.log, self.seen = runs, log, {}

    def __call__(self, names: list[str], ops: dict[str, list[str]] | None = None) -> float:
        ops = ops or {}
        key = (tuple(sorted(names)), tuple(sorted((m, tuple(o)) for m, o in ops.items())))
        if key not in self.seen:
            model = islands.keep_in_fp32(copy.deepcopy(self.runs.model), list(names), self.runs.spec.device_type)
            model = islands.keep_ops_in_fp32(model, ops, self.runs.spec.device_type)
            try:
                out = hooks.run(model, self.runs.args, self.runs.kwargs, self.runs.spec, below=self.runs.below)
                self.seen[key] = error(out.final, self.runs.bench.final)
            except RuntimeError:  # an op kept in fp32 that its consumer refuses (a view's dtype): no fix
                if not ops:
                    raise
                self.seen[key] = float("inf")
            self.log.append({"modules": list(names), "ops": ops, "error": self.seen[key]})
        return self.seen[key]


def fix(model: torch.nn.Module, args: Any, kwargs: dict | None = None, *, target: str = "cpu:fp16",
        bench: str = "cpu", max_error: float = 1e-2, target_context: Callable | None = None,
        max_modules: int = 32, progress: bool | None = None, threads: int | None = 1) -> Fix:
    """The fewest fp32 islands under ``max_error`` (module docstring); ``max_modules`` caps
    how far down explain's ranking the search looks."""
    with analysis.capped_threads(threads):
        return _fix(model, args, kwargs, target, bench, max_error, target_context, max_modules, progress)


def _fix(model, args, kwargs, target, bench, max_error, target_context, max_modules, progress) -> Fix:
    started = time.perf_counter()
    bspec, runs, tcap, _ = analysis.capture_both(model, args, kwargs, bench, target, target_context)
    e0 = error(tcap.final, runs.bench.final)
    result = Fix(str(bspec), str(runs.spec), max_error, e0)
    if e0 <= max_error:
        result.found, result.error_after = True, e0
        result.seconds = round(time.perf_counter() - started, 2)
        return result
    ranked, rows = _ranking(runs, tcap, e0, progress)
    ranked = ranked[:max_modules]
    trial = Trials(runs, result.trials)
    chosen = _shortest_prefix(ranked, trial, max_error)
    if chosen is not None:
        chosen = _prune(chosen, trial, max_error)
        chosen = _narrow(chosen, rows, trial, max_error)
        result.found, result.modules, result.error_after = True, chosen, trial(chosen)
        result.code = code(chosen, runs.spec.device_type)
        kept, ops = _op_islands(chosen, runs, trial, max_error)
        if ops:
            result.ops, result.error_after_ops = ops, trial(kept, ops)
            result.op_code = op_code(kept, ops, runs.spec.device_type)
    else:
        result.error_after = trial(ranked) if ranked else e0
    result.seconds = round(time.perf_counter() - started, 2)
    return result


def _ranking(runs: analysis.Runs, tcap: hooks.Capture, e0: float, progress) -> list[str]:
    """Places by the share of the final error their own code makes, most first (explain's view)."""
    names = [n for n in tcap.finished if n in runs.bench.calls]
    rows = {n: analysis.Row("module", n, n, "", 0, i) for i, n in enumerate(names)}
    analysis.one_at_a_time(runs, rows, names, e0, progress)
    analysis.self_shares(rows, names)
    ranked = sorted(names, key=lambda n: -rows[n].self_share)
    return [n for n in ranked if rows[n].self_share > 0], rows


def _shortest_prefix(ranked: list[str], trial: Trials, bound: float) -> list[str] | None:
    """Bisection for the shortest prefix of ``ranked`` under ``bound`` (None: not even all)."""
    if not ranked or trial(ranked) > bound:
        return None
    lo, hi = 0, len(ranked)  # prefix hi works; lo does not (an empty prefix is the plain target)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if trial(ranked[:mid]) <= bound:
            hi = mid
        else:
            lo = mid
    return ranked[:hi]


def _prune(chosen: list[str], trial: Trials, bound: float) -> list[str]:
    """Drop each module, last ranked first, that the bound holds without."""
    kept = list(chosen)
    for name in reversed(chosen):
        rest = [n for n in kept if n != name]
        if rest and trial(rest) <= bound:
            kept = rest
    return kept


# How many descendants of a chosen module are tried in its place, highest local error first.
NARROW_TRIES = 3


def _narrow(chosen: list[str], rows: dict, trial: Trials, bound: float) -> list[str]:
    """Replace each chosen module by a descendant while the bound holds: the descendants with
    the highest local error (their own output's error on bench inputs: where an overflow or a
    broken kernel is born) are tried first. A graft casts the bench's value to the target's
    dtype, so it cannot rank a layer whose true output does not fit that dtype (an fp16
    overflow): local error can."""
    kept = list(chosen)
    for i in range(len(kept)):
        while True:
            inside = [n for n in rows if n.startswith(kept[i] + ".") and rows[n].local_err]
            inside.sort(key=lambda n: (-rows[n].local_err, -n.count(".")))
            for n in inside[:NARROW_TRIES]:
                if trial(kept[:i] + [n] + kept[i + 1:]) <= bound:
                    kept[i] = n
                    break
            else:
                break
    return kept


def ops_inside(runs: analysis.Runs, module: str) -> list[str]:
    """The floating-point ATen ops the target runs inside ``module``, most called first."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    seen: Counter = Counter()

    class Listing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                seen[str(func)] += 1
            return out

    model = copy.deepcopy(runs.model)
    sub = model.get_submodule(module)
    forward = sub.forward

    def listed(*args, **kwargs):
        with Listing():
            return forward(*args, **kwargs)

    sub.forward = listed
    hooks.run(model, runs.args, runs.kwargs, runs.spec, below=runs.below)
    return [op for op, _ in seen.most_common()]


def _op_islands(chosen: list[str], runs: analysis.Runs, trial: Trials, bound: float):
    """Then ops: each chosen module replaced, if the bound holds, by one ATen op kind of it kept
    in fp32 (the module's other ops stay in the target's precision). (modules, ops) kept."""
    kept, ops = list(chosen), {}
    for module in chosen:
        rest = [n for n in kept if n != module]
        for op in ops_inside(runs, module):
            if trial(rest, {**ops, module: [op]}) <= bound:
                kept, ops = rest, {**ops, module: [op]}
                break
    return kept, ops


def op_code(modules: list[str], ops: dict[str, list[str]], device_type: str) -> str:
    """Ready-to-paste Python for the op-level fix (and any module islands it still needs)."""
    text = inspect.getsource(islands.keep_ops_in_fp32) + "\n\n"
    if modules:
        text += inspect.getsource(islands.keep_in_fp32) + "\n\n"
        text += f"model = keep_in_fp32(model, {modules!r}, device_type={device_type!r})\n"
    return text + (f"# xray fix, op level: these ATen ops in float32 bring the final error under the bound\n"
                   f"model = keep_ops_in_fp32(model, {ops!r}, device_type={device_type!r})\n")


def code(modules: list[str], device_type: str) -> str:
    """Ready-to-paste Python: ``keep_in_fp32`` and the call that applies the islands."""
    source = inspect.getsource(islands.keep_in_fp32)
    return (f"{source}\n\n# xray fix: these modules in float32 bring the final error under the bound\n"
            f"model = keep_in_fp32(model, {modules!r}, device_type={device_type!r})\n")
