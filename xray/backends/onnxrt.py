"""ONNX Runtime: ``torch.onnx.export(..., dynamo=True)`` at a chosen opset, run on an execution provider.

Whole models (``run_model``, for ``xray drift``) are exported from the reference program and
every value that stands for a program node is marked as a graph output (Polygraphy's "mark
all"); ``onnx_capture`` says how values are tied back to nodes."""
from __future__ import annotations

import io
import time
from typing import Any, Callable

import numpy as np
import torch

from ..dump.tensorio import from_numpy
from .base import Artifact, Backend, BackendError, ModelCapture, Runner, ReplayStatus, short_error
from .quantize import KEEP_FLOAT_OPTION, ORT_SCHEMES, quant_option
from .shapes import DIMS, DYNAMIC_OPTION


class OnnxRuntime(Backend):
    """Options: ``opset`` (exporter default when None), ``provider`` ("CPUExecutionProvider")."""

    kind = "onnxrt"
    OPTIONS = {"opset": "ONNX opset of the export (none: the exporter's default)",
               "provider": "ONNX Runtime execution provider (default CPUExecutionProvider)",
               "threads": "intra-op threads (default 1)",
               "optimize": "true: let the exporter optimise the graph (whole-model runs)",
               "quant": quant_option(ORT_SCHEMES),
               "keep_float": KEEP_FLOAT_OPTION,
               "dynamic": DYNAMIC_OPTION}
    OPTION_CHOICES = {"quant": (None, *ORT_SCHEMES), "dynamic": (None, *DIMS)}

    def versions(self) -> dict[str, str]:
        import onnxscript

        return {"torch": torch.__version__, "onnxscript": onnxscript.__version__}

    def _onnx_export(self, what: Any, args: tuple, **options: Any) -> Any:
        """torch.onnx.export (dynamo) of a module or an exported program, failures as EXPORT_FAIL."""
        try:
            onnx_program = torch.onnx.export(what, args, dynamo=True, opset_version=self.options.get("opset"),
                                             verbose=False, report=False, **options)
        except Exception as e:  # noqa: BLE001 - the exporter's error is the result
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"torch.onnx.export: {short_error(e)}") from e
        if onnx_program is None:
            raise BackendError(ReplayStatus.EXPORT_FAIL, "torch.onnx.export returned no program")
        return onnx_program

    def export(self, module: torch.nn.Module, args: tuple) -> Artifact:
        """The ONNX model of one call (with ``dynamic``: a symbolic batch or seq dimension; with
        ``quant``: the scheme's ONNX Runtime flow, static int8 calibrated on ``args``, float where
        it quantizes nothing)."""
        from .shapes import describe, dynamic_shapes

        start = time.perf_counter()
        which = self.options.get("dynamic")
        onnx_program = self._onnx_export(module, args, dynamic_shapes=dynamic_shapes(module, args, which))
        proto = onnx_program.model_proto
        facts: dict[str, Any] = {"dynamic": which, **describe(onnx_program.exported_program)} if which else {}
        if self.options.get("quant") is not None:
            proto = self._quantize_call(proto, args, facts)
        data = proto.SerializeToString()
        opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
        facts.update(opset=opset, onnx_nodes=len(proto.graph.node), export_s=round(time.perf_counter() - start, 4),
                     model_bytes=len(data))
        return Artifact(data=data, suffix=".onnx", facts=facts)

    def _quantize_call(self, proto: Any, args: tuple, facts: dict[str, Any]) -> Any:
        """The scheme's quantization of one call's model (static int8: calibrated on the call's own
        inputs); a model it quantizes nothing of stays float (``quantized`` False in the facts)."""
        from .quantize import quantized_or_float, ort_quantize

        try:
            session = self._session(proto.SerializeToString())
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.LOWER_FAIL, f"onnxruntime could not load the model: {short_error(e)}") from e
        names = [i.name for i in session.get_inputs()]
        feed = {n: t.detach().contiguous().numpy() for n, t in zip(names, _match_inputs(names, list(args)))}
        quantized = quantized_or_float(lambda: ort_quantize(proto, [feed], facts, self.options["quant"]), facts)
        return proto if quantized is None else quantized

    def load(self, artifact: Artifact, module: torch.nn.Module, args: tuple) -> Runner:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = int(self.options.get("threads", 1))
        try:
            provider = self.options.get("provider", "CPUExecutionProvider")
            session = ort.InferenceSession(artifact.data, opts, providers=[provider])
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.RUN_FAIL, f"onnxruntime could not load the model: {short_error(e)}") from e
        names = [i.name for i in session.get_inputs()]

        def run(inputs: tuple) -> list[torch.Tensor]:
            if len(names) > len(inputs):
                raise BackendError(ReplayStatus.RUN_FAIL, f"model wants {len(names)} inputs, op has {len(inputs)}")
            feed = {}
            for name, t in zip(names, _match_inputs(names, list(inputs))):
                if t.dtype == torch.bfloat16:
                    raise BackendError(ReplayStatus.RUN_FAIL,
                                       "bfloat16 inputs cannot be fed through numpy to onnxruntime")
                feed[name] = t.detach().contiguous().numpy()
            outs = session.run(None, feed)
            return [from_numpy(np.asarray(o), str(np.asarray(o).dtype)) for o in outs]

        return run

    def _session(self, model: bytes):
        import onnxruntime as ort

        from .quantize import ORT_FLOAT_KEEPING, float_layers

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = int(self.options.get("threads", 1))
        provider = self.options.get("provider", "CPUExecutionProvider")
        disabled = list(ORT_FLOAT_KEEPING) if float_layers(self.options.get("keep_float")) else []
        return ort.InferenceSession(model, opts, providers=[provider], disabled_optimizers=disabled)

    def run_model(self, program: torch.export.ExportedProgram, args: tuple, *,
                  edit: Callable[[Any], Any] | None = None) -> ModelCapture:
        """Export the program to ONNX, run it once as deployed (outputs only) and once with every
        node's value marked as an output; the capture holds the marked run's values, the
        outputs are the plain run's. Option ``optimize`` (False) runs onnxscript's optimizer,
        which folds constants and fuses, so fewer program nodes keep a value of their own."""
        from . import onnx_capture

        start = time.perf_counter()
        proto, plan = self._export_model(program, args, edit)
        export_s = time.perf_counter() - start
        start = time.perf_counter()
        try:
            plain_session = self._session(proto.SerializeToString())
            marked_session = self._session(plan.marked.SerializeToString())
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.LOWER_FAIL, f"onnxruntime could not load the model: {short_error(e)}") from e
        load_s = time.perf_counter() - start
        feed = onnx_capture.feed(plain_session, program, args)
        start = time.perf_counter()
        try:
            plain = plain_session.run(None, feed)
            marked = dict(zip(plan.fetch, marked_session.run(plan.fetch, feed)))
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.RUN_FAIL, f"onnxruntime run: {short_error(e)}") from e
        run_s = time.perf_counter() - start
        outputs = [_tensor(o) for o in plain]
        values = onnx_capture.values(plan, marked, proto, program, args)
        marked_outputs = [_tensor(marked[o.name]) for o in proto.graph.output]
        moved = max((float((a.double() - b.double()).abs().max()) for a, b in zip(outputs, marked_outputs)
                     if a.numel() and a.shape == b.shape and a.is_floating_point()), default=0.0)
        opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
        notes = [f"{len(plan.fetch)} ONNX values marked as outputs; ONNX Runtime cannot fuse across a marked value, "
                 f"so the marked run's final outputs moved by at most {moved:.3g} against the plain run "
                 "(the outputs reported are the plain run's)"]
        if plan.unmapped:
            notes.append(f"{len(plan.unmapped)} program nodes have no ONNX value of their own (folded or fused): "
                         + ", ".join(plan.unmapped[:8]) + (" ..." if len(plan.unmapped) > 8 else ""))
        facts = {"opset": opset, "onnx_nodes": len(proto.graph.node), "export_s": round(export_s, 4),
                 "load_s": round(load_s, 4), "run_s": round(run_s, 4), "marked_values": len(plan.fetch),
                 "marking_moved_outputs": moved, **getattr(self, "_quant_facts", {})}
        granularity = "every node" if not plan.unmapped else "every node it kept"
        return ModelCapture(outputs=outputs, values=values, granularity=granularity, notes=notes, facts=facts)

    def _export_model(self, program: torch.export.ExportedProgram, args: tuple, edit: Callable | None):
        """The (edited) ONNX model of ``program`` and its capture plan. Kept for the same program
        and edit, so the isolated run that follows a whole run does not export again."""
        from . import onnx_capture

        key = (id(program), id(edit))
        cached = getattr(self, "_exported", None)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        onnx_program = self._onnx_export(program, tuple(args), optimize=bool(self.options.get("optimize", False)))
        proto = onnx_program.model_proto
        self._quant_facts: dict[str, Any] = {}
        if self.options.get("quant") is not None:
            proto = self._quantize(proto, program, args)
        if edit is not None:
            proto = edit(proto) or proto
        plan = onnx_capture.plan(proto, program, onnx_program.exported_program)
        self._exported = (key, proto, plan)
        return proto, plan

    def _quantize(self, proto: Any, program: torch.export.ExportedProgram, args: tuple) -> Any:
        """The scheme's quantization (``quantize.ort_quantize``; static int8 calibrated on the run's own inputs)."""
        from . import onnx_capture
        from .quantize import float_layers, ort_quantize

        try:
            session = self._session(proto.SerializeToString())
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.LOWER_FAIL, f"onnxruntime could not load the model: {short_error(e)}") from e
        feeds = [onnx_capture.feed(session, program, args)]
        return ort_quantize(proto, feeds, self._quant_facts, self.options["quant"],
                            float_layers(self.options.get("keep_float")))

    def run_isolated(self, program: torch.export.ExportedProgram, args: tuple,
                     reference: dict[str, list[torch.Tensor]], *,
                     edit: Callable[[Any], Any] | None = None) -> ModelCapture:
        """The marked model with every captured edge cut (``onnx_capture.cut``): each node's value
        computed by ONNX Runtime's kernels from the reference's values of its inputs."""
        from . import onnx_capture

        proto, plan = self._export_model(program, args, edit)
        model, refs = onnx_capture.cut(plan, program, reference)
        try:
            session = self._session(model.SerializeToString())
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.LOWER_FAIL, f"onnxruntime could not load the cut model: {short_error(e)}") from e
        feed = dict(onnx_capture.feed(session, program, args, extra=refs))
        try:
            fetched = dict(zip(plan.fetch, session.run(plan.fetch, feed)))
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.RUN_FAIL, f"onnxruntime isolated run: {short_error(e)}") from e
        values = onnx_capture.values(plan, fetched, proto, program, args)
        return ModelCapture(outputs=[_tensor(fetched[o.name]) for o in proto.graph.output], values=values,
                            granularity="every node, inputs from the reference",
                            notes=[f"{len(refs)} edges cut and fed from the reference"], facts={"cut_edges": len(refs)})


def _tensor(a: Any) -> torch.Tensor:
    arr = np.array(a)  # a writable copy: ORT's buffers are read-only
    return from_numpy(arr, str(arr.dtype)).clone()


def _match_inputs(names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    if len(names) == len(tensors):
        return tensors
    # The exporter names inputs after the forward's varargs (tensors_0, tensors_1, ...) and drops
    # those the graph never reads: map the rest by their index suffix.
    picked = []
    for n in names:
        idx = n.rsplit("_", 1)[-1]
        if not (idx.isdigit() and int(idx) < len(tensors)):
            raise BackendError(ReplayStatus.RUN_FAIL,
                               f"cannot match ONNX input {n!r} to the op's {len(tensors)} tensors")
        picked.append(tensors[int(idx)])
    return picked



BACKEND = OnnxRuntime
