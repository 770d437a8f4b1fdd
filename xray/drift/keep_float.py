"""``--suggest-float``: the fewest layers to leave unquantized for a quantized backend to meet a
target, every candidate set verified by a real run of the backend with those layers kept float.

The candidates are drift's layers: those beyond the scheme first (furthest first), then by what
their quantization costs locally: the larger of the layer's measured SQNR fed float inputs (the
isolated run) and what the scheme's rounding of its weights predicts from the float values (the
layers hidden inside a delegate have only that). As ``xray fix`` searches its fp32 islands,
prefixes of that ranking are tried, at sizes 1, 2, 4... until one meets the target, a bisection
finds the shortest, and each layer it holds is dropped, last ranked first, where the target
holds without it; a set is run once.

A run re-quantizes the model with the backend's ``keep_float`` option (each quantizer's own
exclusion) and runs it whole. The target: by default, drift judges no layer of that run beyond
the scheme (each captured tensor, the output included, within what the scheme's rounding
explains); with ``target_sqnr``, every output's SQNR against float eager is at least that.
"""
from __future__ import annotations

import csv
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..numerics import quantization as qn
from .quant import _finite, _num

# The trial CSV (``DIR/keep-float-<backend>.csv``), declared once: the drift run itself first.
TRIAL_COLUMNS = ["trial", "layers", "count", "param_share", "output_sqnr_db", "rel_err", "beyond", "meets_target",
                 "seconds", "error"]
# How far down the ranking the search looks (a prefix of 16 is 5 doublings).
MAX_LAYERS = 16
ROOT = "<root>"  # ops in the model's own forward: no module name to keep float
# A layer whose quantization costs less than this NSR (float32 arithmetic, 120 dB) is not quantized.
_FLOOR = qn.FLOAT_NSR


class SuggestError(ValueError):
    """A ``--suggest-float`` request that cannot run (no quantized backend, a bad target)."""


def check_request(backends: list[str] | tuple[str, ...], suggest: bool, target_sqnr: float | None) -> None:
    """Refuse, in one sentence, a request no run can answer; before any work."""
    from ..backends.registry import parse_spec

    if target_sqnr is not None and not suggest:
        raise SuggestError("--target-sqnr sets the target of --suggest-float: add --suggest-float")
    if target_sqnr is not None and not math.isfinite(target_sqnr):
        raise SuggestError(f"--target-sqnr must be a finite number of dB, not {target_sqnr}")
    if suggest and not any(parse_spec(b)[1].get("quant") is not None for b in backends):
        raise SuggestError("--suggest-float needs a quantized backend, e.g. -b onnxrt-cpu:quant=int8")


@dataclass
class Trial:
    """One run of the backend with ``layers`` kept float (none: drift's own run)."""

    layers: list[str]
    output_sqnr_db: float | None = None  # the worst output against float eager
    rel_err: float | None = None  # that output's ||q - f|| / ||f||
    beyond: list[str] | None = None  # layers drift judges beyond the scheme (None: not judged)
    excess: float | None = None  # the largest measured / allowed of those layers
    meets: bool = False
    params_float: int = 0  # parameters inside ``layers`` (their submodules included)
    seconds: float = 0.0
    error: str = ""  # the run failed: its stage and error


@dataclass
class FloatSuggestion:
    """The layers to keep float, and the runs that verified them."""

    backend: str
    scheme: str
    target: str  # in words
    target_sqnr_db: float | None
    found: bool = False
    layers: list[str] = field(default_factory=list)
    params_float: int = 0  # parameters inside those layers (their submodules included)
    params_total: int = 0
    before: Trial | None = None
    after: Trial | None = None
    ranked: list[str] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)  # the verification runs, in order
    rerun: str = ""  # the backend spec that runs the suggestion
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def param_share(self) -> float:
        return self.params_float / self.params_total if self.params_total else 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["param_share"] = round(self.param_share, 6)
        return _finite(d)


def ranking(quant: dict[str, Any], base: tuple[str, ...] = ()) -> list[str]:
    """Layers, most worth keeping float first: beyond the scheme (furthest first), then by local
    cost (``local_cost``); the model's own forward (``<root>``), layers already kept float
    (``base``) and layers whose quantization costs nothing measurable are left out."""
    rows = {lr["layer"]: lr for lr in quant.get("layers", [])}
    cost = local_cost(quant)
    beyond = {n for n, lr in rows.items() if str(lr.get("verdict", "")).startswith("beyond")}
    names = [n for n in dict.fromkeys([*rows, *cost]) if n != ROOT and n not in base
             and (n in beyond or cost.get(n, 0.0) > _FLOOR)]

    def key(name: str) -> tuple:
        if name in beyond:
            return (0, -(_num(rows[name].get("excess")) or 0.0))
        return (1, -cost.get(name, 0.0))

    return sorted(names, key=key)


def local_cost(quant: dict[str, Any]) -> dict[str, float]:
    """Layer -> the NSR its own quantization adds: the larger of its measured NSR fed float inputs
    (``local_sqnr_db``, ONNX Runtime's isolated run) and the scheme's weight rounding predicted from
    the float values (``local_budgets``: every weighted op, captured or not)."""
    cost: dict[str, float] = {}
    for lr in quant.get("layers", []):
        sq = _num(lr.get("local_sqnr_db"))
        if sq is not None:
            cost[lr["layer"]] = max(cost.get(lr["layer"], 0.0), 0.0 if sq == math.inf else 10 ** (-sq / 10))
    for b in (quant.get("local_budgets") or {}).values():
        if b.get("signal"):
            cost[b["layer"]] = max(cost.get(b["layer"], 0.0), b["weight_noise"] / b["signal"])
    return cost


class Trials:
    """Runs the backend once per distinct set of float layers: does it meet the target?"""

    def __init__(self, run: Callable[[list[str]], Trial], log: list[Trial], params: dict[str, int]) -> None:
        self.run, self.log, self.params, self.seen = run, log, params, {}

    def __call__(self, layers: list[str]) -> bool:
        key = frozenset(layers)
        if key not in self.seen:
            trial = self.run(list(layers))
            trial.params_float = params_in(layers, self.params)
            self.log.append(trial)
            self.seen[key] = trial
        return self.seen[key].meets

    def result(self, layers: list[str]) -> Trial:
        return self.seen[frozenset(layers)]


def shortest(ranked: list[str], ok: Callable[[list[str]], bool]) -> list[str] | None:
    """The fewest of ``ranked`` that ``ok``: prefixes of 1, 2, 4... layers until one is, a
    bisection between it and the last that was not, then each layer dropped (last ranked first)
    that ``ok`` holds without. None: not even all of them."""
    lo, hi = 0, min(1, len(ranked))  # the prefix of lo layers does not meet it (0: drift's own run)
    while hi and not ok(ranked[:hi]):
        if hi == len(ranked):
            return None
        lo, hi = hi, min(2 * hi, len(ranked))
    if not hi:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(ranked[:mid]) else (mid, hi)
    kept = ranked[:hi]
    for name in reversed(ranked[:hi]):
        rest = [n for n in kept if n != name]
        if rest and ok(rest):
            kept = rest
    return kept


def suggest(backend: str, quant: dict[str, Any], run: Callable[[list[str]], Trial], params: dict[str, int],
            target_sqnr: float | None = None, base: tuple[str, ...] = (), max_layers: int = MAX_LAYERS) -> FloatSuggestion:
    """The fewest layers of ``quant``'s ranking to keep float (module docstring). ``run(layers)``
    runs the backend with ``base`` (the spec's own ``keep_float``) and ``layers`` kept float, and
    measures it (the quant report where there is no target SQNR); ``params``: qualified parameter
    name -> elements."""
    started = time.perf_counter()
    scheme = quant["scheme"]
    result = FloatSuggestion(backend, scheme, target_words(scheme, target_sqnr), target_sqnr,
                             params_total=sum(params.values()))
    before = Trial([], _num(quant.get("output_sqnr_db")))
    before.rel_err = rel_err(before.output_sqnr_db)
    before.beyond = [lr["layer"] for lr in quant.get("layers", []) if str(lr["verdict"]).startswith("beyond")]
    before.excess = max((_num(lr.get("excess")) or 0.0 for lr in quant.get("layers", [])), default=0.0)
    before.meets = meets(before, target_sqnr)
    result.before = before
    judged = {lr["layer"] for lr in quant.get("layers", [])}
    hidden = [n for n in local_cost(quant) if n not in judged and n not in base]
    if hidden and target_sqnr is None:
        result.notes.append(f"{len(hidden)} weighted layers ran where {backend} exposes no value ({', '.join(hidden[:4])}"
                            f"{' ...' if len(hidden) > 4 else ''}): drift cannot judge them beyond {scheme}; "
                            "--target-sqnr DB searches by the output instead")
    if before.meets:
        if target_sqnr is None and before.output_sqnr_db is not None:
            result.notes.append(f"the output's {before.output_sqnr_db:.3g} dB is within what {scheme} rounding of "
                                "these float values explains; --target-sqnr DB asks for more")
        result.found, result.after = True, before
        result.seconds = round(time.perf_counter() - started, 2)
        return result
    ranked = ranking(quant, base)
    if len(ranked) > max_layers:
        result.notes.append(f"searched the first {max_layers} of {len(ranked)} ranked layers")
    result.ranked = ranked = ranked[:max_layers]
    if ROOT in (before.beyond or []) and target_sqnr is None:
        result.notes.append(f"{ROOT} (ops of the model's own forward) is beyond {scheme}: no module name keeps it "
                            "float, and the target asks it of the modules only")
    trial = Trials(run, result.trials, params)
    chosen = shortest(ranked, trial)
    if chosen is None:
        result.notes.append(f"no set of the {len(ranked)} ranked layers meets the target" if ranked
                            else "no layer of this run can be kept float")
        tried = [t for t in result.trials if t.output_sqnr_db is not None]
        result.after = max(tried, key=lambda t: t.output_sqnr_db, default=None)
    else:
        result.found, result.layers, result.after = True, chosen, trial.result(chosen)
        result.rerun = spec_with(backend, [*base, *chosen])
    result.params_float = result.after.params_float if result.after is not None else 0
    result.seconds = round(time.perf_counter() - started, 2)
    return result


def params_in(layers: list[str], params: dict[str, int]) -> int:
    """The parameters (qualified name -> element count) inside ``layers`` or their submodules."""
    return sum(n for p, n in params.items() if any(p.startswith(m + ".") for m in layers))


def target_words(scheme: str, target_sqnr: float | None) -> str:
    return f"every output SQNR >= {target_sqnr:g} dB" if target_sqnr is not None else f"no layer beyond {scheme}"


def meets(trial: Trial, target_sqnr: float | None) -> bool:
    """The target (module docstring): a failed run never meets it."""
    if trial.error:
        return False
    if target_sqnr is not None:
        return trial.output_sqnr_db is not None and trial.output_sqnr_db >= target_sqnr
    return trial.beyond is not None and not [n for n in trial.beyond if n != ROOT]


def rel_err(sqnr_db: float | None) -> float | None:
    """The relative L2 error of an SQNR: sqrt(NSR)."""
    if sqnr_db is None:
        return None
    return 0.0 if sqnr_db == math.inf else 10 ** (-sqnr_db / 20)


def output_sqnr(got: list, want: list) -> float | None:
    """The worst output's SQNR against float eager (as drift's quant report gives it)."""
    pairs = [(w, g) for g, w in zip(got, want) if getattr(w, "is_floating_point", lambda: False)()
             and getattr(g, "numel", lambda: -1)() == w.numel()]
    if not pairs:
        return None
    return min(qn.sqnr_db(qn.nsr(w, g.reshape(w.shape))) for w, g in pairs)


def spec_with(spec: str, layers: list[str]) -> str:
    """``spec`` with its ``keep_float`` option set to ``layers`` (replacing one it had)."""
    name, _, rest = spec.partition(":")
    items = [i for i in rest.split(",") if i.strip() and i.partition("=")[0].strip() != "keep_float"]
    if layers:
        items.append("keep_float=" + "+".join(layers))
    return name + (":" + ",".join(items) if items else "")


def write_trials_csv(s: dict[str, Any], path: Path) -> None:
    """A suggestion (``FloatSuggestion.to_json``) as one row per run, drift's own run first."""
    total = s.get("params_total") or 0
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(TRIAL_COLUMNS)
        for i, t in enumerate([s["before"], *s["trials"]]):
            share = t["params_float"] / total if total else ""
            w.writerow([i, "+".join(t["layers"]), len(t["layers"]), _cell(share), _cell(t["output_sqnr_db"]),
                        _cell(t["rel_err"]), "+".join(t["beyond"] or []) if t["beyond"] is not None else "",
                        t["meets"], _cell(t["seconds"]), t["error"]])


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v
