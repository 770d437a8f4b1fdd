"""ExecuTorch: torch.export -> to_edge_transform_and_lower (XNNPACK partitioner or portable) -> .pte,
run with ExecuTorch's own runtime (``executorch.runtime``)."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from .base import Artifact, Backend, BackendError, ModelCapture, Runner, ReplayStatus, short_error
from .executorch_debug import count_nodes, run_whole_model
from .quantize import QUANT_OPTION, SCHEMES


class ExecuTorch(Backend):
    """Options: ``partitioner`` ("xnnpack" or None for the portable kernels)."""

    kind = "executorch"
    OPTIONS = {"partitioner": "xnnpack, or none for the portable kernels", "quant": QUANT_OPTION}
    OPTION_CHOICES = {"quant": (None, *SCHEMES)}

    def versions(self) -> dict[str, str]:
        from importlib.metadata import version

        return {"torch": torch.__version__, "executorch": version("executorch")}

    def _partitioners(self) -> list:
        name = self.options.get("partitioner")
        if name is None:
            return []
        if name == "xnnpack":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            return [XnnpackPartitioner()]
        raise BackendError(ReplayStatus.LOWER_FAIL, f"unknown ExecuTorch partitioner {name!r} (known: xnnpack, None)")

    def export(self, module: torch.nn.Module, args: tuple) -> Artifact:
        if self.options.get("quant") is not None:
            raise BackendError(ReplayStatus.EXPORT_FAIL, "quant=int8 quantizes whole models (xray drift); "
                               "one op replayed alone has no calibration")
        from executorch.exir import to_edge_transform_and_lower

        start = time.perf_counter()
        try:
            exported = torch.export.export(module, args, strict=False)
        except Exception as e:  # noqa: BLE001 - the exporter's error is the result
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"torch.export: {short_error(e)}") from e
        export_s = time.perf_counter() - start
        start = time.perf_counter()
        try:
            edge = to_edge_transform_and_lower(exported, partitioner=self._partitioners())
            delegated, undelegated = count_nodes(edge.exported_program().graph_module)
            program = edge.to_executorch()
            data = program.buffer
        except BackendError:
            raise
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.LOWER_FAIL, f"lowering: {short_error(e)}") from e
        facts = {"partitioner": self.options.get("partitioner") or "portable", "delegated_nodes": delegated,
                 "undelegated_nodes": undelegated, "pte_bytes": len(data), "export_s": round(export_s, 4),
                 "lower_s": round(time.perf_counter() - start, 4)}
        return Artifact(data=bytes(data), suffix=".pte", facts=facts)

    def load(self, artifact: Artifact, module: torch.nn.Module, args: tuple) -> Runner:
        from executorch.runtime import Runtime

        from ..quiet import executorch_logs

        try:
            with executorch_logs():
                method = Runtime.get().load_program(artifact.data).load_method("forward")
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.RUN_FAIL, f"ExecuTorch could not load the program: {short_error(e)}") from e
        if method is None:
            raise BackendError(ReplayStatus.RUN_FAIL, "ExecuTorch could not load method 'forward'")

        def run(inputs: tuple) -> list[torch.Tensor]:
            with executorch_logs():
                outs = method.execute([t.contiguous() for t in inputs])
            return [o.clone() for o in outs if isinstance(o, torch.Tensor)]

        return run

    def run_model(self, program: torch.export.ExportedProgram, args: tuple, *,
                  edit: Callable[[Any], Any] | None = None,
                  source: tuple | None = None) -> ModelCapture:
        """The whole model, run once with ETDump and a debug buffer (``executorch_debug``).

        ``edit`` gets the edge program manager after partitioning, before ``to_executorch``:
        on the portable preset every weight is still a graph constant there; under XNNPACK the
        delegated linear layers' weights are already inside the delegate blobs. With
        ``quant=int8`` it gets the converted PT2E module (after calibration) instead, and
        ``source`` = (the program before decompositions, the model's args, kwargs) is what is
        quantized and calibrated."""
        if self.options.get("quant") is not None and self.options.get("partitioner") not in (None, "xnnpack"):
            raise BackendError(ReplayStatus.LOWER_FAIL, "quant=int8 lowers with XNNPACK or the portable kernels only")
        return run_whole_model(program, args, self._partitioners(),
                               self.options.get("partitioner") or "portable", edit=edit,
                               quant=self.options.get("quant"), source=source)


BACKEND = ExecuTorch
