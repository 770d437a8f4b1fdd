"""Quantization bugs injected into real quantization flows: does ``xray drift``'s report name the layer?

Five real models with random weights, built from small configs, no downloads: a transformers
Llama decoder, a BERT encoder, a ViT, a ResNet (transformers) and a Whisper audio encoder. Each
runs through the flows as their authors run them: static int8 (``ort``: ``onnxrt-cpu:quant=int8``,
ONNX Runtime ``quantize_static`` QDQ; ``xnnpack``: ``executorch-xnnpack:quant=int8``, PT2E with the
XNNPACK quantizer, lowered to XNNPACK), calibrated on the run's own input; dynamic int8 linear
(``ort-dynamic``: ``quantize_dynamic``; ``xnnpack-dynamic``: the XNNPACK quantizer's dynamic
config); int4 weight-only (``ort-int4``: ``MatMulNBits``, blocks of 32). In four cases (the new
schemes take the first two: per-tensor against per-channel is a static int8 question):

- ``clean``: no bug; every layer should be within int8 (anything beyond is a false alarm);
- ``wrong_scale``: one random layer's weight scales 1.5x too large after calibration;
- ``per_tensor``: one random layer's weight requantized with one scale (the largest channel's)
  where the flow meant per channel;
- ``outlier``: one weight of a random layer set to 20x the layer's largest (in the float model,
  so the reference has it too), and that layer quantized per tensor: the outlier's step ruins
  the rest of the layer.

Graded on ``drift``'s quant report: ``exact`` when the bug's layer is the report's worst layer
and beyond its scheme's budget; ``beyond, not worst`` when it is beyond but another layer is
worse; ``missed`` when it is within (or not exposed at all); ``false alarms`` counts the *other*
layers beyond. ``effect`` is how much the bug raises the layer's weight rounding noise (NSR of the
deployed weight over what the scheme's correct rounding gives, from the float weights): a
per-tensor bug on a layer whose channels share one range costs nothing and cannot be seen.

Cases that share a float model run in one ``xray.drift`` call (one export, one eager
reference), each under its own backend name (``threads=N`` / ``partitioner=xnnpack`` spell the
same flow). A flow that fails on a model is reported with its stage and error, never skipped.

    python tools/bench_quant_faults.py [--models llama,bert,vit,resnet,whisper]
                                       [--flows ort,xnnpack,ort-dynamic,xnnpack-dynamic,ort-int4]
                                       [--seed 0] [--out bench-quant.json]

``--suggest`` runs ``xray drift --suggest-float`` at real size instead (``SUGGEST_MODELS``: an MLP
1024 wide on 512 tokens): the clean model (by default, no layer beyond the scheme: nothing should
be kept float), then the model with one layer's int8 weights ruined by an outlier column that
reads a dead unit (``examples.dead_unit_outlier``), searched by the output with the target the
clean run's output SQNR less ``TARGET_MARGIN_DB``; it prints what was kept float, the measured
output SQNR before and after, the verification runs and the time.

    python tools/bench_quant_faults.py --suggest [--flows ort,ort-dynamic,ort-int4,xnnpack] [--out F]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xray.quiet import quiet_third_party  # noqa: E402

quiet_third_party()

import xray  # noqa: E402
from xray.drift import examples as ex  # noqa: E402

CASES = ("clean", "wrong_scale", "per_tensor", "outlier")
SCALE_FACTOR = 1.5
OUTLIER_FACTOR = 20.0


def _ort(scheme: str) -> list[str]:
    return [f"onnxrt-cpu:quant={scheme}", *(f"onnxrt-cpu:quant={scheme},threads={n}" for n in (1, 2, 3))]


def _xnnpack(scheme: str) -> list[str]:
    return [f"executorch-xnnpack:quant={scheme}", f"executorch-xnnpack:quant={scheme},partitioner=xnnpack"]


WEIGHTED = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)
# Per flow: its scheme, the cases it takes, its backend names (the first is the flow; the others
# spell the same flow again, so cases that share a float model run in one drift call), and the
# layers its scheme quantizes (ONNX Runtime's dynamic and int4 quantizers take MatMul only).
FLOWS = {"ort": ("int8", CASES, _ort("int8"), WEIGHTED), "xnnpack": ("int8", CASES, _xnnpack("int8"), WEIGHTED),
         "ort-dynamic": ("int8-dynamic", CASES[:2], _ort("int8-dynamic"), (torch.nn.Linear,)),
         "xnnpack-dynamic": ("int8-dynamic", CASES[:2], _xnnpack("int8-dynamic"), WEIGHTED),
         "ort-int4": ("int4", CASES[:2], _ort("int4"), (torch.nn.Linear,))}
DEFAULT_FLOWS = ("ort", "xnnpack")


# --- models ---------------------------------------------------------------------------------

def _llama() -> tuple[torch.nn.Module, tuple]:
    return ex.tiny_llama(layers=1, hidden=32, seq=8)


def _bert() -> tuple[torch.nn.Module, tuple]:
    return ex.tiny_bert(hidden=32, layers=1, seq=8)


def _vit() -> tuple[torch.nn.Module, tuple]:
    return ex.tiny_vit()


def _resnet() -> tuple[torch.nn.Module, tuple]:
    """transformers ResNetForImageClassification: a 3x3 stem, two basic stages (8, 16 channels)."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    cfg = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                       num_labels=10)
    return ResNetForImageClassification(cfg).eval(), (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


def _whisper() -> tuple[torch.nn.Module, tuple]:
    return ex.tiny_whisper_encoder()


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple]]] = {
    "llama": _llama, "bert": _bert, "vit": _vit, "resnet": _resnet, "whisper": _whisper}


def weight_layers(model: torch.nn.Module, kinds: tuple = WEIGHTED) -> list[str]:
    """Layers a flow quantizes with a weight (static int8: Linear and Conv modules)."""
    return [name for name, m in model.named_modules() if name and isinstance(m, kinds)]


# --- faults ---------------------------------------------------------------------------------

def onnx_per_tensor_fault(layer: str):
    """An ``edit`` for ``onnxrt-cpu:quant=int8``: ``layer``'s per-channel int8 weight requantized
    with one scale (the largest channel's), as a per-tensor quantizer would store it."""

    def edit(proto):
        import numpy as np
        from onnx import numpy_helper

        hit = 0
        for dq, inits in ex.onnx_dequantizers_of(proto, layer, weight_only=True):  # (the int32 bias stays)
            q, sc = numpy_helper.to_array(inits[dq.input[0]]), numpy_helper.to_array(inits[dq.input[1]])
            if sc.ndim == 0 or sc.size == 1:
                continue
            axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
            shape = [1] * q.ndim
            shape[axis] = -1
            # symmetric weights stored as int8, or as uint8 around 128 (the zero point says which)
            zp = numpy_helper.to_array(inits[dq.input[2]]).astype(np.float32) if len(dq.input) > 2 else 0.0
            zp = np.broadcast_to(zp, sc.shape).reshape(shape)
            w = (q.astype(np.float32) - zp) * sc.reshape(shape)
            step = np.float32(sc.max())
            requant = (np.clip(np.round(w / step), -127, 127) + zp).astype(q.dtype)
            inits[dq.input[0]].CopyFrom(numpy_helper.from_array(requant, dq.input[0]))
            inits[dq.input[1]].CopyFrom(numpy_helper.from_array(np.full_like(sc, step), dq.input[1]))
            hit += 1
        if not hit:
            raise KeyError(f"no per-channel quantized weight of layer {layer!r} in the ONNX graph")

    return edit


def add_outlier(model: torch.nn.Module, layer: str, factor: float = OUTLIER_FACTOR) -> None:
    """One weight of ``layer`` set to ``factor`` x the layer's largest (the float model's own value)."""
    w = model.get_submodule(layer).weight
    with torch.no_grad():
        flat = w.view(-1)
        flat[flat.numel() // 3] = factor * float(w.abs().max())


def fault_edit(flow: str, case: str, layer: str):
    onnx = flow.startswith("ort")
    if case == "wrong_scale":
        return (ex.onnx_weight_scale_fault if onnx else ex.pt2e_weight_scale_fault)(layer, SCALE_FACTOR)
    if case in ("per_tensor", "outlier"):
        return onnx_per_tensor_fault(layer) if onnx else ex.pt2e_per_tensor_fault(layer)
    return None


def effect(model: torch.nn.Module, case: str, layer: str | None, scheme: str = "int8") -> float | None:
    """How many times the bug raises ``layer``'s weight rounding noise over the scheme's correct rounding."""
    if layer is None:
        return None
    from xray.numerics import quantization as qn

    w = model.get_submodule(layer).weight.detach().double()
    flat = w.reshape(w.shape[0], -1)
    sch = qn.scheme(scheme)
    good = qn.round_weights(flat, sch)
    if case == "wrong_scale":
        got = qn.round_weights(flat, sch, scale=SCALE_FACTOR)
    else:
        step = flat.abs().max() / 127
        got = torch.clamp(torch.round(flat / step), -127, 127) * step
    return qn.nsr(flat, got) / max(qn.nsr(flat, good), 1e-30)


# --- running and grading --------------------------------------------------------------------

def plan(model_name: str, flows: list[str], rng: random.Random) -> list[dict[str, Any]]:
    """The checks of one model: (flow, case, faulted layer), the layer drawn at random."""
    model, _ = MODELS[model_name]()
    layers = weight_layers(model)
    checks = []
    for case in CASES:
        layer = None if case == "clean" else rng.choice(layers)
        for flow in flows:
            if case not in FLOWS[flow][1]:
                continue
            mine = weight_layers(model, FLOWS[flow][3])
            # a layer the scheme leaves float has no scale to get wrong: drawn again among the
            # scheme's own, by a draw of its own (the shared sequence stays as it is)
            redraw = layer is not None and layer not in mine
            chosen = random.Random(f"{model_name}:{case}:{layer}").choice(mine) if redraw else layer
            checks.append({"model": model_name, "flow": flow, "case": case, "layer": chosen})
    return checks


def run_model(model_name: str, checks: list[dict[str, Any]], workdir: Path) -> None:
    """Run ``checks`` of one model, as few drift calls as the backend names allow; fills each check."""
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for c in checks:  # the outlier case changes the float model: its own drift call(s)
        groups.setdefault(c["layer"] if c["case"] == "outlier" else None, []).append(c)
    for outlier_layer, group in groups.items():
        pending = list(group)
        while pending:
            used: dict[str, int] = {}
            batch = []
            for c in list(pending):
                k = used.get(c["flow"], 0)
                if k < len(FLOWS[c["flow"]][2]):
                    c["backend"] = FLOWS[c["flow"]][2][k]
                    used[c["flow"]] = k + 1
                    batch.append(c)
                    pending.remove(c)
            _drift_call(model_name, outlier_layer, batch, workdir)


def _drift_call(model_name: str, outlier_layer: str | None, batch: list[dict[str, Any]], workdir: Path) -> None:
    model, args = MODELS[model_name]()
    if outlier_layer is not None:
        add_outlier(model, outlier_layer)
    for c in batch:
        c["effect"] = effect(model, c["case"], c["layer"], FLOWS[c["flow"]][0])
    edits = {}
    for c in batch:
        if c["layer"] is not None:
            edits[c["backend"]] = fault_edit(c["flow"], c["case"], c["layer"])
    out = Path(tempfile.mkdtemp(prefix=f"{model_name}-", dir=workdir))
    start = time.perf_counter()
    try:
        result = xray.drift(model, args, [c["backend"] for c in batch], out, edits=edits)
    except Exception as e:  # noqa: BLE001 - the export of the float model failed: every check says so
        for c in batch:
            c.update(status="EXPORT_FAIL", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return
    seconds = time.perf_counter() - start
    by_name = {b.backend: b for b in result.backends}
    for c in batch:
        b = by_name[c["backend"]]
        c["seconds"] = round(seconds / len(batch), 1)
        c["status"], c["error"] = b.status, b.error
        if b.status != "OK" or b.quant is None:
            continue
        grade(c, b.quant)


def grade(check: dict[str, Any], quant: dict[str, Any]) -> None:
    layers = {lr["layer"]: lr for lr in quant["layers"]}
    beyond = [name for name, lr in layers.items() if lr["verdict"].startswith("beyond")]
    bug = check["layer"]
    worst = quant["worst"][0] if quant["worst"] else None
    check.update(layers=len(layers), beyond=beyond, worst=worst, output_sqnr_db=quant["output_sqnr_db"])
    ratios = [lr["local_ratio"] for name, lr in layers.items() if lr.get("local_ratio") is not None and name != bug]
    check["max_other_local_ratio"] = max(map(float, ratios), default=None)  # the clean layers' margin, fed float
    if bug is None:
        check["outcome"] = "pass" if not beyond else "false alarm"
        check["false_alarms"] = len(beyond)
        return
    row = layers.get(bug)
    check["bug_sqnr_db"] = row["sqnr_db"] if row else None
    check["bug_local_sqnr_db"] = row.get("local_sqnr_db") if row else None
    check["bug_local_ratio"] = row.get("local_ratio") if row else None
    check["false_alarms"] = len([b for b in beyond if b != bug])
    if row is None:
        check["outcome"] = "missed (not exposed)"
    elif not row["verdict"].startswith("beyond"):
        check["outcome"] = "missed"
    elif worst == bug:
        check["outcome"] = "exact"
    else:
        check["outcome"] = "beyond, not worst"


def _fmt(v: Any, spec: str = ".1f") -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def table(checks: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    rows = []
    for c in checks:
        outcome = c.get("outcome") or f"{c.get('status', '?')}: {c.get('error', '')[:90]}"
        rows.append([c["model"], c["flow"], c["case"], c["layer"] or "", _fmt(c.get("effect"), ".2f"), outcome,
                     c.get("false_alarms", ""), c.get("worst") or "", _fmt(c.get("bug_sqnr_db")),
                     _fmt(c.get("bug_local_sqnr_db")), _fmt(c.get("bug_local_ratio"), ".2f"),
                     _fmt(c.get("max_other_local_ratio"), ".2f"), _fmt(c.get("output_sqnr_db")), c.get("layers", "")])
    return tabulate(rows, headers=["model", "flow", "case", "bug layer", "effect", "outcome", "false alarms",
                                   "worst layer", "bug SQNR dB", "bug local dB", "bug local ratio",
                                   "others' max local ratio", "output dB", "layers"])


def totals(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts over ``checks``, and the same per flow."""
    out = _counts(checks)
    flows = dict.fromkeys(c["flow"] for c in checks)
    out["by_flow"] = {f: _counts([c for c in checks if c["flow"] == f]) for f in flows}
    return out


def _counts(checks: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [c for c in checks if "outcome" in c]
    faults = [c for c in ran if c["case"] != "clean"]
    out = {"checks": len(checks), "ran": len(ran), "failed_to_run": len(checks) - len(ran),
           "clean_runs": len(ran) - len(faults), "clean_pass": sum(c["outcome"] == "pass" for c in ran),
           "clean_false_alarm_layers": sum(c["false_alarms"] for c in ran if c["case"] == "clean"),
           "faults": len(faults), "fault_false_alarm_layers": sum(c["false_alarms"] for c in faults)}
    for case in CASES[1:]:
        mine = [c for c in faults if c["case"] == case]
        out[case] = {k: sum(c["outcome"].startswith(k) for c in mine)
                     for k in ("exact", "beyond, not worst", "missed")}
    return out


# --- --suggest: which layers to keep float, verified by runs, at real size ---------------------

# model -> (builder, (the layer ruined, the layer whose dead unit it reads))
SUGGEST_MODELS: dict[str, tuple[Callable[[], tuple[torch.nn.Module, tuple]], tuple[str, str]]] = {
    "mlp-1024": (lambda: ex.tiny_mlp(hidden=1024, batch=512), ("fc2", "fc1"))}
SUGGEST_FLOWS = ("ort", "ort-dynamic", "ort-int4", "xnnpack")
# The faulty model's target: its clean version's output SQNR on the same flow, less this much
# (the dead unit changes the model a little; what is asked is the clean flow's quality back).
TARGET_MARGIN_DB = 3.0


def suggest_rows(model_name: str, flows: list[str], workdir: Path) -> list[dict[str, Any]]:
    """One row per (flow, case): the clean model by default target, the faulty one by default and by
    the clean output less ``TARGET_MARGIN_DB``."""
    build, (layer, producer) = SUGGEST_MODELS[model_name]
    specs = {f: FLOWS[f][2][0] for f in flows}
    rows: list[dict[str, Any]] = []

    def run(model, args, names, case, target=None):
        start = time.perf_counter()
        out = Path(tempfile.mkdtemp(prefix=f"{model_name}-", dir=workdir))
        result = xray.drift(model, args, [specs[f] for f in names], out, suggest_float=True, target_sqnr=target)
        seconds = round((time.perf_counter() - start) / len(names), 1)
        for f, b in zip(names, result.backends):
            row = {"model": model_name, "flow": f, "case": case, "seconds": seconds, "status": b.status}
            rows.append(row)
            if b.status != "OK":
                row["error"] = b.error[:200]
                continue
            s = b.quant["keep_float"]
            row.update(target=s["target"], found=s["found"], kept=s["layers"], share=s["param_share"],
                       before_db=s["before"]["output_sqnr_db"], runs=len(s["trials"]), search_s=s["seconds"],
                       after_db=(s["after"] or {}).get("output_sqnr_db"), beyond=s["before"]["beyond"])
        return result

    model, args = build()
    clean = run(model, args, flows, "clean")
    model = ex.dead_unit_outlier(build()[0], layer, producer)
    run(model, args, flows, f"outlier in {layer}")
    for f, b in zip(flows, clean.backends):
        if b.status == "OK" and isinstance(b.quant["output_sqnr_db"], float):
            run(model, args, [f], f"outlier in {layer}", round(b.quant["output_sqnr_db"] - TARGET_MARGIN_DB, 1))
    return rows


def suggest_table(rows: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    return tabulate([[r["model"], r["flow"], r["case"], r.get("target", r.get("error", r["status"])),
                      "+".join(r.get("kept") or []) or ("-" if r.get("found") else "not found"),
                      _fmt(100 * r["share"] if "share" in r else None) + ("%" if "share" in r else ""),
                      _fmt(r.get("before_db")), _fmt(r.get("after_db")), r.get("runs", ""), _fmt(r.get("search_s")),
                      r["seconds"]] for r in rows],
                    headers=["model", "flow", "case", "target", "kept float", "params", "output dB before",
                             "after", "runs", "search s", "drift s"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--flows", default=None, help=f"any of {', '.join(FLOWS)} (default {','.join(DEFAULT_FLOWS)}; "
                                                 f"with --suggest {','.join(SUGGEST_FLOWS)})")
    p.add_argument("--seed", type=int, default=0, help="draws the faulted layers")
    p.add_argument("--out", default=None, help="write the checks and totals as JSON here")
    p.add_argument("--suggest", action="store_true", help="run --suggest-float at real size (SUGGEST_MODELS)")
    a = p.parse_args(argv)
    if a.suggest:
        flows = a.flows.split(",") if a.flows else list(SUGGEST_FLOWS)
        unknown = [f for f in flows if f not in FLOWS]
        if unknown:
            p.error(f"unknown flows: {', '.join(unknown)} (flows: {', '.join(FLOWS)})")
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="bench-suggest-") as tmp:
            rows = [r for m in SUGGEST_MODELS for r in suggest_rows(m, flows, Path(tmp))]
        print(suggest_table(rows))
        print(f"{time.perf_counter() - start:.0f} s")
        if a.out:
            Path(a.out).write_text(json.dumps({"rows": rows, "seconds": round(time.perf_counter() - start)}, indent=1,
                                              default=str))
        return 0
    models, flows = a.models.split(","), (a.flows or ",".join(DEFAULT_FLOWS)).split(",")
    unknown = [m for m in models if m not in MODELS] + [f for f in flows if f not in FLOWS]
    if unknown:
        p.error(f"unknown: {', '.join(unknown)} (models: {', '.join(MODELS)}; flows: {', '.join(FLOWS)})")
    rng = random.Random(a.seed)
    # every model's layers are drawn, in one order, whichever run: a model's draw does not depend on --models
    plans = {m: plan(m, flows, rng) for m in MODELS}
    checks: list[dict[str, Any]] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        for m in models:
            mine = plans[m]
            print(f"[{time.perf_counter() - start:6.0f}s] {m}: {len(mine)} checks", file=sys.stderr, flush=True)
            run_model(m, mine, Path(tmp))
            checks.extend(mine)
            if a.out:  # written after every model: a crash keeps what was done
                Path(a.out).write_text(json.dumps({"checks": checks, "totals": totals(checks)}, indent=1, default=str))
    print(table(checks))
    t = totals(checks)
    print(json.dumps(t, indent=1))
    print(f"{time.perf_counter() - start:.0f} s")
    if a.out:
        Path(a.out).write_text(json.dumps({"checks": checks, "totals": t, "seed": a.seed,
                                           "seconds": round(time.perf_counter() - start)}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
