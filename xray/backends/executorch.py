"""ExecuTorch: torch.export -> to_edge_transform_and_lower (XNNPACK partitioner or portable) -> .pte,
run with ExecuTorch's own runtime (``executorch.runtime``)."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from .base import Artifact, Backend, BackendError, ModelCapture, Runner, ReplayStatus, short_error
from .executorch_debug import count_nodes, run_whole_model
from .quantize import KEEP_FLOAT_OPTION, PT2E_SCHEMES, float_layers, quant_option
from .shapes import DIMS, DYNAMIC_OPTION


class ExecuTorch(Backend):
    """Options: ``partitioner`` ("xnnpack" or None for the portable kernels)."""

    kind = "executorch"
    OPTIONS = {"partitioner": "xnnpack, or none for the portable kernels", "quant": quant_option(PT2E_SCHEMES),
               "keep_float": KEEP_FLOAT_OPTION, "dynamic": DYNAMIC_OPTION, "threads": "threads of ExecuTorch's threadpool (XNNPACK; default: its own)"}
    OPTION_CHOICES = {"quant": (None, *PT2E_SCHEMES), "dynamic": (None, *DIMS)}

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
        """torch.export (``dynamic``: a symbolic batch or seq dimension) -> (``quant``: PT2E
        calibrated on ``args``, float where the quantizer annotates nothing) -> lowered ``.pte``."""
        from executorch.exir import to_edge_transform_and_lower

        from .shapes import describe, dynamic_shapes

        which = self.options.get("dynamic")
        shapes = dynamic_shapes(module, args, which)
        start = time.perf_counter()
        try:
            exported = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
        except Exception as e:  # noqa: BLE001 - the exporter's error is the result
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"torch.export: {short_error(e)}") from e
        facts: dict[str, Any] = {"dynamic": which, **describe(exported)} if which else {}
        if self.options.get("quant") is not None:
            exported = self._quantize_call(exported, args, which, facts)
        export_s = time.perf_counter() - start
        start = time.perf_counter()
        try:
            edge = to_edge_transform_and_lower(exported, partitioner=self._partitioners())
            delegated, undelegated = count_nodes(edge.exported_program().graph_module)
            facts.update(delegation(edge.exported_program().graph_module))
            program = edge.to_executorch()
            data = program.buffer
        except BackendError:
            raise
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.LOWER_FAIL, f"lowering: {short_error(e)}") from e
        facts.update({"partitioner": self.options.get("partitioner") or "portable", "delegated_nodes": delegated,
                      "undelegated_nodes": undelegated, "pte_bytes": len(data), "export_s": round(export_s, 4),
                      "lower_s": round(time.perf_counter() - start, 4)})
        return Artifact(data=bytes(data), suffix=".pte", facts=facts)

    def _quantize_call(self, exported: torch.export.ExportedProgram, args: tuple, which: str | None,
                       facts: dict[str, Any]) -> torch.export.ExportedProgram:
        """PT2E (XNNPACKQuantizer, the ``quant`` scheme) of one call, run on its own inputs, exported again."""
        from .quantize import quantized_or_float, pt2e_quantize
        from .shapes import dynamic_shapes

        try:
            import executorch.kernels.quantized  # noqa: F401 - registers the quantized ops' out variants
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.LOWER_FAIL, f"ExecuTorch quantized kernels: {short_error(e)}") from e
        converted = quantized_or_float(lambda: pt2e_quantize(exported, args, {}, facts, self.options["quant"])[0], facts)
        if converted is None:
            return exported
        try:
            return torch.export.export(converted, args, dynamic_shapes=dynamic_shapes(converted, args, which),
                                       strict=False)
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"torch.export of the quantized program: "
                               f"{short_error(e)}") from e

    def load(self, artifact: Artifact, module: torch.nn.Module, args: tuple) -> Runner:
        from executorch.runtime import Runtime

        from ..quiet import executorch_logs

        if self.options.get("threads") is not None:
            from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

            _unsafe_reset_threadpool(int(self.options["threads"]))

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
        ``quant`` it gets the converted PT2E module (after calibration) instead, and
        ``source`` = (the program before decompositions, the model's args, kwargs) is what is
        quantized and calibrated."""
        if self.options.get("quant") is not None and self.options.get("partitioner") not in (None, "xnnpack"):
            raise BackendError(ReplayStatus.LOWER_FAIL, "quant lowers with XNNPACK or the portable kernels only")
        return run_whole_model(program, args, self._partitioners(),
                               self.options.get("partitioner") or "portable", edit=edit,
                               quant=self.options.get("quant"), source=source,
                               keep_float=float_layers(self.options.get("keep_float")))


def delegation(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """What the partitioner took: the ops inside delegate blobs (``partitioned_ops``, by name),
    their share of all ops (``delegated_pct``), and the blobs' total size (``delegate_bytes``)."""
    inside: list[str] = []
    blob_bytes = 0
    outside = 0
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target.startswith("lowered_module"):
            lowered = getattr(gm, node.target)
            blob_bytes += len(getattr(lowered, "processed_bytes", b"") or b"")
            original = getattr(lowered, "original_module", None)
            for n in (original.graph.nodes if original is not None else ()):
                if n.op == "call_function" and getattr(n.target, "__name__", "") != "getitem":
                    inside.append(_op_name(n.target))
        elif node.op == "call_function":
            name = getattr(node.target, "__name__", str(node.target))
            if "executorch_call_delegate" not in name and name != "getitem":
                outside += 1
    total = len(inside) + outside
    return {"partitioned_ops": ",".join(sorted(set(inside))), "delegated_ops": len(inside),
            "delegated_pct": round(100.0 * len(inside) / total, 1) if total else None, "delegate_bytes": blob_bytes}


def _op_name(target: Any) -> str:
    name = str(getattr(target, "_name", None) or getattr(target, "__name__", target))
    return name.removeprefix("aten::").removeprefix("aten.")


BACKEND = ExecuTorch
