"""torch.compile (inductor by default): compilation happens on the first call, in ``load``."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from .base import Artifact, Backend, BackendError, ModelCapture, Runner, ReplayStatus, flatten_tensors, short_error

# Why only the outputs: inductor fuses the whole graph into generated kernels. Asking for an
# intermediate (an extra graph output, a graph break, a hook) keeps that value alive and changes
# which kernels inductor generates, so the run observed would not be the run deployed.
_OUTPUTS_ONLY = ("inductor fuses the whole graph; exposing an intermediate (extra outputs, graph breaks, hooks) "
                 "would change the kernels it generates, so only the program's outputs are captured: drift is "
                 "seen at the output, not localised inside the model")


class TorchCompile(Backend):
    """Options: ``backend`` ("inductor"), ``mode`` (None), ``dynamic`` (False), ``device`` ("cpu")."""

    kind = "torch-compile"
    OPTIONS = {"backend": "torch.compile backend (default inductor)", "device": "cpu or cuda (default cpu)",
               "mode": "torch.compile mode (default none)", "dynamic": "true: dynamic shapes (default false)"}
    cacheable = False
    contiguous_inputs = False  # inductor keeps its own on-disk cache; a compiled module is not portable

    def export(self, module: torch.nn.Module, args: tuple) -> Artifact:
        return Artifact(facts={"compile_backend": self.options.get("backend", "inductor")})

    def load(self, artifact: Artifact, module: torch.nn.Module, args: tuple) -> Runner:
        device = torch.device(self.options.get("device", "cpu"))
        torch._dynamo.reset()  # one op module per load: don't hit the recompile limit
        compiled = torch.compile(module.to(device), backend=self.options.get("backend", "inductor"),
                                 mode=self.options.get("mode"), dynamic=self.options.get("dynamic", False),
                                 fullgraph=True)

        def run(inputs: tuple) -> list[torch.Tensor]:
            with torch.no_grad():
                out = compiled(*[t.to(device) for t in inputs])
            return [t.cpu() for t in flatten_tensors(out)]

        start = time.perf_counter()
        try:
            run(args)  # compile now, so a compiler error is LOWER_FAIL and not a run failure
        except Exception as e:  # noqa: BLE001 - any compiler error is the result we report
            raise BackendError(ReplayStatus.LOWER_FAIL, f"torch.compile failed: {short_error(e)}") from e
        artifact.facts["lower_s"] = round(time.perf_counter() - start, 4)
        return run

    def run_model(self, program: torch.export.ExportedProgram, args: tuple, *,
                  edit: Callable[[Any], Any] | None = None) -> ModelCapture:
        """Compile the reference program's module whole (``fullgraph=True``) and run it once; the
        outputs are mapped to the program's output nodes. ``edit`` gets the ``GraphModule``."""
        device = torch.device(self.options.get("device", "cpu"))
        try:
            module = program.module()
        except Exception as e:  # noqa: BLE001
            raise BackendError(ReplayStatus.EXPORT_FAIL, f"ExportedProgram.module(): {short_error(e)}") from e
        if edit is not None:
            module = edit(module) or module
        torch._dynamo.reset()
        start = time.perf_counter()
        try:
            # in place (Module.compile): torch.compile(module) warns whenever any global module hook
            # exists, and the program's fresh module is ours alone
            module.to(device).compile(backend=self.options.get("backend", "inductor"), mode=self.options.get("mode"),
                                      dynamic=self.options.get("dynamic", False), fullgraph=True)
            call_args, call_kwargs = _signature_inputs(program, [a.to(device) for a in args])
            with torch.no_grad():
                out = module(*call_args, **call_kwargs)
        except Exception as e:  # noqa: BLE001 - compilation happens on the first call
            raise BackendError(ReplayStatus.LOWER_FAIL, f"torch.compile failed: {short_error(e)}") from e
        lower_s = time.perf_counter() - start
        outputs = [t.detach().cpu() for t in flatten_tensors(out)]
        values: dict[str, list[torch.Tensor]] = {}
        out_node = next(n for n in program.graph.nodes if n.op == "output")
        # only the user outputs (mutated buffers come first in an exported program's output node)
        user = list(out_node.args[0])[-len(program.graph_signature.user_outputs):] \
            if program.graph_signature.user_outputs else []
        if len(user) == len(outputs):
            for arg, t in zip(user, outputs):
                if isinstance(arg, torch.fx.Node) and arg.op == "call_function":
                    values.setdefault(arg.name, [t])
        return ModelCapture(outputs=outputs, values=values, granularity="outputs only", notes=[_OUTPUTS_ONLY],
                            facts={"compile_backend": self.options.get("backend", "inductor"),
                                   "lower_s": round(lower_s, 4)})


def _signature_inputs(program: torch.export.ExportedProgram, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
    """The model's (args, kwargs) from the flat tensor user inputs: ``program.module()`` takes the
    exported signature, whose constant inputs (``use_cache=False``) are the recorded values."""
    from torch.export.graph_signature import ConstantArgument, InputKind

    it = iter(tensors)
    leaves = [spec.arg.value if isinstance(spec.arg, ConstantArgument) else next(it)
              for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    args, kwargs = torch.utils._pytree.tree_unflatten(leaves, program.call_spec.in_spec)
    return tuple(args), dict(kwargs)


BACKEND = TorchCompile
