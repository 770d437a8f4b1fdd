"""``fix``: the fewest modules to keep in the bench's precision (fp32 islands) for the target's
final error to fall under a bound.

explain's one-at-a-time grafts rank the places by the error their own code makes (self share);
a bisection over that ranking finds the shortest prefix whose islands reach the bound, every
trial a real run of the target with ``islands.keep_in_fp32`` applied; then each chosen module is
dropped in turn if the bound still holds without it. The printed code is ``keep_in_fp32``'s own
source and one call.

A final error that is Inf/NaN (an overflow) is searched from where its first Inf/NaN is born
(``births``) before any graft: a graft casts the bench's value to the target's dtype, so it is
Inf again and cannot rank. The islands tried there are the module the born call runs in, the
modules that made its inputs (kept in fp32 their output stays fp32 under autocast: an overflow
in the parent's own code between two submodules), then that op kind inside its module.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from . import analysis, births, hooks, islands, ops as op_dumps
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
    born: str | None = None  #: the first call whose output is Inf/NaN where the bench's is not (compare's name)
    notes: list[str] = field(default_factory=list)  #: how the search went where it did not find a finer fix
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
    bspec, runs, tcap, bench_run = analysis.capture_both(model, args, kwargs, bench, target, target_context)
    e0 = error(tcap.final, runs.bench.final)
    result = Fix(str(bspec), str(runs.spec), max_error, e0)
    if e0 <= max_error:
        result.found, result.error_after = True, e0
        result.seconds = round(time.perf_counter() - started, 2)
        return result
    trial = Trials(runs, result.trials)
    chosen, ops, base = None, {}, []
    if not math.isfinite(e0):
        chosen, ops, base = _born_islands(result, runs, bench_run, bspec, trial, max_error)
    if chosen is None:
        chosen = _ranked_islands(runs, tcap, e0, base, trial, max_error, max_modules, progress)
    if chosen is not None:
        result.found, result.modules, result.ops = True, chosen, ops
        result.error_after = trial(chosen, ops)
        if ops:  # the born call's op kind is the fix (with the islands followed before it)
            result.code = op_code(chosen, ops, runs.spec.device_type)
        else:
            result.code = code(chosen, runs.spec.device_type)
            kept, result.ops = _op_islands(chosen, runs, trial, max_error, result.notes)
            if result.ops:
                result.error_after_ops = trial(kept, result.ops)
                result.op_code = op_code(kept, result.ops, runs.spec.device_type)
    else:
        result.error_after = min((t["error"] for t in result.trials), default=e0)
    result.seconds = round(time.perf_counter() - started, 2)
    return result


# How many births _born_islands follows: an island that removes one overflow can move the
# first Inf/NaN downstream (a norm kept in fp32 hands its fp32 output to a Linear that casts it).
MAX_BIRTHS = 4


def _born_islands(result: Fix, runs: analysis.Runs, bench_run, bspec, trial: Trials, bound: float):
    """Islands around the first Inf/NaN: its module, its inputs' producers, then its op kind in
    its module. When none is enough, its module (or its first producer, for the model's own
    code) is kept and the next birth followed. (modules, ops, base): a fix under the bound, or
    None and the islands that made the output finite (the graft ranking then searches on top)."""
    base: list[str] = []
    with op_dumps.Workdir() as folder:
        bdump = analysis.dump_both(runs, bench_run, bspec, folder)[0]
        for step in range(MAX_BIRTHS):
            here = dataclasses.replace(runs, model=islands.keep_in_fp32(copy.deepcopy(runs.model), base,
                                                                         runs.spec.device_type))
            tdump = analysis.dump_target(here, folder / f"target{step + 1}")
            born = births.birth(op_dumps.matched_calls(bdump, tdump)[0], tdump)
            if born is None:
                break
            result.born = result.born or born.call.name
            modules = [m for m in [born.module, *born.producers] if m and m not in base]
            for name in modules:
                if trial(base + [name]) <= bound:
                    return base + [name], {}, []
            ops = {born.module: [born.call.op]}
            if trial(base, ops) <= bound:
                return base, ops, []
            follow = born.module or (born.producers[0] if born.producers else "")
            result.notes.append(f"no island around {born.call.name} alone reaches the bound (tried "
                                + ", ".join(modules + [f"{born.call.op} in {born.module or 'the model'}"]) + ")"
                                + (f"; {follow} kept in fp32, the next Inf/NaN followed" if follow else ""))
            if not follow or follow in base:
                break
            base.append(follow)
            if math.isfinite(trial(base)):
                return None, {}, base
    if result.born is None:
        result.notes.append("the output is Inf/NaN but compare finds no call NaN/Inf against a finite bench "
                            "value: searched by grafts only")
    return None, {}, []


def _ranked_islands(runs: analysis.Runs, tcap: hooks.Capture, e0: float, base: list[str], trial: Trials,
                    bound: float, max_modules: int, progress) -> list[str] | None:
    """explain's ranking, bisection, pruning and narrowing, on top of the ``base`` islands."""
    if base:  # rank what is left once the base islands run in fp32
        model = islands.keep_in_fp32(copy.deepcopy(runs.model), base, runs.spec.device_type)
        runs = dataclasses.replace(runs, model=model)
        tcap = hooks.run(model, runs.args, runs.kwargs, runs.spec, hooks.Plan(capture=True), below=runs.below).capture
        e0 = error(tcap.final, runs.bench.final)
    ranked, rows = _ranking(runs, tcap, e0, progress)
    ranked = [n for n in ranked if n not in base][:max_modules]
    on_base = _OnTop(trial, base)
    chosen = _shortest_prefix(ranked, on_base, bound)
    if chosen is None:
        return None
    chosen = _prune(chosen, on_base, bound)
    return base + _narrow(chosen, rows, on_base, bound)


class _OnTop:
    """``trial`` with the ``base`` islands always kept."""

    def __init__(self, trial: Trials, base: list[str]) -> None:
        self.trial, self.base = trial, base

    def __call__(self, names: list[str], ops: dict | None = None) -> float:
        return self.trial(self.base + [n for n in names if n not in self.base], ops)


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
    from torch.utils._pytree import tree_leaves

    seen: Counter = Counter()

    class Listing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in tree_leaves(out)):
                seen[str(func)] += 1  # native_layer_norm returns a tuple
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


def _op_islands(chosen: list[str], runs: analysis.Runs, trial: Trials, bound: float, notes: list[str]):
    """Then ops: each chosen module replaced, if the bound holds, by one ATen op kind of it kept
    in fp32 (the module's other ops stay in the target's precision). (modules, ops) kept; a
    module no single op kind can stand for is said in ``notes``."""
    kept, ops = list(chosen), {}
    for module in chosen:
        rest = [n for n in kept if n != module]
        kinds = ops_inside(runs, module)
        for op in kinds:
            if trial(rest, {**ops, module: [op]}) <= bound:
                kept, ops = rest, {**ops, module: [op]}
                break
        else:
            notes.append(f"then ops: none of the {len(kinds)} ATen op kinds inside {module} alone in fp32 reaches "
                         "the bound: keep the whole module")
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
