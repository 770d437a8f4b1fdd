"""ONNX Runtime: ``torch.onnx.export(..., dynamo=True)`` at a chosen opset, run on an execution provider."""
from __future__ import annotations

import io
import time

import numpy as np
import torch

from ..dump.tensorio import from_numpy
from .base import Artifact, Backend, BackendError, Runner, ReplayStatus, short_error


class OnnxRuntime(Backend):
    """Options: ``opset`` (exporter default when None), ``provider`` ("CPUExecutionProvider")."""

    kind = "onnxrt"

    def versions(self) -> dict[str, str]:
        import onnxscript

        return {"torch": torch.__version__, "onnxscript": onnxscript.__version__}

    def export(self, module: torch.nn.Module, args: tuple) -> Artifact:
        start = time.perf_counter()
        try:
            program = torch.onnx.export(module, args, dynamo=True, opset_version=self.options.get("opset"),
                                        verbose=False, report=False)
        except Exception as e:  # noqa: BLE001 - the exporter's error is the result
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"torch.onnx.export: {short_error(e)}") from e
        if program is None:
            raise BackendError(ReplayStatus.EXPORT_FAIL, "torch.onnx.export returned no program")
        proto = program.model_proto
        buf = io.BytesIO()
        buf.write(proto.SerializeToString())
        opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
        facts = {"opset": opset, "onnx_nodes": len(proto.graph.node), "export_s": round(time.perf_counter() - start, 4),
                 "model_bytes": buf.tell()}
        return Artifact(data=buf.getvalue(), suffix=".onnx", facts=facts)

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
