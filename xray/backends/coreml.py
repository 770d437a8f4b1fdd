"""CoreML: torch.export -> run_decompositions -> ``coremltools.convert`` to an mlprogram, and with
``quant`` its weights quantized by ``coremltools.optimize.coreml.linear_quantize_weights``.

Conversion runs everywhere; prediction needs macOS (coremltools' native runtime only ships
there). Elsewhere the conversion result is reported and execution is UNSUPPORTED_PLATFORM.
"""
from __future__ import annotations

import io
import logging
import shutil
import tempfile
import time
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .base import Artifact, Backend, BackendError, ModelCapture, Runner, ReplayStatus, short_error, is_macos
from .quantize import COREML_SCHEMES, quant_option

# linear_quantize_weights' settings per scheme: symmetric int8 per output channel, or int4 in
# blocks of 32 along the input dimension (constexpr_blockwise_shift_scale: iOS18 and later).
_WEIGHT_CONFIG = {"int8-weights": {"dtype": "int8", "granularity": "per_channel"},
                  "int4": {"dtype": "int4", "granularity": "per_block", "block_size": 32}}


def _import_coremltools():
    """coremltools warns loudly on import (unsupported torch version, missing native libs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("coremltools").setLevel(logging.ERROR)
        import coremltools as ct
    return ct


class CoreML(Backend):
    """Options: ``fp16`` (compute precision; default False = FLOAT32), ``compute_units`` ("CPU_ONLY"),
    ``target`` (minimum deployment target, "iOS16": the first that takes fp16 inputs; iOS18 with
    ``quant=int4``), ``quant`` (weight quantization)."""

    kind = "coreml"
    OPTIONS = {"fp16": "true: compute in fp16 (mlprogram FLOAT16)",
               "target": "minimum deployment target, a coremltools.target name (default iOS16; iOS18 for int4)",
               "compute_units": "a coremltools.ComputeUnit name (default CPU_ONLY)",
               "quant": quant_option(COREML_SCHEMES) + " (coremltools linear_quantize_weights)"}
    OPTION_CHOICES = {"quant": (None, *COREML_SCHEMES)}

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "coremltools": _import_coremltools().__version__}

    def tolerance_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float16 if self.options.get("fp16") and dtype.is_floating_point else dtype

    def export(self, module: torch.nn.Module, args: tuple) -> Artifact:
        start = time.perf_counter()
        try:
            exported = torch.export.export(module, args, strict=False).run_decompositions({})
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"torch.export: {short_error(e)}") from e
        export_s = time.perf_counter() - start
        start = time.perf_counter()
        model, quant_facts = self._convert(exported)
        facts = {"precision": "fp16" if self.options.get("fp16") else "fp32",
                 "mil_ops": _count_mil_ops(model), "export_s": round(export_s, 4),
                 "lower_s": round(time.perf_counter() - start, 4), **quant_facts}
        data = _zip_package(model)
        facts["package_bytes"] = len(data)
        reason = None if is_macos() else "converted; CoreML prediction needs macOS"
        return Artifact(data=data, suffix=".mlpackage.zip", facts=facts, unsupported_reason=reason)

    def load(self, artifact: Artifact, module: torch.nn.Module, args: tuple) -> Runner:
        if not is_macos():
            raise BackendError(ReplayStatus.UNSUPPORTED_PLATFORM,
                               artifact.unsupported_reason or "CoreML runs on macOS only")
        ct = _import_coremltools()
        folder = Path(tempfile.mkdtemp(prefix="xray-coreml-"))
        with zipfile.ZipFile(io.BytesIO(artifact.data)) as z:
            z.extractall(folder)
        try:
            units = getattr(ct.ComputeUnit, self.options.get("compute_units", "CPU_ONLY"))
            model = ct.models.MLModel(str(folder / "model.mlpackage"), compute_units=units)
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.RUN_FAIL, f"CoreML could not load the model: {short_error(e)}") from e
        spec = model.get_spec().description
        in_names = [i.name for i in spec.input]
        out_names = [o.name for o in spec.output]

        def run(inputs: tuple) -> list[torch.Tensor]:
            feed = {n: t.detach().contiguous().numpy() for n, t in zip(in_names, inputs)}
            result = model.predict(feed)
            return [torch.from_numpy(np.array(result[n])) for n in out_names]

        return run

    def run_model(self, program: torch.export.ExportedProgram, args: tuple, *, edit=None) -> ModelCapture:
        """Convert the whole reference program. Off macOS that is as far as CoreML goes: a
        successful conversion is UNSUPPORTED_PLATFORM with its facts in the message. On macOS the
        package predicts once and only its outputs are captured (CoreML exposes no intermediates
        without changing the program). ``edit`` gets the converted ``MLModel``."""
        start = time.perf_counter()
        model, quant_facts = self._convert(_without_aliases(program))
        convert_s = time.perf_counter() - start
        if edit is not None:
            model = edit(model) or model
        if not is_macos():
            quantized = (f", {quant_facts['quantized_weights']} weights quantized to "
                         f"{'/'.join(quant_facts['quantized_dtypes'])}" if quant_facts else "")
            raise BackendError(ReplayStatus.UNSUPPORTED_PLATFORM,
                               f"converted ({_count_mil_ops(model)} MIL ops{quantized}, {convert_s:.1f} s); "
                               "CoreML prediction needs macOS")
        spec = model.get_spec().description
        feed = {i.name: t.detach().contiguous().numpy() for i, t in zip(spec.input, args)}
        try:
            result = model.predict(feed)
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.RUN_FAIL, f"CoreML predict: {short_error(e)}") from e
        outputs = [torch.from_numpy(np.array(result[o.name])) for o in spec.output]
        return ModelCapture(outputs=outputs, granularity="outputs only",
                            notes=["CoreML exposes only the program's outputs; they are not mapped to nodes"],
                            facts={"convert_s": round(convert_s, 4), "mil_ops": _count_mil_ops(model), **quant_facts})

    def _convert(self, exported: torch.export.ExportedProgram) -> tuple[Any, dict[str, Any]]:
        """``coremltools.convert`` to an mlprogram, then (``quant``) its weights quantized; the
        facts say how many weights were and how (empty without ``quant``)."""
        ct = _import_coremltools()
        scheme = self.options.get("quant")
        precision = ct.precision.FLOAT16 if self.options.get("fp16") else ct.precision.FLOAT32
        target = self.options.get("target", "iOS18" if scheme == "int4" else "iOS16")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = ct.convert(exported, convert_to="mlprogram", compute_precision=precision,
                                   minimum_deployment_target=getattr(ct.target, target),
                                   compute_units=getattr(ct.ComputeUnit, self.options.get("compute_units", "CPU_ONLY")),
                                   skip_model_load=not is_macos())
        except Exception as e:  # noqa: BLE001 - a conversion error is the result
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"coremltools.convert: {short_error(e)}") from e
        if scheme is None:
            return model, {}
        return _quantize_weights(model, scheme)


def _quantize_weights(model: Any, scheme: str) -> tuple[Any, dict[str, Any]]:
    """``linear_quantize_weights`` with the scheme's config on every weight (``weight_threshold``
    0: coremltools' default skips tensors under 2048 elements, a small model's head among them)."""
    import coremltools.optimize as cto

    start = time.perf_counter()
    config = cto.coreml.OptimizationConfig(global_config=cto.coreml.OpLinearQuantizerConfig(
        mode="linear_symmetric", weight_threshold=0, **_WEIGHT_CONFIG[scheme]))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantized = cto.coreml.linear_quantize_weights(model, config=config)
    except Exception as e:  # noqa: BLE001 - the quantizer's error is the result
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"coremltools linear_quantize_weights: {short_error(e)}") from e
    found = quantized_weights(quantized)
    if not found:
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"coremltools linear_quantize_weights ({scheme}): no weight "
                           "was quantized")
    how = f"{scheme} coremltools linear_quantize_weights ({_WEIGHT_CONFIG[scheme]['granularity']}, symmetric)"
    return quantized, {"quant": how, "quantized": True, "quantized_weights": len(found),
                       "quantized_dtypes": sorted(set(found)), "quantize_s": round(time.perf_counter() - start, 4)}


def quantized_weights(model: Any) -> list[str]:
    """The storage dtype of each quantized weight in the model's MIL program (the ``constexpr``
    ops that dequantize a weight when the model loads: int8, int4...)."""
    from coremltools.converters.mil.mil import types

    out = []
    for function in model._mil_program.functions.values():
        for op in function.operations:
            if op.op_type in ("constexpr_affine_dequantize", "constexpr_blockwise_shift_scale"):
                data = op.inputs.get("quantized_data", op.inputs.get("data"))
                out.append(types.builtin_to_string(data.dtype))
    return out


def _without_aliases(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """A copy without ``aten.alias`` nodes: core ATen keeps them (they change no value) and
    coremltools cannot convert them ("Unsupported fx node alias")."""
    import copy

    program = copy.deepcopy(program)
    graph = program.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.alias.default:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    program.graph_module.recompile()
    return program


def _count_mil_ops(model) -> int | None:
    try:
        return sum(len(f.operations) for f in model._mil_program.functions.values())
    except Exception:  # noqa: BLE001 - a fact, not a result
        return None


def _zip_package(model) -> bytes:
    folder = Path(tempfile.mkdtemp(prefix="xray-coreml-"))
    try:
        model.save(str(folder / "model.mlpackage"))
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for p in sorted((folder / "model.mlpackage").rglob("*")):
                if p.is_file():
                    z.write(p, p.relative_to(folder).as_posix())
        return buf.getvalue()
    finally:
        shutil.rmtree(folder, ignore_errors=True)



BACKEND = CoreML
