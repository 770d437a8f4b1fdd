"""Quantization flows, as their authors run them: PT2E with ExecuTorch's XNNPACK quantizer
(``executorch-*:quant=int8|int8-dynamic``) and ONNX Runtime's ``quantize_static`` in QDQ format,
``quantize_dynamic`` and the blockwise ``MatMulNBitsQuantizer`` (``onnxrt-cpu:quant=int8|int8-dynamic|int4``).
Static int8 calibrates on the inputs drift runs the model on; the others need no calibration.
Core ML's weight quantization lives with its backend (``coreml.py``).

Each flow keeps the quantized graph's values tied to the float reference program's nodes: a
quantize -> dequantize pair after a node stands for that node (its dequantized value is what
the next layer reads), so drift compares what the deployed model carries between layers.

``keep_float`` (module names) leaves layers unquantized with each library's own mechanism: ONNX
Runtime's ``nodes_to_exclude`` (the ONNX nodes the exporter scoped under those modules), the
XNNPACK quantizer's filter function (``get_module_name_filter``, the test its per-module
configuration uses).
"""
from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import torch

from ..numerics.quantization import SCHEMES as RULES
from .base import BackendError, ReplayStatus, short_error

SCHEMES = tuple(RULES)  # every scheme's name; each backend runs the ones below
ORT_SCHEMES = ("int8", "int8-dynamic", "int4")
PT2E_SCHEMES = ("int8", "int8-dynamic")
COREML_SCHEMES = ("int8-weights", "int4")

_Q_OPS = ("quantize_per_tensor", "quantize_per_channel")
_FUSED_ACTIVATIONS = ("Relu", "Clip")
_DQ_OPS = ("dequantize_per_tensor", "dequantize_per_channel")


def quant_option(schemes: tuple[str, ...]) -> str:
    """The ``quant`` option's help: each scheme a backend runs and what it rounds."""
    return "; ".join(f"{s}: {RULES[s].summary}" for s in schemes)


KEEP_FLOAT_OPTION = ("modules the quantizer leaves in float, '+' between names (e.g. fc2+layers.0.mlp); "
                     "a module's submodules stay float with it")


def float_layers(value: Any) -> tuple[str, ...]:
    """The ``keep_float`` option as module names (a '+'-separated string, or a sequence); a
    module named by a number (a Sequential's ``0``) arrives parsed as one."""
    if value is None or value == "":
        return ()
    names = value.split("+") if isinstance(value, str) else [value] if isinstance(value, (int, float)) else value
    return tuple(dict.fromkeys(str(n).strip() for n in names if str(n).strip()))


def _no_such_layers(missing: list[str], where: str) -> BackendError:
    return BackendError(ReplayStatus.EXPORT_FAIL, f"keep_float: no module named {', '.join(map(repr, missing))} "
                        f"in {where} (name modules as model.named_modules() does)")


def check_scheme(value: Any, schemes: tuple[str, ...] = SCHEMES) -> str:
    """``value`` if it is one of ``schemes``, else one line naming them."""
    if value not in schemes:
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"quant={value!r} is not a scheme this flow runs "
                           f"(it runs: {', '.join(schemes)})")
    return value


# --- PT2E (ExecuTorch) ---------------------------------------------------------------------

def pt2e_quantize(source: torch.export.ExportedProgram, args: tuple, kwargs: dict, facts: dict[str, Any],
                  scheme: str = "int8", keep_float: tuple[str, ...] = ()) -> tuple[torch.fx.GraphModule, dict[str, str]]:
    """``source`` (the program before core-ATen decompositions: the quantizer annotates
    ``aten.linear``/``aten.conv2d``) prepared with the XNNPACK quantizer (per-channel symmetric
    int8 weights; ``int8``: static activations, ``int8-dynamic``: ``is_dynamic``, activations
    quantized at run time), run on ``args`` (static: its calibration), converted. Returns the
    converted module and converted node name -> the source node whose value it carries (a node
    itself, or the dequantize of a static quantize -> dequantize pair after it). ``keep_float``:
    modules the quantizer annotates nothing in (``_float_filter``)."""
    check_scheme(scheme, PT2E_SCHEMES)
    dynamic = scheme == "int8-dynamic"
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    class _Quantizer(XNNPACKQuantizer):
        def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            return _float_scalars_to_attrs(model)

    start = time.perf_counter()
    try:
        quantizer = _Quantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic))
        module = source.module()
        if keep_float:
            quantizer.set_filter_function(_float_filter(module, keep_float))
        prepared = prepare_pt2e(module, quantizer)
        prepared(*args, **kwargs)  # calibration: the observers see the run's own inputs
        converted = convert_pt2e(prepared)
    except BackendError:
        raise
    except Exception as e:  # noqa: BLE001 - the quantizer's error is the result
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"PT2E {scheme} (XNNPACKQuantizer): {short_error(e)}") from e
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
            # a dynamic pair (its scale a node: chosen at run time) rounds inside the kernel that
            # reads it; the value itself stays float, and is its own node's
            if (isinstance(q, torch.fx.Node) and _op(q) in _Q_OPS and q.args and isinstance(q.args[0], torch.fx.Node)
                    and not isinstance(q.args[1], torch.fx.Node)):
                if q.args[0].name in names:
                    carries[node.name] = q.args[0].name
        elif op in _Q_OPS:
            counts["q"] += 1
    facts.update(quant=f"{scheme} PT2E XNNPACKQuantizer ({'dynamic' if dynamic else 'static'}, per-channel weights)",
                 calibration_batches=0 if dynamic else 1, quantize_nodes=counts["q"], dequantize_nodes=counts["dq"])
    if keep_float:
        facts["kept_float"] = list(keep_float)
        inside = _float_filter(converted, keep_float)
        missed = [n.name for n in converted.graph.nodes if n.op == "call_function" and not inside(n)
                  and _op(n) in ("linear", "conv1d", "conv2d") and len(n.args) > 1
                  and isinstance(n.args[1], torch.fx.Node) and _op(n.args[1]) in _DQ_OPS]
        if missed:
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"keep_float: PT2E {scheme} quantized the weights of "
                               f"{', '.join(missed)} although their modules were excluded")
    if not counts["q"] and not keep_float:  # every layer kept float is a float model, asked for
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"PT2E {scheme}: the XNNPACK quantizer annotated no op of this "
                           "model (it quantizes linear, conv, add, mul, cat, pooling; dynamic: linear)")
    return converted, carries


def _float_filter(module: torch.fx.GraphModule, keep: tuple[str, ...]):
    """The XNNPACK quantizer's filter function (it annotates only the nodes it accepts) refusing
    every node inside a ``keep`` module, by torchao's own test of a node's module
    (``get_module_name_filter``: the names on its ``nn_module_stack``, submodules included).
    ``set_module_name(name, None)`` would say the same, but the quantizer asserts a config there."""
    from torchao.quantization.pt2e.quantizer import get_module_name_filter

    inside = [get_module_name_filter(name) for name in keep]
    nodes = [n for n in module.graph.nodes if n.op == "call_function"]
    missing = [name for name, f in zip(keep, inside) if not any(f(n) for n in nodes)]
    if missing:
        raise _no_such_layers(missing, "the exported program")
    return lambda n: not any(f(n) for f in inside)


def quantized_or_float(quantize, facts: dict[str, Any]) -> Any | None:
    """``quantize()``'s quantized program, or None where the quantizer left the op alone (no quantize
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


# --- ONNX Runtime ---------------------------------------------------------------------------

def ort_quantize(proto: Any, feeds: list[dict[str, np.ndarray]], facts: dict[str, Any], scheme: str = "int8",
                 keep_float: tuple[str, ...] = ()) -> Any:
    """``proto`` quantized by ONNX Runtime's own tool for ``scheme`` (weight transposes folded
    first, see ``_fold_weight_transposes``): ``int8``: ``quantize_static`` (QDQ, per-tensor int8
    activations calibrated on ``feeds``, per-channel int8 weights), each activation's Q -> DQ pair
    then carrying the value's name (``_dq_carries_name``); ``int8-dynamic``: ``quantize_dynamic``
    (MatMul as DynamicQuantizeLinear -> MatMulInteger, per-channel int8 weights); ``int4``:
    ``MatMulNBitsQuantizer`` (MatMulNBits, symmetric int4 weights in blocks of 32, float
    activations). The nodes that replace an exported node carry its metadata (``_restamp``).
    ``keep_float``: modules whose ONNX nodes each quantizer is told to exclude (``onnx_nodes_in``)."""
    check_scheme(scheme, ORT_SCHEMES)
    start = time.perf_counter()
    folded = _fold_weight_transposes(proto)
    flow = {"int8": _ort_static, "int8-dynamic": _ort_dynamic, "int4": _ort_int4}[scheme]
    exclude = onnx_nodes_in(folded, keep_float)
    if keep_float:
        facts.update(kept_float=list(keep_float), excluded_nodes=len(exclude))
    try:
        quantized, what, counted = flow(folded, feeds, facts, exclude)
    except BackendError:
        raise
    except Exception as e:  # noqa: BLE001 - the quantizer's error is the result
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"onnxruntime {scheme} quantization: {short_error(e)}") from e
    quantized_anyway = _not_left_float(folded, quantized, exclude)
    if quantized_anyway:
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"keep_float: onnxruntime {scheme} quantized "
                           f"{', '.join(quantized_anyway)} although it was excluded")
    if scheme != "int8":
        _restamp(folded, quantized)
    ops = [n.op_type for n in quantized.graph.node]
    facts.update(quant=f"{scheme} onnxruntime {what}", quantize_nodes=ops.count(counted),
                 dequantize_nodes=ops.count("DequantizeLinear"), quantize_s=round(time.perf_counter() - start, 4))
    if not ops.count(counted) and not keep_float:  # every layer kept float is a float model, asked for
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"onnxruntime {scheme}: {what} quantized no op of this model")
    return quantized


def _saved(model: Any, tmp: str, name: str) -> str:
    import onnx

    path = f"{tmp}/{name}"
    onnx.save(model, path)
    return path


# ONNX Runtime's session optimizer WeightBiasQuantization quantizes the float weight of a Gemm or
# Conv read from a per-tensor DequantizeLinear whose output path reaches a QuantizeLinear, per
# tensor: a layer excluded from quantize_static between quantized layers would run int8 again,
# with one scale (an outlier's). Sessions of a model with layers kept float disable it; a
# deployment of that model must too (``InferenceSession(..., disabled_optimizers=[...])``).
ORT_FLOAT_KEEPING = ("WeightBiasQuantization",)

# The exporter's record of the modules a node was traced in: ['', 'encoder', ..., 'encoder.layer.0.output.dense', 'addmm']
ONNX_SCOPES = "pkg.torch.onnx.name_scopes"


def onnx_nodes_in(model: Any, modules: tuple[str, ...]) -> list[str]:
    """The names of the ONNX nodes the exporter traced inside any of ``modules`` (or their
    submodules); a module with no node is refused (``BackendError``)."""
    import ast

    found: dict[str, list[str]] = {m: [] for m in modules}
    if not modules:
        return []
    for n in model.graph.node:
        scopes = next((p.value for p in n.metadata_props if p.key == ONNX_SCOPES), None)
        if scopes is None:
            continue
        inside = set(ast.literal_eval(scopes)[:-1])  # the last entry names the node itself
        for m in modules:
            if m in inside:
                found[m].append(n.name)
    missing = [m for m, names in found.items() if not names]
    if missing:
        raise _no_such_layers(missing, "the exported ONNX graph")
    return list(dict.fromkeys(name for names in found.values() for name in names))


_WEIGHTED_ONNX = ("Gemm", "MatMul", "Conv")


def _not_left_float(folded: Any, quantized: Any, exclude: list[str]) -> list[str]:
    """The excluded weighted nodes a quantizer quantized anyway: each must still run, under its
    name or the name of the MatMul a Gemm is split into, reading no DequantizeLinear weight (a
    node reading two activations may read a dequantized one: its neighbours quantize it)."""
    nodes = {n.name: n for n in quantized.graph.node}
    producer = {o: n for n in quantized.graph.node for o in n.output}
    weights = {i.name for i in folded.graph.initializer}
    missed = []
    for n in folded.graph.node:
        if n.name not in exclude or n.op_type not in _WEIGHTED_ONNX or len(n.input) < 2 or n.input[1] not in weights:
            continue
        kept = [nodes[m] for m in (n.name, f"{n.name}_MatMul", f"{n.name}__matmul")
                if m in nodes and nodes[m].op_type in _WEIGHTED_ONNX]
        if not kept or any(getattr(producer.get(i), "op_type", "") == "DequantizeLinear" for k in kept
                           for i in k.input[1:2]):
            missed.append(n.name)
    return missed


# Where an int8 initializer may be stored as uint8 + 128 with the same meaning (op type: the input
# positions): quantized values and zero points of (de)quantize ops, integer matmul operands
_INT8_OPERANDS = {"DequantizeLinear": (0, 2), "QuantizeLinear": (2,), "MatMulInteger": (0, 1, 2, 3)}


def as_uint8(model: Any, facts: dict[str, Any]) -> Any:
    """``model`` (ONNX Runtime's int8 result) with its int8 weights and zero points stored as
    uint8, value + 128 and zero point + 128: every dequantized value is unchanged, so the scheme,
    its grid and its budget are int8's. ONNX Runtime then multiplies uint8 x uint8, which every
    CPU sums exactly. Its uint8 x int8 kernel does not on x86 without VNNI: it adds products in
    pairs with VPMADDUBSW, capped at int16 (a layer measured 22 dB where int8 gives about 42), a loss of
    that CPU, not of int8; where int8 sums exactly, both storages compute the same numbers."""
    from onnx import TensorProto, numpy_helper

    uses: dict[str, list[tuple[str, int]]] = {}
    for n in model.graph.node:
        for i, name in enumerate(n.input):
            uses.setdefault(name, []).append((n.op_type, i))
    converted = 0
    for init in model.graph.initializer:
        readers = uses.get(init.name, [])
        if init.data_type != TensorProto.INT8 or not readers \
                or not all(i in _INT8_OPERANDS.get(op, ()) for op, i in readers):
            continue
        shifted = numpy_helper.to_array(init).astype(np.int16) + 128
        init.CopyFrom(numpy_helper.from_array(shifted.astype(np.uint8), init.name))
        converted += 1
    # quantized activations' declared int8 types follow their zero points now: let ORT infer them
    kept = [v for v in model.graph.value_info if v.type.tensor_type.elem_type != TensorProto.INT8]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    facts["int8_storage"] = f"uint8 + 128 ({converted} tensors): exact sums on every CPU"
    return model


def _ort_static(folded: Any, feeds: list[dict[str, np.ndarray]], facts: dict[str, Any],
                exclude: list[str]) -> tuple[Any, str, str]:
    import tempfile

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    with tempfile.TemporaryDirectory(prefix="xray-qdq-") as tmp:
        dst = f"{tmp}/int8.onnx"
        quantize_static(_saved(folded, tmp, "float.onnx"), dst, _Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        nodes_to_exclude=exclude, extra_options={"QDQKeepRemovableActivations": True})
        quantized = as_uint8(onnx.load(dst), facts)
    facts.update(quantized_activations=_dq_carries_name(quantized), calibration_batches=len(feeds))
    return quantized, "quantize_static (QDQ, per-channel weights)", "QuantizeLinear"


def _ort_dynamic(folded: Any, feeds: list[dict[str, np.ndarray]], facts: dict[str, Any],
                 exclude: list[str]) -> tuple[Any, str, str]:
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # quantize_dynamic splits a Gemm into "<gemm>_MatMul" (+ Add) before quantizing
    # (``ONNXModel.replace_gemm_with_matmul``): an excluded Gemm is excluded under that name too
    exclude = [*exclude, *(f"{name}_MatMul" for name in exclude)]
    with tempfile.TemporaryDirectory(prefix="xray-dyn-") as tmp:
        dst = f"{tmp}/int8.onnx"
        quantize_dynamic(_saved(folded, tmp, "float.onnx"), dst, op_types_to_quantize=["MatMul"], per_channel=True,
                         weight_type=QuantType.QInt8, nodes_to_exclude=exclude)
        quantized = as_uint8(onnx.load(dst), facts)
    return quantized, "quantize_dynamic (MatMulInteger, per-channel weights)", "DynamicQuantizeLinear"


# ONNX Runtime's int4 blocks: 32 weights share a scale (the scheme's ``weight_group``)
INT4_BLOCK = 32


def _ort_int4(folded: Any, feeds: list[dict[str, np.ndarray]], facts: dict[str, Any],
              exclude: list[str]) -> tuple[Any, str, str]:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    split = _gemm_as_matmul(folded)
    # an excluded Gemm is excluded as the MatMul it is split into (``_gemm_as_matmul`` names it)
    exclude = [*exclude, *(f"{name}__matmul" for name in exclude)]
    # accuracy_level unset: the kernel computes in float32 (weight-only; 4 would round activations)
    quantizer = MatMulNBitsQuantizer(split, bits=4, block_size=INT4_BLOCK, is_symmetric=True, nodes_to_exclude=exclude)
    quantizer.process()
    return quantizer.model.model, f"MatMulNBitsQuantizer (int4, blocks of {INT4_BLOCK}, symmetric)", "MatMulNBits"


def _gemm_as_matmul(proto: Any) -> Any:
    """Each ``Gemm(A, B, C)`` with a constant ``B`` (no ``transA``, alpha = beta = 1: the
    exporter's ``addmm``, or a ``linear`` with ``transB``) as ``MatMul(A, B') -> Add(C)``, ``B'``
    the weight as ``(in, out)``: ``MatMulNBitsQuantizer`` quantizes MatMul only. The node that
    produces the Gemm's output keeps its name and metadata."""
    from onnx import helper, numpy_helper

    model = copy.deepcopy(proto)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    nodes = []
    for n in g.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        plain = not attrs.get("transA") and attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0
        if n.op_type != "Gemm" or not plain or n.input[1] not in inits:
            nodes.append(n)
            continue
        weight = n.input[1]
        if attrs.get("transB"):
            weight = f"{n.input[1]}__t"
            if weight not in inits:
                flipped = np.ascontiguousarray(numpy_helper.to_array(inits[n.input[1]]).T)
                inits[weight] = numpy_helper.from_array(flipped, weight)
                g.initializer.append(inits[weight])
        product = f"{n.output[0]}__matmul"
        mm = helper.make_node("MatMul", [n.input[0], weight], [product], name=f"{n.name}__matmul")
        last = mm
        nodes.append(mm)
        if len(n.input) > 2 and n.input[2]:
            last = helper.make_node("Add", [product, n.input[2]], list(n.output), name=f"{n.name}__add")
            nodes.append(last)
        else:
            mm.output[0] = n.output[0]
        last.metadata_props.extend(copy.deepcopy(list(n.metadata_props)))
    del g.node[:]
    g.node.extend(nodes)
    return model


def _restamp(original: Any, quantized: Any) -> None:
    """Metadata for the nodes a quantizer added: the node now producing a value an original node
    produced gets that node's (the exporter's stamp ties a value to its program node,
    ``onnx_capture``), then each helper whose readers all carry one stamp gets theirs (the
    DynamicQuantizeLinear, MatMulInteger and scale Mul of a layer belong to that layer)."""
    stamps = {o: n.metadata_props for n in original.graph.node for o in n.output if len(n.metadata_props)}
    for n in quantized.graph.node:
        source = next((stamps[o] for o in n.output if o in stamps), None)
        if not len(n.metadata_props) and source is not None:
            n.metadata_props.extend(copy.deepcopy(list(source)))
    readers: dict[str, list[Any]] = {}
    for n in quantized.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    for n in reversed(list(quantized.graph.node)):
        if len(n.metadata_props):
            continue
        after = [r for o in n.output for r in readers.get(o, [])]
        found = {tuple((p.key, p.value) for p in r.metadata_props) for r in after}
        if len(found) == 1 and all(len(r.metadata_props) for r in after):
            n.metadata_props.extend(copy.deepcopy(list(after[0].metadata_props)))


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
