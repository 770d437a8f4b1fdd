"""Per-layer quantization error of a quantized drift run against the float eager reference.

Every captured node gets its accumulated error (relative L2 error and SQNR against eager) and
a budget under the run's scheme (``xray.numerics.quantization``): what its inputs brought, as
measured where the backend captured them (the op replayed on their captured values, where it
replays), plus what its own rounding should add. A node over budget is "beyond <scheme>"; since
the budget starts from the measured inputs, only the layer where the excess is born is beyond,
the layers after it carry it within their budgets.

Where the backend also runs each layer fed float inputs (ONNX Runtime's isolated run), every
weighted op (``mm``, ``addmm``, ``convolution`` on a parameter) is judged a second time, alone:
its local noise, the kernel's known rounding of its input taken out, against what the scheme's
rounding of its weights (and, static int8, of its output) predicts (``quantization.weight_error_alone``).
That catches what the accumulated budget's margin hides: one per-tensor weight scale where
per-channel was meant.
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..numerics import quantization as qn

def verdicts(scheme: str) -> tuple[str, str]:
    """("within <scheme>", "beyond <scheme>"): the verdict names a layer's budget by its scheme."""
    return f"within {scheme}", f"beyond {scheme}"


WITHIN, BEYOND = verdicts("int8")


def _beyond(row: dict[str, Any]) -> bool:
    return str(row.get("verdict", "")).startswith("beyond")

# The CSV columns (``DIR/quant-<backend>.csv``), declared once.
QUANT_COLUMNS = ["layer", "captured", "verdict", "sqnr_db", "rel_err", "added_nsr", "cost_db", "local_sqnr_db",
                 "local_ratio", "excess", "rms_steps", "allowed_steps", "expected_sqnr_db", "node", "keep_float"]


@dataclass
class QuantLayer:
    """One layer of a quantized run: its worst captured output against float eager."""

    layer: str
    captured: int = 0  # captured outputs of the layer's nodes
    verdict: str = WITHIN
    sqnr_db: float | None = None  # accumulated: the worst (lowest) SQNR of the layer's outputs
    rel_err: float | None = None  # accumulated: ||q - f|| / ||f||, the worst output
    added_nsr: float = 0.0  # what the layer itself added: measured NSR - the NSR its inputs brought
    cost_db: float = 0.0  # the SQNR the layer lost: SQNR(inputs brought) - SQNR(measured), its worst node
    rms_steps: float | None = None  # the worst node's RMS error, in its output's int8 steps
    allowed_steps: float | None = None  # the RMS error its budget allows, in the same steps
    expected_sqnr_db: float | None = None  # the model's expectation (inherited + own rounding) at that node
    node: str = ""  # the node those figures are of (the one furthest beyond, or the worst)
    excess: float = 0.0  # the worst measured / allowed of its nodes (accumulated, or local when judged)
    local_ratio: float | None = None  # fed float inputs: local noise / what int8 rounding predicts (worst op)


@dataclass
class QuantReport:
    """A quantized backend's per-layer error and verdict."""

    scheme: str
    layers: list[QuantLayer]
    worst: list[str]  # layers that cost the most (largest added NSR), worst first
    first_beyond: str | None  # the first layer (execution order) beyond int8 quantization
    output_sqnr_db: float | None  # the program's outputs
    nodes_judged: int = 0
    # weighted op -> what its own rounding predicts when it is fed float inputs (``_local_budget``)
    local_budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    # per user output: the NSR it may carry (allowed) and the model's expectation; where nothing was
    # captured (``captured={}``) this is the scheme's prediction from the float values alone
    output_budgets: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "worst": self.worst, "first_beyond": self.first_beyond,
                "output_sqnr_db": _finite(self.output_sqnr_db), "nodes_judged": self.nodes_judged,
                "margin": qn.MARGIN, "local_margin": qn.LOCAL_MARGIN, "local_budgets": self.local_budgets,
                "layers": [{k: _finite(v) for k, v in asdict(lr).items()} for lr in self.layers]}


def _finite(v: Any) -> Any:
    """JSON has no Infinity: non-finite numbers, in dicts and lists too, are written as strings."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _num(v: Any) -> float:
    """A figure read back from the JSON form (infinities are written as strings)."""
    return float(v) if isinstance(v, str) else v


def _kind(node: torch.fx.Node) -> str:
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0]


def _float_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    out: list[torch.fx.Node] = []

    def visit(a: Any) -> None:
        if isinstance(a, torch.fx.Node):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)

    visit(node.args)
    visit(list(node.kwargs.values()))
    return out


def _first_tensor(v: Any) -> torch.Tensor | None:
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
        return v[0]
    return None


def quant_report(program: torch.export.ExportedProgram, eager: dict[str, list[torch.Tensor]],
                 placeholders: dict[str, torch.Tensor], captured: dict[str, list[Any]],
                 layer_of_node: dict[str, str], scheme: str, outputs: tuple[list, list] | None = None) -> QuantReport:
    """Walk the reference program in order, budget and judge every captured node, fold per layer."""
    from torch.export.graph_signature import InputKind

    kinds = {s.arg.name: s.kind for s in program.graph_signature.input_specs}
    sch = qn.scheme(scheme)
    within_label, beyond_label = verdicts(scheme)
    # node -> (NSR allowed to reach it, NSR expected to reach it, its signal power); a captured
    # node carries its measured NSR as both
    carried: dict[str, tuple[float, float, float]] = {}
    layers: dict[str, QuantLayer] = {}
    worst_node: dict[str, tuple[float, float]] = {}  # layer -> (excess over allowed, added NSR) of its shown node
    judged = 0
    measured_nodes: dict[str, torch.Tensor] = {}  # node -> its captured value, read back
    local_budgets: dict[str, dict[str, Any]] = {}
    weights = {s.arg.name for s in program.graph_signature.input_specs
               if s.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)}
    parameters = set(weights)  # parameters and their views only (``weights`` also takes what is computed from them)
    for node in program.graph.nodes:
        if node.op == "placeholder":
            f = placeholders.get(node.name)
            if not isinstance(f, torch.Tensor) or not f.is_floating_point():
                continue
            power = float(f.detach().double().pow(2).mean()) if f.numel() else 0.0
            own = sch.output_nsr(f) if kinds.get(node.name) == InputKind.USER_INPUT else qn.weight_nsr(f, sch)
            carried[node.name] = (qn.MARGIN * own, own, power)
            continue
        if node.op != "call_function":
            continue
        f = _first_tensor(eager.get(node.name))
        if f is None or not f.is_floating_point():
            continue
        power = float(f.detach().double().pow(2).mean()) if f.numel() else 0.0
        kind = _kind(node)
        inputs = [i for i in _float_inputs(node) if i.name in carried]
        ins = [carried[i.name] for i in inputs]
        if kind == "getitem":
            ins = ins[:1]
        if kind in qn.NORMALIZATIONS and inputs and len(node.args) > 1:
            x = _first_tensor(eager.get(inputs[0].name)) if inputs[0].op != "placeholder" else placeholders.get(inputs[0].name)
            if isinstance(x, torch.Tensor):
                gain = qn.normalization_gain(x, len(node.args[1]))
                ins = [(a * gain, e * gain, p) for a, e, p in ins[:1]]
        if all(i.name in weights for i in inputs) and inputs:
            weights.add(node.name)  # a view of a weight (its transpose) is still a weight
        if inputs and kind in _VIEWS and all(i.name in parameters for i in inputs):
            parameters.add(node.name)
        if kind in qn.WEIGHTED:
            local = _local_budget(node, kind, f, eager, placeholders, kinds, sch)
            if local is not None:
                local_budgets[node.name] = {"layer": layer_of_node.get(node.name, "<root>"), **local}
        acts = _activation_values(inputs, parameters, eager, placeholders, measured_nodes)
        own = sch.output_nsr(f) + sch.input_nsr(kind, acts)
        gain = _elementwise_gain(node, kind, f, inputs, ins, eager, placeholders)
        inherited = qn.combine(kind, [(a, p) for a, _, p in ins], power, gain)
        expected = qn.combine(kind, [(e, p) for _, e, p in ins], power, gain)
        replayed = _replayed_nsr(node, f, inputs, measured_nodes, weights, eager, placeholders)
        if replayed is not None:
            # what the captured inputs bring, exactly, plus what the parameters' own rounding adds by
            # the rules; the rules stay a floor (a value captured before a rounding its reader applies)
            params = [(0.0, 0.0, c[2]) if i.name in measured_nodes else c for i, c in zip(inputs, ins)]
            inherited = max(inherited, replayed + qn.combine(kind, [(a, p) for a, _, p in params], power))
            expected = max(expected, replayed + qn.combine(kind, [(e, p) for _, e, p in params], power))
        budget = qn.Budget(inherited=inherited, expected_inherited=expected, own=own, step=qn.activation_step(f),
                           float_noise=sch.float_noise)
        inherited = budget.expected_inherited
        got = _first_tensor(captured.get(node.name))
        if got is None and kind == "getitem" and inputs and inputs[0].name in measured_nodes:
            got = _output_of(captured.get(inputs[0].name), node.args[1])  # a tuple's output, captured with it
        if got is None or tuple(got.shape) != tuple(f.shape) or not got.is_floating_point():
            carried[node.name] = (budget.allowed, budget.expected, power)
            continue
        measured = qn.nsr(f, got)
        carried[node.name] = (measured, measured, power)
        measured_nodes[node.name] = got
        judged += 1
        name = layer_of_node.get(node.name, "<root>")
        row = layers.setdefault(name, QuantLayer(name, verdict=within_label))
        row.captured += 1
        ok = qn.within(measured, budget)
        if not ok:
            row.verdict = beyond_label
        added = max(measured - inherited, 0.0)
        row.added_nsr = max(row.added_nsr, added)
        sq = qn.sqnr_db(measured)
        if row.sqnr_db is None or sq < row.sqnr_db:
            row.sqnr_db = sq
        rel = math.sqrt(measured) if math.isfinite(measured) else math.inf
        row.rel_err = rel if row.rel_err is None else max(row.rel_err, rel)
        excess = measured / budget.allowed if budget.allowed > 0 else (math.inf if measured > 0 else 0.0)
        if name not in worst_node or (excess, added) > worst_node[name]:
            worst_node[name] = (excess, added)
            row.node = node.name
            row.excess = excess
            row.cost_db = (0.0 if measured == 0 else qn.sqnr_db(inherited) - sq if inherited > 0 else math.inf)
            row.rms_steps = qn.rms_steps(f, got, budget.step)
            row.allowed_steps = (math.sqrt(budget.allowed * power) / budget.step) if budget.step > 0 else None
            row.expected_sqnr_db = qn.sqnr_db(budget.expected)
    ordered = list(layers.values())
    from torch.export.graph_signature import OutputKind

    output_budgets = [{"node": s.arg.name, "allowed_nsr": carried[s.arg.name][0], "expected_nsr": carried[s.arg.name][1]}
                      for s in program.graph_signature.output_specs
                      if s.kind == OutputKind.USER_OUTPUT and getattr(s.arg, "name", None) in carried]
    worst, first = _rank([asdict(lr) for lr in ordered])
    out_sqnr = None
    if outputs is not None:
        pairs = [(w, g) for g, w in zip(*outputs) if isinstance(w, torch.Tensor) and w.is_floating_point()
                 and isinstance(g, torch.Tensor) and g.numel() == w.numel()]
        if pairs:
            out_sqnr = min(qn.sqnr_db(qn.nsr(w, g.reshape(w.shape))) for w, g in pairs)
    return QuantReport(scheme=scheme, layers=ordered, worst=worst, first_beyond=first, output_sqnr_db=out_sqnr,
                       nodes_judged=judged, local_budgets=local_budgets, output_budgets=output_budgets)


def _rank(layers: list[dict[str, Any]]) -> tuple[list[str], str | None]:
    """(the three worst layers, the first beyond int8 in execution order). Worst: layers beyond
    int8 first, furthest beyond first; then the rest by the NSR they added themselves."""
    def key(lr: dict[str, Any]) -> tuple:
        beyond = _beyond(lr)
        return (not beyond, -_num(lr.get("excess") or 0.0) if beyond else 0.0, -lr["added_nsr"])

    worst = [lr["layer"] for lr in sorted(layers, key=key) if _beyond(lr) or lr["added_nsr"] > 0][:3]
    first = next((lr["layer"] for lr in layers if _beyond(lr)), None)
    return worst, first


def _output_of(values: Any, index: Any) -> torch.Tensor | None:
    if isinstance(values, (list, tuple)) and isinstance(index, int) and 0 <= index < len(values):
        v = values[index]
        return v if isinstance(v, torch.Tensor) else None
    return None


def _activation_values(inputs: list[torch.fx.Node], params: set[str], eager: dict[str, list[torch.Tensor]],
                       placeholders: dict[str, torch.Tensor],
                       measured: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(float value, the value the backend computed where it was captured, else the float one) of
    each of an op's inputs that is not a parameter or a view of one: what a dynamic kernel rounds
    (an embedding's output, computed from a weight alone, is an activation)."""
    out = []
    for i in inputs:
        if i.name in params:
            continue
        v = placeholders.get(i.name) if i.op == "placeholder" else _first_tensor(eager.get(i.name))
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            got = measured.get(i.name)
            out.append((v, got if isinstance(got, torch.Tensor) and got.shape == v.shape else v))
    return out


def _replayed_nsr(node: torch.fx.Node, f: torch.Tensor, inputs: list[torch.fx.Node],
                  measured_nodes: dict[str, torch.Tensor], weights: set[str], eager: dict[str, list[torch.Tensor]],
                  placeholders: dict[str, torch.Tensor]) -> float | None:
    """The NSR the op's captured inputs bring to its output, exactly: the op replayed in float64 on
    them (every other operand at its float value) against its float output. None unless at least
    one input was captured and every other float input is a placeholder or a view of a weight (a
    parameter, whose own rounding the caller adds by the rules), or when the op does not replay.

    No propagation rule holds for every op: a layer norm raises a row's NSR by that row's mean
    square over its variance (ViT's class token, a row of small variance, takes far more than
    the mean), a ``select`` of that row keeps its NSR, not the tensor's; the replay needs neither."""
    if _kind(node) == "getitem" or not any(i.name in measured_nodes for i in inputs) or any(
            i.name not in measured_nodes and i.op != "placeholder" and i.name not in weights for i in inputs):
        return None

    def value(n: torch.fx.Node) -> Any:
        if n.name in measured_nodes:
            v = measured_nodes[n.name]
        elif n.op == "placeholder":
            v = placeholders.get(n.name)
        else:
            vals = eager.get(n.name)
            v = vals[0] if isinstance(vals, (list, tuple)) and len(vals) == 1 else None
        if not isinstance(v, torch.Tensor):
            raise LookupError(n.name)
        return v.detach().double() if v.is_floating_point() else v

    def sub(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return value(a)
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x) for x in a)
        return a

    try:
        out = _first_tensor(node.target(*sub(node.args), **{k: sub(v) for k, v in node.kwargs.items()}))
    except Exception:  # noqa: BLE001 - an op that does not replay on these values is left to the rules
        return None
    if out is None or tuple(out.shape) != tuple(f.shape) or not out.is_floating_point():
        return None
    return qn.nsr(f, out)


_TRANSPOSES = frozenset({"permute", "t", "transpose"})
_VIEWS = _TRANSPOSES | {"view", "reshape", "_unsafe_view", "expand", "unsqueeze", "squeeze", "clone", "_to_copy"}


def _elementwise_gain(node: torch.fx.Node, kind: str, f: torch.Tensor, inputs: list[torch.fx.Node],
                      ins: list[tuple[float, float, float]], eager: dict[str, list[torch.Tensor]],
                      placeholders: dict[str, torch.Tensor]) -> float | None:
    """The NSR gain of a one-input op with an output of its input's shape, measured at its float
    input (``quantization.elementwise_gain``), or None for any other op."""
    if kind in qn.PRODUCTS or kind in qn.SUMS or kind in qn.NORMALIZATIONS or len(inputs) != 1 or not ins:
        return None
    src = inputs[0]
    x = placeholders.get(src.name) if src.op == "placeholder" else _first_tensor(eager.get(src.name))
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or tuple(x.shape) != tuple(f.shape):
        return None
    if sum(isinstance(a, torch.fx.Node) for a in _float_inputs(node)) != 1:
        return None

    def call(value: torch.Tensor) -> Any:
        args = tuple(value if a is src else a for a in node.args)
        return node.target(*args, **node.kwargs)

    return qn.elementwise_gain(x, call, ins[0][0])


def _local_budget(node: torch.fx.Node, kind: str, f: torch.Tensor, eager: dict[str, list[torch.Tensor]],
                  placeholders: dict[str, torch.Tensor], kinds: dict[str, Any],
                  sch: qn.Scheme) -> dict[str, Any] | None:
    """What a weighted op's own rounding (the scheme's) predicts for its local error, or None when
    it reads no parameter (an attention ``mm`` of two activations) or its operands cannot be read."""
    from torch.export.graph_signature import InputKind

    if kind == "convolution":
        x, w, conv_args = node.args[0], node.args[1], tuple(node.args[3:9])
    else:
        x, w, conv_args = node.args[-2], node.args[-1], ()
    flips = 0
    while isinstance(w, torch.fx.Node) and w.op == "call_function" and _kind(w) in _TRANSPOSES:
        w, flips = w.args[0], flips + 1
    if not isinstance(w, torch.fx.Node) or not isinstance(x, torch.fx.Node) or w.op != "placeholder":
        return None
    if kinds.get(w.name) not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
        return None
    weight = placeholders.get(w.name)
    user = x.op == "placeholder" and kinds.get(x.name) == InputKind.USER_INPUT
    xv = placeholders.get(x.name) if x.op == "placeholder" else _first_tensor(eager.get(x.name))
    if not isinstance(weight, torch.Tensor) or not isinstance(xv, torch.Tensor) or not xv.is_floating_point():
        return None
    if kind != "convolution" and (flips != 1 or weight.dim() != 2 or xv.dim() != 2 or xv.shape[1] != weight.shape[1]):
        return None
    try:
        # the input's rounding counts even when it is fed float: ONNX Runtime's isolated run was
        # measured to requantize a float input before its int8 kernel (fc2 of tiny_mlp: its local
        # noise is that of x rounded at its own step, not of x)
        w_noise, x_noise = qn.local_noise_power(kind, xv, weight, conv_args, input_step=qn.activation_step(xv),
                                                sch=sch)
    except Exception:  # noqa: BLE001 - an op whose operands do not fit the model is not judged alone
        return None
    return {"input": x.name, "input_user": user, "weight": w.name, "kind": kind, "conv_args": list(conv_args),
            "input_step": qn.activation_step(xv), "weight_noise": w_noise, "input_noise": x_noise,
            "float_step": qn.activation_step(f), "elements": f.numel(), "signal": float(f.detach().double().pow(2).sum())}


def local_sqnr(report: dict[str, Any], isolated: dict[str, list[Any]], eager: dict[str, list[torch.Tensor]],
               layer_of_node: dict[str, str], placeholders: dict[str, torch.Tensor]) -> None:
    """Each layer's SQNR when it is fed float (eager) inputs (the backend's isolated run): what its
    own quantization costs, without what it inherits. Written into ``report``'s layers; a weighted
    op whose local noise exceeds what its own rounding predicts (``_judge_local``) puts its layer
    beyond int8."""
    worst: dict[str, float] = {}
    for node, got in isolated.items():
        g, f = _first_tensor(got), _first_tensor(eager.get(node))
        if g is None or f is None or tuple(g.shape) != tuple(f.shape) or not g.is_floating_point():
            continue
        layer = layer_of_node.get(node, "<root>")
        worst[layer] = min(worst.get(layer, math.inf), qn.sqnr_db(qn.nsr(f, g)))
    for row in report["layers"]:
        if row["layer"] in worst:
            row["local_sqnr_db"] = _finite(worst[row["layer"]])
    _judge_local(report, isolated, eager, placeholders)


def _judge_local(report: dict[str, Any], isolated: dict[str, list[Any]], eager: dict[str, list[torch.Tensor]],
                 placeholders: dict[str, torch.Tensor]) -> None:
    """Judge each weighted op fed float inputs against its predicted rounding noise.

    Its activation input must have been fed from eager (cut: captured) or be a user input. How
    the kernel rounded that input is a known error (``quantization.weight_error_alone``), taken
    out of the measured one: what is judged is the weights' rounding, against what per-channel
    int8 predicts, and the output's, counted at the step of the int8 grid its value lies on (none
    for a value read before its quantize); a small tensor whose values all differ gets the step
    its float range gives. Where the operands cannot be read, the input's rounding is predicted
    as noise at its per-tensor step instead."""
    rows = {lr["layer"]: lr for lr in report["layers"]}
    sch = qn.scheme(report["scheme"])
    for node, b in (report.get("local_budgets") or {}).items():
        g, f = _first_tensor(isolated.get(node)), _first_tensor(eager.get(node))
        if g is None or f is None or tuple(g.shape) != tuple(f.shape) or not g.is_floating_point():
            continue
        if not b["input_user"] and b["input"] not in isolated:
            continue  # its input was not fed float: what it inherited is mixed into its local error
        step = qn.grid_step(g) if sch.activations == "static" else None  # other schemes' outputs stay float
        if step is None and g.numel() <= 256 and sch.activations == "static":
            step = b["float_step"]
        rounding = (step or 0.0) ** 2 / 12.0 * g.numel()
        err = g.detach().double() - f.detach().double()
        noise, predicted = float(err.pow(2).sum()), b["weight_noise"] + b["input_noise"] + rounding
        x = placeholders.get(b["input"]) if b["input_user"] else _first_tensor(eager.get(b["input"]))
        w = placeholders.get(b.get("weight", ""))
        spread = None
        if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor):
            try:
                noise, weight_noise, b["input_rounding"] = qn.weight_error_alone(
                    b["kind"], err, x, w, tuple(b["conv_args"]), b["input_step"], sch)
                predicted = weight_noise + rounding
                spread = qn.prediction_spread(b["kind"], x, w, sch)
            except (RuntimeError, ValueError):  # operands that do not fit: the input's rounding as noise
                pass
        ratio = noise / predicted if predicted > 0 else (math.inf if noise > 0 else 0.0)
        margin = qn.local_margin(predicted, spread)
        b["measured_noise"], b["output_step"], b["ratio"], b["margin"] = noise, step, _finite(ratio), margin
        row = rows.get(b["layer"])
        if row is None:
            continue
        if row.get("local_ratio") is None or ratio > _num(row["local_ratio"]):
            row["local_ratio"] = _finite(ratio)
        if ratio > margin:
            excess = ratio / margin
            if not _beyond(row) or excess > _num(row.get("excess") or 0.0):
                row["excess"], row["node"] = _finite(excess), node
            row["verdict"] = verdicts(report["scheme"])[1]
    report["worst"], report["first_beyond"] = _rank(report["layers"])


def write_quant_csv(report: dict[str, Any], path: Path) -> None:
    """``report`` (``QuantReport.to_json``, local SQNRs added) as one CSV row per layer."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(QUANT_COLUMNS)
        for lr in report["layers"]:
            w.writerow([_cell(lr.get(c)) for c in QUANT_COLUMNS])


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v
