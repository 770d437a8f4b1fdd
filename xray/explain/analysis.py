"""``explain``: how much of the target's final error each module, then each op, explains.

For every place (a named module) the target is rerun twice: once with the place fed the bench's
inputs (what reaches the output is the place's own error plus what bypasses it; its output on
those inputs is its *local error*) and once with its output replaced by the bench's (cast to the
target's dtype). The difference of the two final errors is the error the place itself makes:
its ``share``. Its ``self_share`` leaves out what its child modules make, so a broken matmul
ranks its own Linear first, not the decoder layer around it. Three views come with it:

- one place at a time: ``share``/``self_share`` and ``error_grafted`` (final error with it grafted);
- cumulative, "fix everything up to here": ``prefix_error``, every place that finished before
  this one grafted too (QAIRT's cumulative-layerwise, seen from the other end);
- each layer on its own with bench inputs: ``local_err`` (QAIRT's layerwise), beside
  ``accumulated_err``, its output's error in the plain target run (QAIRT's oneshot-layerwise).

Inside the modules that explain most, the recorder dumps both runs, compare matches their calls
and judges them (local error, born or inherited), and each matched call is grafted alone; the
calls compare singles out (born wrong, its first divergence, the first Inf/NaN: ``births``)
are grafted first, wherever they are. compare's own verdict on the dumps tells the verdict
whether the error is within the target's precision at all.

Every run gets fresh copies of the inputs (``hooks.fresh``), and the bench must be finite and
deterministic (``checks``). ``search="tree"`` measures only down the paths that matter
(``descend``).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from . import births, checks, descend, hooks, ops, places
from .progress import bar
from .spec import Spec, check_available, parse_spec
from .trees import error
from .verdict import verdict

MOST = places.MOST


@dataclass
class Row:
    kind: str  #: "module", "op", or "group" (a run of sibling layers measured whole: ``descend``)
    name: str  #: module path; for an op, compare's name of the call (module/op#bench seq)
    module: str
    what: str  #: module class or ATen op
    depth: int
    order: int  #: when its output was ready (first call), in execution order
    tree: int = 0  #: position in ``named_modules()`` (a parent before its children)
    calls: int = 1
    share: float | None = None  #: of the final error, made by this place (children included)
    self_share: float | None = None  #: ... by this place's own code, children excluded
    error_grafted: float | None = None  #: final error with this place's output taken from the bench
    error_fed: float | None = None  #: final error with this place fed the bench's inputs
    prefix_error: float | None = None  #: final error with everything up to here grafted
    local_err: float | None = None  #: its output's error on the bench's inputs
    accumulated_err: float | None = None  #: its output's error in the target run
    residual_share: float | None = None  #: of the error left once the top place is grafted
    status: str = ""  #: compare's verdict of an op (pass/warning/fail/nan/inf)
    origin: str = ""  #: compare: born here or inherited
    cause: str = ""
    local_floor: float | None = None  #: compare: CPU's own error at the target's dtype on that op
    key: bool = False  #: an op compare singles out (born wrong, first divergence, first Inf/NaN): always shown


@dataclass
class Explanation:
    bench: str
    target: str
    error: float  #: final error of the target against the bench (normwise, numerics.metrics)
    rows: list[Row]
    top: str | None = None  #: the place that explains most (its own code)
    top_op: str | None = None  #: the call inside it that explains most
    first_nonfinite: str | None = None  #: the first call whose output is Inf/NaN where the bench's is not
    birth: dict = field(default_factory=dict)  #: that call's module and the modules that made its inputs
    error_without_top: float | None = None
    rest: dict = field(default_factory=dict)
    verdict: str = ""
    compare: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  #: what could not be measured, and why
    search: str = "all"  #: every module measured, or the descent (``descend``)
    seconds: float = 0.0

    def ranking(self, kind: str = "module") -> list[Row]:
        """Places by how much of the error their own code makes (self share), most first."""
        rows = [r for r in self.rows if r.kind == kind and r.self_share is not None]
        return sorted(rows, key=lambda r: -r.self_share)

    def row(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Runs:
    """Everything a graft run needs: the target model and inputs, its spec, what wraps it."""

    model: torch.nn.Module
    args: tuple
    kwargs: dict
    spec: Spec
    bench: hooks.Capture
    below: Callable | None = None

    def final_error(self, graft=(), feed=(), above: Callable | None = None, local: dict | None = None,
                    calls=()) -> float:
        plan = hooks.Plan(frozenset(graft), frozenset(calls), frozenset(feed), self.bench)
        result = hooks.run(self.model, self.args, self.kwargs, self.spec, plan, self.below, above)
        if local is not None:
            local.update(result.local)
        return error(result.final, self.bench.final)


def prepare(model, args, kwargs, bench: str | Spec, target: str | Spec):
    bench = parse_spec(bench) if isinstance(bench, str) else bench
    target = parse_spec(target) if isinstance(target, str) else target
    for s in (bench, target):
        check_available(s)
    args = args if isinstance(args, tuple) else (args,)
    bm, (ba, bk) = bench.prepare(model, (args, dict(kwargs or {})))
    tm, (ta, tk) = target.prepare(model, (args, dict(kwargs or {})))
    return bench, target, (bm, ba, bk), (tm, ta, tk)


def capture_both(model, args, kwargs, bench, target, target_context=None):
    """Both plain runs with every module call captured: (bench spec, Runs, target capture, bench
    model and inputs). Refuses a bench that is non-finite or not deterministic (``checks``)."""
    bench, target, (bm, ba, bk), (tm, ta, tk) = prepare(model, args, kwargs, bench, target)
    bcap = hooks.run(bm, ba, bk, bench, hooks.Plan(capture=True)).capture
    checks.bench_is_finite(bcap.final, bench)
    checks.bench_repeats(bm, ba, bk, bench, bcap)
    tcap = hooks.run(tm, ta, tk, target, hooks.Plan(capture=True), below=target_context).capture
    return bench, Runs(tm, ta, tk, target, bcap, target_context), tcap, (bm, ba, bk)


def explain(model: torch.nn.Module, args: Any, kwargs: dict | None = None, *, target: str | Spec = "cpu:bf16",
            bench: str | Spec = "cpu", target_context: Callable | None = None, op_modules: int = 3,
            max_ops: int = 64, residual: bool = True, progress: bool | None = None,
            workdir: str | Path | None = None, threads: int | None = 1, search: str = "all") -> Explanation:
    """Explain the target's final error place by place (module docstring).

    ``search``: ``"all"`` measures every module; ``"tree"`` measures the top-level modules and
    descends only where a module makes most of its parent's share (``descend``: a few percent of
    the forwards on a deep model, and only the modules on those paths get shares).

    ``target_context``: a callable returning a context manager entered around every target
    forward inside its precision mode (a backend's dispatch mode, a fault injector).
    ``op_modules``: how many of the top modules get op-level grafts (0: none); ``max_ops`` caps
    the calls grafted. ``workdir`` keeps the two dumps of the op level there. ``threads`` caps
    torch's intra-op threads meanwhile (None keeps torch's setting; see ``capped_threads``)."""
    if search not in SEARCHES:
        raise ValueError(f"search {search!r}: use one of {', '.join(SEARCHES)}")
    with capped_threads(threads):
        return _explain(model, args, kwargs, target, bench, target_context, op_modules, max_ops, residual,
                        progress, workdir, search)


SEARCHES = ("all", "tree")


@contextlib.contextmanager
def capped_threads(threads: int | None):
    """Demo-sized models run hundreds of short forwards whose ops are too small to share among
    threads: on a busy 2-core machine one thread ran the demo Llama's forward in 5 ms, two in
    270 ms (OpenMP barriers waiting for a core). Restored afterwards."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(max(1, min(threads, previous)))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _explain(model, args, kwargs, target, bench, target_context, op_modules, max_ops, residual, progress,
             workdir, search) -> Explanation:
    started = time.perf_counter()
    bspec, runs, tcap, bench_run = capture_both(model, args, kwargs, bench, target, target_context)
    e0 = error(tcap.final, runs.bench.final)
    names = [n for n in tcap.finished if n in runs.bench.calls]
    kinds = dict((n, type(m).__name__) for n, m in hooks.places(runs.model))
    tree = {n: i for i, n in enumerate(kinds)}
    rows: dict[str, Row] = {}
    for i, n in enumerate(names):
        acc = max((error(t.output, b.output) for t, b in zip(tcap.calls[n], runs.bench.calls[n])), default=0.0)
        rows[n] = Row("module", n, n, kinds.get(n, ""), places.depth(n), i, tree.get(n, 0), len(tcap.calls[n]),
                      accumulated_err=acc)
    groups: list[Row] = []
    if e0 > 0 and search == "tree":
        groups = _descend(runs, rows, names, e0, tcap, progress)
    elif e0 > 0:
        one_at_a_time(runs, rows, names, e0, progress)
    measured = [n for n in names if rows[n].share is not None]
    if e0 > 0:
        self_shares(rows, measured, groups)
        _prefix(runs, rows, tcap.returned, measured, progress)
    result = Explanation(str(bspec), str(runs.spec), e0, list(rows.values()) + groups, search=search)
    ranked = result.ranking()
    if ranked and ranked[0].self_share > 0:
        result.top, result.error_without_top = ranked[0].name, ranked[0].error_grafted
    if op_modules and e0 > 0:
        try:
            _op_level(result, runs, bench_run, bspec, [r.name for r in ranked[:op_modules] if r.self_share > 0],
                      max_ops, workdir, progress)
        except (ValueError, RuntimeError) as e:  # compare refusing the dumps, calls that change between runs
            result.notes.append(f"op level skipped: {str(e).splitlines()[0][:300]}")
    if residual and result.top:
        _residual(result, runs, rows, measured, result.row(result.top), progress)
    result.verdict = verdict(result)
    result.seconds = round(time.perf_counter() - started, 2)
    return result


def one_at_a_time(runs: Runs, rows: dict[str, Row], names: list[str], e0: float, progress) -> None:
    """Fill each place's fed and grafted final errors, local error and share (fix ranks by them too)."""
    for n in bar(names, "explain: modules", progress):
        local: dict[str, float] = {}
        r = rows[n]
        r.error_fed = runs.final_error(feed=[n], local=local)
        r.local_err = local.get(n)
        r.error_grafted = runs.final_error(graft=[n])
        r.share = places.share(e0, r.error_grafted) - places.share(e0, r.error_fed)


def self_shares(rows: dict[str, Row], names: list[str], groups: list[Row] = ()) -> None:
    """A place's share less its child modules' shares (and its unsplit groups of children,
    ``descend``): what its own code makes."""
    kids = places.children(names)
    for n in names:
        r = rows[n]
        r.self_share = (r.share - sum(rows[c].share for c in kids[n])
                        - sum(g.share for g in groups if g.module == n))


def _descend(runs: Runs, rows: dict[str, Row], names: list[str], e0: float, tcap, progress) -> list[Row]:
    """``descend.descend`` with explain's rows: groups are rows of kind ``group``."""
    def group_row(parent: str, members: list[str], share: float) -> Row:
        first = rows[members[0]]
        return Row("group", f"{members[0]}..{members[-1].rpartition('.')[2]}", parent,  # layers.16..31
                   f"{len(members)} x {first.what}", first.depth, first.order, first.tree, len(members),
                   share=share, self_share=share)

    with bar(None, "explain: modules (tree)", progress) as shown:
        return descend.descend(runs, rows, names, e0, tcap, group_row, lambda name: shown.update())


def _prefix(runs: Runs, rows: dict[str, Row], returned: list[tuple[str, int]], measured: list[str],
            progress) -> None:
    """Fix everything up to here: every module call that returned before a place's first call
    did (a module called twice, like T5's dropout, counts each call where it happens); measured
    at the ``measured`` places."""
    calls = [c for c in returned if c[0] in rows]
    wanted = set(measured)
    for i, (n, k) in enumerate(bar(calls, "explain: cumulative", progress)):
        if k == 0 and n in wanted:
            rows[n].prefix_error = runs.final_error(calls=calls[: i + 1])


def _residual(result: Explanation, runs: Runs, rows: dict[str, Row], names: list[str], top: Row, progress) -> None:
    """What is left once the top place is grafted, and whether one place explains most of it."""
    left = top.error_grafted
    others = [n for n in names if not places.is_inside(n, top.name) and not places.is_inside(top.name, n)]
    if not left or not others:
        result.rest = {"error": left, "places": 0}
        return
    base = [top.name]
    shares = {}
    for n in bar(others, "explain: residual", progress):
        fed = runs.final_error(graft=base, feed=[n])
        grafted = runs.final_error(graft=base + [n])
        shares[n] = places.share(left, grafted) - places.share(left, fed)
    kids = places.children(others)
    for n in others:
        rows[n].residual_share = shares[n] - sum(shares[c] for c in kids[n])
    ordered = sorted(others, key=lambda n: -rows[n].residual_share)
    total, half = 0.0, None
    for i, n in enumerate(ordered):
        total += max(rows[n].residual_share, 0.0)
        if total >= MOST:
            half = i + 1
            break
    best = rows[ordered[0]]
    result.rest = {"error": left, "share_of_error": places.share(result.error, result.error - left),
                   "best_place": best.name, "best_share": best.residual_share, "places_for_half": half,
                   "places": len(others), "spread": best.residual_share < MOST}


def dump_both(runs: Runs, bench_run, bspec: Spec, folder: Path) -> tuple[Path, Path]:
    """The recorder's dumps of a plain bench run and a plain target run, in ``folder``."""
    bm, ba, bk = bench_run
    bdump = ops.record(lambda above: hooks.run(bm, ba, bk, bspec, above=above), folder / "bench")
    return bdump, dump_target(runs, folder / "target")


def dump_target(runs: Runs, folder: Path) -> Path:
    """The recorder's dump of a plain target run (its model as ``runs`` holds it)."""
    return ops.record(lambda above: hooks.run(runs.model, runs.args, runs.kwargs, runs.spec,
                                              below=runs.below, above=above), folder)


def _op_level(result: Explanation, runs: Runs, bench_run, bspec: Spec, modules: list[str], max_ops: int,
              workdir, progress) -> None:
    """Graft each matched call inside ``modules`` alone, and first every call compare singles out
    (born wrong, its first divergence, the first Inf/NaN): compare's verdicts come along."""
    with ops.Workdir(workdir) as folder:
        bdump, tdump = dump_both(runs, bench_run, bspec, folder)
        calls, summary = ops.matched_calls(bdump, tdump)
        born = [c for c in calls if c.origin == "born" and (c.cause.startswith("local error") or c.cause == "argument")]
        first = births.birth(calls, tdump)
        divergence = (summary.first_divergence or {}).get("bench")
        result.compare = {"matched": summary.matched, "pass": summary.passed, "warning": summary.warned,
                          "fail": summary.failed, "nan_inf": summary.nan_inf, "born": [c.name for c in born],
                          "first_divergence": divergence, "verdict_kind": summary.verdict_kind,
                          "verdict": summary.verdict}
        if first is not None:
            result.first_nonfinite = first.call.name
            result.birth = {"call": first.call.name, "module": first.module, "producers": first.producers}
        # what compare singles out always, then the calls inside the top modules it does not pass
        named = {c.name for c in born} | {divergence, result.first_nonfinite}
        key = [c for c in calls if c.name in named]
        inside = [c for c in calls if c not in key and c.status != "pass"
                  and any(places.is_inside(c.module, m) for m in modules)]
        chosen = key + inside[:max(0, max_ops - len(key))]
        values = ops.bench_values(bdump, chosen)
    for c in bar(chosen, "explain: ops", progress):
        value = values.get((c.bench_seq, c.output))
        if value is None:
            continue
        def graft_mode(c=c, v=value):
            return ops.GraftOps({c.target_seq: (c.op, c.output, v)})

        after = runs.final_error(above=graft_mode)
        home = result.row(c.module)
        result.rows.append(Row("op", c.name, c.module, c.op, places.depth(c.module) + 1,
                               home.order if home else -1, home.tree if home else -1,
                               share=places.share(result.error, after), error_grafted=after,
                               local_err=c.local_err, accumulated_err=c.accumulated_err, status=c.status,
                               origin=c.origin, cause=c.cause, local_floor=c.local_floor, key=c in key))
    top_ops = sorted((r for r in result.rows if r.kind == "op" and result.top
                      and places.is_inside(r.module, result.top)), key=lambda r: -r.share)
    if top_ops and top_ops[0].share > 0:
        result.top_op = top_ops[0].name
