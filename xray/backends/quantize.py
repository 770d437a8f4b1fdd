"""Static int8 quantization flows, as their authors run them: PT2E with ExecuTorch's XNNPACK
quantizer (``executorch-*:quant=int8``) and ONNX Runtime's ``quantize_static`` in QDQ format
(``onnxrt-cpu:quant=int8``). Both calibrate on the inputs drift runs the model on.

Each flow keeps the quantized graph's values tied to the float reference program's nodes: a
quantize -> dequantize pair after a node stands for that node (its dequantized value is what
the next layer reads), so drift compares what the deployed model carries between layers.
"""
from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import torch

from .base import BackendError, ReplayStatus, short_error

SCHEMES = ("int8",)
QUANT_OPTION = "int8: static int8 (per-channel symmetric weights, per-tensor activations), calibrated on the run's inputs"

_Q_OPS = ("quantize_per_tensor", "quantize_per_channel")
_FUSED_ACTIVATIONS = ("Relu", "Clip")
_DQ_OPS = ("dequantize_per_tensor", "dequantize_per_channel")


def check_scheme(value: Any) -> str:
    if value not in SCHEMES:
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"quant={value!r} is not a known scheme (known: {', '.join(SCHEMES)})")
    return value


# --- PT2E (ExecuTorch) ---------------------------------------------------------------------

def pt2e_int8(source: torch.export.ExportedProgram, args: tuple, kwargs: dict,
              facts: dict[str, Any]) -> tuple[torch.fx.GraphModule, dict[str, str]]:
    """``source`` (the program before core-ATen decompositions: the quantizer annotates
    ``aten.linear``/``aten.conv2d``) prepared with the XNNPACK quantizer (static, per-channel
    symmetric int8 weights), calibrated on ``args``, converted. Returns the converted module and
    converted node name -> the source node whose value it carries (a node itself, or the
    dequantize of a quantize -> dequantize pair after it)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    class _Quantizer(XNNPACKQuantizer):
        def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            return _float_scalars_to_attrs(model)

    start = time.perf_counter()
    try:
        quantizer = _Quantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(source.module(), quantizer)
        prepared(*args, **kwargs)  # calibration: the observers see the run's own inputs
        converted = convert_pt2e(prepared)
    except Exception as e:  # noqa: BLE001 - the quantizer's error is the result
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"PT2E int8 (XNNPACKQuantizer): {short_error(e)}") from e
    facts["quantize_s"] = round(time.perf_counter() - start, 4)
    names = {n.name for n in source.graph.nodes}
    carries: dict[str, str] = {}
    counts = {"q": 0, "dq": 0}
    for node in converted.graph.nodes:
        if node.name in names:
            carries[node.name] = node.name
        op = _op(node)
        if op in _DQ_OPS:
            counts["dq"] += 1
            q = node.args[0] if node.args else None
            if isinstance(q, torch.fx.Node) and _op(q) in _Q_OPS and q.args and isinstance(q.args[0], torch.fx.Node):
                if q.args[0].name in names:
                    carries[node.name] = q.args[0].name
        elif op in _Q_OPS:
            counts["q"] += 1
    facts.update(quant="int8 PT2E XNNPACKQuantizer (static, per-channel weights)", calibration_batches=1,
                 quantize_nodes=counts["q"], dequantize_nodes=counts["dq"])
    if not counts["q"]:
        raise BackendError(ReplayStatus.EXPORT_FAIL, "PT2E int8: the XNNPACK quantizer annotated no op of this model "
                           "(it quantizes linear, conv, add, mul, cat, pooling)")
    return converted, carries


def int8_or_float(quantize, facts: dict[str, Any]) -> Any | None:
    """``quantize()``'s int8 program, or None where the quantizer left the op alone (no quantize
    node: it runs, and is judged, in float); ``facts["quantized"]`` says which. Any other failure
    is raised."""
    try:
        out = quantize()
    except BackendError:
        if facts.get("quantize_nodes") != 0:
            raise
        facts["quantized"] = False
        return None
    facts["quantized"] = True
    return out


def _float_scalars_to_attrs(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The XNNPACK quantizer's own preparation (scalars of ``add``/``mul`` made tensor
    attributes, so the quantizer can annotate them), on float ops only. ExecuTorch 1.5.1's
    ``_convert_scalars_to_attrs`` makes every scalar a float32 tensor, integer index arithmetic
    included: transformers' Llama computes its mask's indices as ``arange + 0``, which turns into a
    float tensor, and ``aten.index`` fails in calibration (IndexError: tensors used as indices
    must be long, int, byte or bool tensors). Integer ops are never quantized: they keep their scalars."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import _convert_scalars_to_attrs

    held = []
    for n in model.graph.nodes:
        val = n.meta.get("val")
        if (n.op == "call_function" and n.target in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)
                and isinstance(val, torch.Tensor) and not val.dtype.is_floating_point):
            held.append((n, n.target))
            n.target = torch.ops.aten.add.Scalar if n.target is torch.ops.aten.add.Tensor else torch.ops.aten.mul.Scalar
    model = _convert_scalars_to_attrs(model)  # skips the ops held aside (their targets differ)
    for n, target in held:
        n.target = target
    model.recompile()
    return model


def _op(node: torch.fx.Node) -> str:
    target = getattr(node, "target", None)
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def source_to_reference(program: torch.export.ExportedProgram) -> dict[str, list[str]]:
    """Source node name -> the reference program's nodes decomposed from it (``from_node``'s
    first entry names the node of the program ``run_decompositions`` started from)."""
    out: dict[str, list[str]] = {}
    for node in program.graph.nodes:
        if node.op == "placeholder":
            out.setdefault(node.name, []).append(node.name)
            continue
        for src in node.meta.get("from_node") or []:
            out.setdefault(src.name, []).append(node.name)
    return out


# --- ONNX Runtime QDQ ----------------------------------------------------------------------

def ort_int8(proto: Any, feeds: list[dict[str, np.ndarray]], facts: dict[str, Any]) -> Any:
    """``proto`` quantized by ``onnxruntime.quantization.quantize_static`` (QDQ, int8 activations
    and per-channel int8 weights), calibrated on ``feeds``; then each activation's Q -> DQ pair
    is made to carry the value's name (see ``_dq_carries_name``)."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    start = time.perf_counter()
    folded = _fold_weight_transposes(proto)
    with tempfile.TemporaryDirectory(prefix="xray-qdq-") as tmp:
        src, dst = Path(tmp, "float.onnx"), Path(tmp, "int8.onnx")
        onnx.save(folded, str(src))
        try:
            quantize_static(str(src), str(dst), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                            extra_options={"QDQKeepRemovableActivations": True})
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"onnxruntime quantize_static: {short_error(e)}") from e
        quantized = onnx.load(str(dst))
    pairs = _dq_carries_name(quantized)
    ops = [n.op_type for n in quantized.graph.node]
    facts.update(quant="int8 onnxruntime quantize_static (QDQ, per-channel weights)", calibration_batches=len(feeds),
                 quantize_nodes=ops.count("QuantizeLinear"), dequantize_nodes=ops.count("DequantizeLinear"),
                 quantized_activations=pairs, quantize_s=round(time.perf_counter() - start, 4))
    if not ops.count("QuantizeLinear"):
        raise BackendError(ReplayStatus.EXPORT_FAIL, "quantize_static quantized no tensor of this model")
    return quantized


def _fold_weight_transposes(proto: Any) -> Any:
    """Transpose(initializer) folded into an initializer of the Transpose's output name.

    The exporter writes ``linear`` as ``Transpose(weight) -> Gemm``; quantize_static sees the
    transposed weight as an activation and would quantize it per tensor, with calibrated ranges.
    Folded, it is a weight again (per-channel); the initializer keeps the program node's name,
    which ``onnx_capture.plan`` maps like any folded constant."""
    from onnx import numpy_helper

    model = copy.deepcopy(proto)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    users: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            users[i] = users.get(i, 0) + 1
    keep = []
    for n in g.node:
        if n.op_type == "Transpose" and len(n.input) == 1 and n.input[0] in inits:
            perm = next((list(a.ints) for a in n.attribute if a.name == "perm"), None)
            arr = numpy_helper.to_array(inits[n.input[0]])
            g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(np.transpose(arr, perm)), n.output[0]))
            continue
        keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    return model


def _dq_carries_name(model: Any) -> int:
    """Rename so each quantized activation's DequantizeLinear output carries the value's own name
    (and the producer's metadata): drift then captures what the next node reads, the int8 value.

    ``P -> v -> Q -> DQ -> v_DequantizeLinear_Output -> consumers`` becomes
    ``P -> v__float -> Q -> DQ -> v -> consumers``; consumers that read the float ``v`` read
    ``v__float``, so the model computes exactly what it did."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    renamed = 0
    for dq in list(g.node):
        if dq.op_type != "DequantizeLinear":
            continue
        q = producer.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear":
            continue
        v = q.input[0]
        p = producer.get(v)
        if p is None or not len(p.metadata_props):
            continue
        readers = consumers.get(dq.output[0], [])
        if readers and all(c.op_type in _FUSED_ACTIVATIONS for c in readers):
            # quantized with its activation's range (Gemm -> Q -> DQ -> Relu: negatives clip to 0,
            # as the fused kernel computes): the node's own value is the float one before Q
            continue
        if dq.output[0] in outputs and v.endswith("_QuantizeLinear_Input"):
            pass  # a graph output: the quantizer already gave the DQ the output's name
        elif v in outputs:
            continue
        else:
            old = dq.output[0]
            floated = f"{v}__float"
            for out_i, o in enumerate(p.output):
                if o == v:
                    p.output[out_i] = floated
            for c in consumers.get(v, []):
                for k, name in enumerate(c.input):
                    if name == v:
                        c.input[k] = floated
            for c in consumers.get(old, []):
                for k, name in enumerate(c.input):
                    if name == old:
                        c.input[k] = v
            dq.output[0] = v
            for vi in g.value_info:
                if vi.name == v:
                    vi.name = floated
        del dq.metadata_props[:]
        dq.metadata_props.extend(copy.deepcopy(list(p.metadata_props)))
        renamed += 1
    return renamed
