"""PyTorch eager on a chosen device: the reference every other backend is compared with."""
from __future__ import annotations

import torch

from .base import Artifact, Backend, BackendError, Runner, ReplayStatus, flatten_tensors


class TorchEager(Backend):
    """Runs the module as is; option ``device`` (default "cpu")."""

    kind = "torch"
    OPTIONS = {"device": "cpu or cuda"}
    cacheable = False
    contiguous_inputs = False

    def export(self, module: torch.nn.Module, args: tuple) -> Artifact:
        return Artifact(facts={"device": self.options.get("device", "cpu")})

    def load(self, artifact: Artifact, module: torch.nn.Module, args: tuple) -> Runner:
        device = torch.device(self.options.get("device", "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise BackendError(ReplayStatus.UNSUPPORTED_PLATFORM, "CUDA is not available on this machine")
        module = module.to(device)

        def run(inputs: tuple) -> list[torch.Tensor]:
            with torch.no_grad():
                out = module(*[t.to(device) for t in inputs])
            if device.type == "cuda":
                torch.cuda.synchronize()
            return [t.cpu() for t in flatten_tensors(out)]

        return run


BACKEND = TorchEager
