"""``xray drift``: one export, one eager reference, every backend run whole, one compare per backend.

A backend that fails to export, lower or run is reported with its stage and error; the others
still run. Verdicts are compare's (``xray.compare.compare_dumps``): drift reuses its rules, its
first divergence and its local-error recomputation, never a rule of its own.
"""
from __future__ import annotations

import inspect
import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..dump.atomic import write_text
from ..dump.folder_owner import check_output, replace_output
from ..backends.base import Backend, BackendError, ModelCapture, ReplayStatus, short_error
from .capture_dump import CaptureResolver, write_capture
from .layers import LayerRow, layer_rows
from .logfile import LOG_NAME, full_message, into_log, log_exception
from .reference import DRIFT, Reference, record_reference

OK = ReplayStatus.OK.name  # the statuses are replay's (one enum), by name


@dataclass
class BackendDrift:
    """One backend's whole-model run: how far it got, what it exposed, where it drifts first."""

    backend: str
    status: str = OK  # OK, or the ReplayStatus name of the failing stage (EXPORT_FAIL, LOWER_FAIL, RUN_FAIL...)
    error: str = ""  # one line
    error_detail: str = ""  # the whole message and its causes; the traceback is in OUT/drift.log
    dump: str | None = None
    granularity: str = ""
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    mapped: int = 0  # eager records (with an output tensor) the backend's values were mapped to
    eager_records: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    first: dict[str, Any] | None = None  # compare's first divergence (summary JSON form)
    first_node: str = ""  # the program node of that record
    first_layer: str = ""  # its layer, the recorded module path (compare strips wrapper prefixes)
    compare: dict[str, Any] = field(default_factory=dict)  # compare's totals
    output_err: float | None = None  # the deployed run's outputs: max |backend - program| / max |program|
    layers: list[LayerRow] = field(default_factory=list)
    # a quantized backend (``quant=<scheme>``): per-layer error against float eager and the scheme's
    # verdict (``drift.quant``); compare's float rows are kept beside it
    quant: dict[str, Any] | None = None

    @property
    def mapped_pct(self) -> float:
        return 100.0 * self.mapped / self.eager_records if self.eager_records else 0.0


@dataclass
class DriftResult:
    """Everything ``xray drift`` found; ``out/drift.json`` holds the same."""

    out: Path
    eager_dump: Path
    program_nodes: int
    eager_records: int
    eager_equal: bool
    eager_max_diff: float
    eager_s: float
    seconds: dict[str, float]
    backends: list[BackendDrift]
    notes: list[str] = field(default_factory=list)  # what drift changed for the run (use_cache off)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["out"], d["eager_dump"] = str(self.out), str(self.eager_dump)
        for b, src in zip(d["backends"], self.backends):
            b["mapped_pct"] = round(src.mapped_pct, 2)
        return d


def drift(model: torch.nn.Module, example_args: Any, backends: list[str] | tuple[str, ...] = ("onnxrt-cpu",),
          out: str | Path = "xray-drift", *, kwargs: dict | None = None,
          edits: dict[str, Callable[[Any], Any]] | None = None, progress: Callable[[str], None] | None = None,
          suggest_float: bool = False, target_sqnr: float | None = None) -> DriftResult:
    """Run ``model`` whole on each backend and say where each one starts to drift from eager.

    ``edits`` maps a backend name to a function given that backend's own program before it runs
    (``Backend.run_model``'s ``edit``): tests inject faults into the deployed graph this way.
    ``suggest_float``: for each quantized backend, the fewest layers to keep float for its run to
    meet ``target_sqnr`` (dB, every output) or, without one, to have no layer beyond its scheme,
    each candidate set verified by a run (``drift.keep_float``).
    """
    from ..backends.registry import parse_spec
    from .keep_float import check_request

    for name in backends:  # replay's check: an unknown preset is refused before any export
        parse_spec(name)
    check_request(backends, suggest_float, target_sqnr)
    out = Path(out)
    check_outputs(out, backends)
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _: None)
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    started = time.perf_counter()
    say("export + eager reference")
    with _no_kv_cache(model, kwargs or {}) as notes:
        for note in notes:
            say(note)
        ref = record_reference(model, args, kwargs or {}, out)
    from ..dump import load_dump

    eager = load_dump(ref.dump)
    result = DriftResult(out=out, eager_dump=ref.dump, program_nodes=len(ref.node_seq),
                         eager_records=sum(1 for r in eager.records if any(True for _ in r.output_tensors())),
                         eager_equal=ref.eager_equal, eager_max_diff=ref.eager_max_diff, eager_s=ref.eager_s,
                         seconds=dict(ref.seconds), backends=[], notes=notes)
    try:
        for name in backends:
            say(f"backend {name}")
            suggest = _Suggest(target_sqnr, say) if suggest_float else None
            result.backends.append(_one_backend(name, ref, eager, out, (edits or {}).get(name), suggest))
            _dynamic(result.backends[-1], name, model, args, kwargs or {}, out)
            # written after every backend: a backend that takes the process down keeps the others' results
            write_text(out / "drift.json", json.dumps(result.to_json(), indent=1, default=str))
    finally:
        eager.close()
    result.seconds["total"] = time.perf_counter() - started
    write_text(out / "drift.json", json.dumps(result.to_json(), indent=1, default=str))
    return result


def check_outputs(out: Path, backends: list[str] | tuple[str, ...]) -> None:
    """Refuse (``OutputFolderError``) before any work an output folder drift would replace but
    did not write: a user's ``OUT/eager`` is never deleted."""
    for folder in (out / "eager", out / "_recording", *(out / "dumps" / _safe(n) for n in backends)):
        check_output(folder, DRIFT)


@contextmanager
def _no_kv_cache(model: Any, kwargs: dict) -> Iterator[list[str]]:
    """A transformers model built with ``use_cache=True`` (their default) returns a KV-cache
    object torch.export cannot output: drift switches it off in the config for its run (and
    back after), and says so. An explicit ``use_cache`` keyword is the caller's choice."""
    config = getattr(model, "config", None)
    if "use_cache" in kwargs or getattr(config, "use_cache", None) is not True:
        yield []
        return
    config.use_cache = False
    try:
        yield ["use_cache=False for this run: a KV cache is not a tensor output torch.export can return "
               "(model.config.use_cache is restored afterwards)"]
    finally:
        config.use_cache = True


@dataclass
class _Suggest:
    """A ``--suggest-float`` request: its target (None: no layer beyond the scheme) and where to say progress."""

    target_sqnr: float | None
    say: Callable[[str], None]


def _one_backend(name: str, ref: Reference, eager: Any, out: Path, edit: Callable | None,
                 suggest: _Suggest | None = None) -> BackendDrift:
    """Run, map, write and compare one backend; a failure is its stage and error."""
    from ..backends.registry import create

    b = BackendDrift(backend=name)
    try:
        backend = create(name)
    except Exception as e:  # noqa: BLE001 - an unknown preset is this backend's failure only
        b.status, b.error = ReplayStatus.EXPORT_FAIL.name, short_error(e)
        return b
    log = out / LOG_NAME
    with into_log(log, f"backend {name}"):
        capture = _run_backend(b, backend, ref, edit, log)
    if capture is None:
        return b
    b.output_err = _output_error(capture.outputs, ref.outputs)
    if backend.options.get("quant") is not None:
        _quant(b, backend, ref, eager, capture, out, name)
    t0 = time.perf_counter()
    folder = replace_output(out / "dumps" / _safe(name), DRIFT)
    for placeholder, t in ref.user_placeholders.items():  # the backend was fed exactly these
        capture.values.setdefault(placeholder, [t])
    seq_node = ref.seq_node
    resolver = CaptureResolver(capture, seq_node, ref.state, ref.placeholder_args)
    written = write_capture(folder, eager, capture, resolver, seq_node, backend=name, options=dict(backend.options))
    b.mapped, b.eager_records, b.dump = written.mapped, written.records, str(folder)
    if written.misshapen:
        b.notes.append(f"{len(written.misshapen)} captured values have another shape than their node's and "
                       f"were not written: {', '.join(written.misshapen[:8])}")
    b.seconds["dump"] = time.perf_counter() - t0
    if b.mapped == 0:
        b.notes.append("no eager record could be mapped: nothing to compare")
        return b
    _compare(b, ref.dump, folder, seq_node)
    layer_of = {r.seq: r.module or "<root>" for r in eager.records}
    if b.first is not None:
        b.first_layer = layer_of.get(b.first.get("bench_seq"), b.first.get("module") or "")
    if type(backend).run_isolated is not Backend.run_isolated:
        with into_log(log, f"backend {name}, isolated run"):
            _isolated(b, backend, ref, edit, layer_of)
    if b.quant is not None and suggest is not None:
        _suggest_float(b, name, ref, eager, out, edit, suggest)
    if b.quant is not None:
        from .quant import write_quant_csv

        write_quant_csv(b.quant, out / f"quant-{_safe(name)}.csv")
    return b


def _suggest_float(b: BackendDrift, name: str, ref: Reference, eager: Any, out: Path, edit: Callable | None,
                   request: _Suggest) -> None:
    """The layers to keep float (``keep_float.suggest``), each set run by ``_float_trial``; into
    ``b.quant["keep_float"]`` and ``DIR/keep-float-<backend>.csv``."""
    from ..backends.quantize import float_layers
    from ..backends.registry import parse_spec
    from .keep_float import suggest, write_trials_csv

    t0 = time.perf_counter()
    base = float_layers(parse_spec(name)[1].get("keep_float"))
    params = {key.split(":", 1)[1]: ref.placeholders[ph].numel() for key, ph in ref.state.items()
              if key.startswith("param:") and isinstance(ref.placeholders.get(ph), torch.Tensor)}

    def run(layers: list[str]):
        request.say(f"backend {name}: keep float {'+'.join(layers)}")
        return _float_trial(name, [*base, *layers], layers, ref, eager, out, edit, request.target_sqnr)

    found = suggest(name, b.quant, run, params, request.target_sqnr, base).to_json()
    b.quant["keep_float"] = found
    for row in b.quant["layers"]:
        if found["found"] and row["layer"] in found["layers"]:
            row["keep_float"] = True
    write_trials_csv(found, out / f"keep-float-{_safe(name)}.csv")
    b.seconds["suggest_float"] = time.perf_counter() - t0


def _float_trial(name: str, keep: list[str], layers: list[str], ref: Reference, eager: Any, out: Path,
                 edit: Callable | None, target_sqnr: float | None):
    """One verification run: the backend with ``keep`` float, run whole as drift runs it (same
    program, inputs, calibration and ``edit``); without a target SQNR, judged by the quant report
    (and the isolated run's local verdicts, where the backend has one) as drift's own run is."""
    from ..backends.registry import create
    from .keep_float import Trial, meets, output_sqnr, rel_err, spec_with

    t0 = time.perf_counter()
    spec = spec_with(name, keep)
    probe = BackendDrift(backend=spec)
    trial = Trial(layers)
    log = out / LOG_NAME
    with into_log(log, f"backend {spec} (--suggest-float)"):
        backend = create(spec)
        capture = _run_backend(probe, backend, ref, edit, log)
        if capture is not None and target_sqnr is None:
            _quant(probe, backend, ref, eager, capture, out, spec)
            if type(backend).run_isolated is not Backend.run_isolated:
                _isolated(probe, backend, ref, edit, {r.seq: r.module or "<root>" for r in eager.records})
    if capture is None:
        trial.error = f"{probe.status}: {probe.error}"
    else:
        trial.output_sqnr_db = output_sqnr(capture.outputs, ref.outputs)
        trial.rel_err = rel_err(trial.output_sqnr_db)
        if probe.quant is not None:
            rows = probe.quant["layers"]
            trial.beyond = [lr["layer"] for lr in rows if str(lr["verdict"]).startswith("beyond")]
            trial.excess = max((float(lr.get("excess") or 0.0) for lr in rows), default=0.0)
    trial.meets = meets(trial, target_sqnr)
    trial.seconds = round(time.perf_counter() - t0, 2)
    return trial


def _dynamic(b: BackendDrift, name: str, model: torch.nn.Module, args: tuple, kwargs: dict, out: Path) -> None:
    """``dynamic=batch|seq``: beside the static run, the model exported with that dimension
    symbolic and run at two sizes (``backends.shapes.two_sizes``); its figures go to
    ``facts["dynamic"]``, and a failure is a note naming the stage, not the backend's status."""
    from ..backends.registry import create
    from ..backends.shapes import DIMS, two_sizes

    try:
        backend = create(name)
    except Exception:  # noqa: BLE001 - _one_backend already reported it
        return
    which = backend.options.get("dynamic")
    if which not in DIMS:  # not asked (torch.compile's own ``dynamic`` flag is another option)
        return
    t0 = time.perf_counter()
    with into_log(out / LOG_NAME, f"backend {name}, dynamic {which}"), _no_kv_cache(model, kwargs):
        try:
            found = two_sizes(backend, model, args, kwargs)
        except Exception as e:  # noqa: BLE001 - the static run's results stand without it
            status = e.status.name if isinstance(e, BackendError) else ReplayStatus.RUN_FAIL.name
            b.facts["dynamic"] = {"status": status, "error": short_error(e)}
            b.notes.append(f"dynamic={which}: {status}: {short_error(e)}")
            log_exception(out / LOG_NAME, e)
            return
        finally:
            b.seconds["dynamic"] = time.perf_counter() - t0
    b.facts["dynamic"] = {"status": ReplayStatus.OK.name, **found}
    errs = ", ".join("-" if e is None else f"{e:.3g}" for e in found["output_err"])
    b.notes.append(f"dynamic={which}: one program ({found['dynamic_dims']} symbolic input dims) ran at "
                   f"{' and '.join(found['sizes'])} ({found['second_size']}); outputs vs eager at each size: "
                   f"{errs} of their peak")


def _quant(b: BackendDrift, backend: Any, ref: Reference, eager: Any, capture: ModelCapture, out: Path,
           name: str) -> None:
    """The quantized run's per-layer error and its scheme's verdict (``drift.quant``), and its CSV."""
    from .quant import quant_report

    t0 = time.perf_counter()
    layer_of = {r.seq: r.module or "<root>" for r in eager.records}
    layer_of_node = {node: layer_of.get(seq, "<root>") for node, seq in ref.node_seq.items()}
    report = quant_report(ref.program, ref.values, ref.placeholders, capture.values, layer_of_node,
                          str(backend.options["quant"]), outputs=(capture.outputs, ref.outputs))
    b.quant = report.to_json()
    b.notes.append(f"quantized run: compare's float rules are expected to fail it; the {report.scheme} verdict is "
                   "the quantization table (budget: the scheme's rounding of each tensor, from its float values)")
    b.seconds["quant"] = time.perf_counter() - t0


def _isolated(b: BackendDrift, backend: Any, ref: Reference, edit: Callable | None, layer_of: dict[int, str]) -> None:
    """The backend's isolated run (every captured edge fed from eager): each layer's error when it
    reads eager inputs, beside the accumulated one. A plain number; compare's verdicts stand."""
    t0 = time.perf_counter()
    try:
        capture = backend.run_isolated(ref.program, ref.user_inputs, ref.values, edit=edit)
    except Exception as e:  # noqa: BLE001 - the whole run's results stand without it
        b.notes.append(f"isolated run: {short_error(e)}")
        return
    finally:
        b.seconds["isolated"] = time.perf_counter() - t0
    worst: dict[str, float] = {}
    for node, got in capture.values.items():
        seq = ref.node_seq.get(node)
        if seq is None:
            continue
        err = _output_error([t for t in got if t is not None], [w for t, w in zip(got, ref.values.get(node, []))
                                                                if t is not None])
        if err is not None:
            layer = layer_of.get(seq, "<root>")
            worst[layer] = max(worst.get(layer, 0.0), err)
    for row in b.layers:
        row.isolated_err = worst.get(row.layer)
    if b.quant is not None:
        from .quant import local_sqnr

        local_sqnr(b.quant, capture.values, ref.values, {n: layer_of.get(s, "<root>") for n, s in ref.node_seq.items()},
                   ref.placeholders)


def _run_backend(b: BackendDrift, backend: Any, ref: Reference, edit: Callable | None,
                 log: Path) -> ModelCapture | None:
    """The backend's capture, or None with the failing stage and error filled in (the whole
    message in ``error_detail``, the traceback in the log)."""
    t0 = time.perf_counter()
    try:
        extra = {}
        if backend.options.get("quant") is not None and "source" in inspect.signature(backend.run_model).parameters:
            extra["source"] = (ref.source, *ref.call)  # PT2E quantizes the program before decompositions
        capture = backend.run_model(ref.program, ref.user_inputs, edit=edit, **extra)
    except Exception as e:  # noqa: BLE001 - a backend's bug is that backend's failure, not the run's
        if isinstance(e, BackendError):
            b.status, b.error = e.status.name, str(e)
        elif isinstance(e, NotImplementedError):
            b.status, b.error = ReplayStatus.EXPORT_FAIL.name, f"{backend.kind}: whole-model runs not implemented ({e})"
        else:
            b.status, b.error = ReplayStatus.RUN_FAIL.name, short_error(e)
        b.error_detail = full_message(e)
        log_exception(log, e)
        return None
    finally:
        b.seconds["backend"] = time.perf_counter() - t0
    b.granularity, b.notes, b.facts = capture.granularity, list(capture.notes), dict(capture.facts)
    return capture


def _compare(b: BackendDrift, eager: Path, target: Path, seq_node: dict[int, str]) -> None:
    from ..compare import compare_dumps
    from ..compare.report import write_csv

    t0 = time.perf_counter()
    try:
        result = compare_dumps(eager, target, progress=False)
    except Exception as e:  # noqa: BLE001 - compare refuses (nothing comparable): say so for this backend
        b.notes.append(f"compare: {short_error(e)}")
        b.seconds["compare"] = time.perf_counter() - t0
        return
    write_csv(result, target.parent.parent / f"compare-{target.name}.csv")
    s = result.summary
    b.compare = {k: getattr(s, k) for k in ("matched", "match_pct", "passed", "warned", "failed", "nan_inf",
                                            "skipped", "unmatched")}
    b.first = s.first_divergence
    if b.first is not None and b.first.get("bench_seq") is not None:
        b.first_node = seq_node.get(b.first["bench_seq"], "")
    b.layers = layer_rows(result.rows, target)
    b.seconds["compare"] = time.perf_counter() - t0


def _output_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float | None:
    """How far the backend's own outputs (its plain, deployed run) are from the reference program's:
    a number to read beside the verdicts, not a verdict."""
    pairs = [(g, w) for g, w in zip(got, want) if w.is_floating_point() and g.numel() == w.numel() and w.numel()]
    if not pairs or len(got) != len(want):
        return None
    return max(float((g.detach().double().reshape(w.shape) - w.detach().double()).abs().max())
               / max(float(w.detach().abs().max()), 1e-30) for g, w in pairs)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
