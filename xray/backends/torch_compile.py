"""torch.compile (inductor by default): compilation happens on the first call, in ``load``."""
from __future__ import annotations

import time

import torch

from .base import Artifact, Backend, BackendError, Runner, ReplayStatus, flatten_tensors, short_error


class TorchCompile(Backend):
    """Options: ``backend`` ("inductor"), ``mode`` (None), ``dynamic`` (False), ``device`` ("cpu")."""

    kind = "torch-compile"
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


BACKEND = TorchCompile
