"""The small interface every replay backend implements, and the shared outcome enum.

A backend turns a tiny ``nn.Module`` (one recorded op, or one recorded module) into something
it can run. It does that in two steps so that the expensive one can be cached on disk per op
signature: ``export`` (torch.export / ONNX export / lowering; returns an ``Artifact`` holding
bytes and facts) and ``load`` (turns an artifact into a callable runner). Backends without a
serialisable artifact (torch eager, torch.compile) return an artifact without bytes and build
their runner from the module itself.
"""
from __future__ import annotations

import enum
import platform
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from ..record.flatten import flatten_tensors  # noqa: F401  (re-exported for backends)


class ReplayStatus(enum.IntEnum):
    """Outcome of one (record, backend) replay. ``OK`` is the only pass; 1-6 are failures, worse as
    they grow; 7-10 say why values were not compared (platform, baseline, nondeterministic op,
    secondary output defined differently)."""

    OK = 0
    """Exported, lowered, ran, and matched the baseline within the dtype's tolerance."""
    EXPORT_FAIL = 1
    """torch.export / the ONNX exporter / CoreML conversion rejected the op."""
    LOWER_FAIL = 2
    """Export worked but lowering to the backend program failed (edge, partitioner, to_executorch)."""
    RUN_FAIL = 3
    """The program was built but raised at load or execution time."""
    MISMATCH = 4
    """It ran, but outputs differ from the baseline beyond tolerance (or in shape/dtype/count)."""
    CRASH = 5
    """The isolated worker process died (segfault, abort, out of memory)."""
    TIMEOUT = 6
    """The worker did not answer within the time limit and was killed."""
    UNSUPPORTED_PLATFORM = 7
    """The backend cannot execute on this OS (e.g. CoreML predict on Linux); conversion was still tried."""
    BASELINE_FAIL = 8
    """The backend ran, but the baseline produced no outputs for this record: not compared."""
    NONDETERMINISTIC = 9
    """It ran with the baseline's output count, shapes and dtypes, but the op's values are random
    (an RNG op) or uninitialized (``empty``), so they were not compared."""
    SECONDARY_DIFFERS = 10
    """The primary output matched; a secondary one is defined differently (another shape or dtype
    kind: the export's SDPA decomposition returns attention weights, not the logsumexp): not compared."""

    @property
    def supported(self) -> bool:
        """The backend expressed and ran the op (numbers may still drift, or be uncompared)."""
        return self in (ReplayStatus.OK, ReplayStatus.MISMATCH, ReplayStatus.BASELINE_FAIL,
                        ReplayStatus.NONDETERMINISTIC, ReplayStatus.SECONDARY_DIFFERS)


class BackendError(RuntimeError):
    """A backend step failed; ``status`` says which step (EXPORT_FAIL, LOWER_FAIL, RUN_FAIL...)."""

    def __init__(self, status: ReplayStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Artifact:
    """What ``export`` produced: optional serialized program bytes plus backend facts.

    ``facts`` are plain JSON values (ONNX opset, delegated/undelegated node counts, .pte size,
    export and lower seconds); they end up in the support matrix.
    """

    data: bytes | None = None
    suffix: str = ".bin"
    facts: dict[str, Any] = field(default_factory=dict)
    # When conversion worked but execution cannot happen here (CoreML on Linux).
    unsupported_reason: str | None = None


Runner = Callable[[tuple], list[torch.Tensor]]


@dataclass
class ModelCapture:
    """What a backend exposed of one whole-model run (``xray drift``).

    ``values`` maps node names of the *reference program* handed to ``run_model`` to the
    tensors the backend computed for that node's outputs (in output order). A backend that
    decomposes, fuses or delegates maps its own intermediates back to those names through the
    export graph's metadata (name identity, ``from_node`` provenance, debug handles); fused or
    delegated work maps many-to-one, and nodes it never materialised are simply absent.
    ``granularity`` says in a few words what the backend could expose ("every node",
    "delegate boundaries", "layer outputs", "outputs only"); ``notes`` say what it could not,
    and why.
    """

    outputs: list[torch.Tensor]
    values: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    granularity: str = "outputs only"
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


class Backend:
    """Base class of the backend plug-ins; subclasses set ``kind`` and implement export/load.

    ``options`` come from the registry preset (opset, fp16, partitioner, device...).
    ``cacheable`` is False for backends whose artifact cannot be stored (eager, compile).
    """

    kind: ClassVar[str] = "base"
    # The options this backend reads (name -> meaning), declared once: the registry refuses any other
    # (``onnxrt-cpu:quant=int8`` would otherwise run the float model and say nothing).
    OPTIONS: ClassVar[dict[str, str]] = {}
    # Options that take one of a few values (quant: None or "int8"); the registry refuses others.
    OPTION_CHOICES: ClassVar[dict[str, tuple]] = {}
    cacheable: ClassVar[bool] = True
    # Exported programs take dense inputs at their boundary (CoreML rejects other dim orders);
    # eager and compile keep the recorded strides.
    contiguous_inputs: ClassVar[bool] = True

    def __init__(self, name: str, **options: Any) -> None:
        self.name = name
        self.options = options

    def versions(self) -> dict[str, str]:
        """Library versions that change the artifact; they are part of the cache key."""
        return {"torch": torch.__version__}

    def export(self, module: torch.nn.Module, args: tuple) -> Artifact:
        raise NotImplementedError

    def load(self, artifact: Artifact, module: torch.nn.Module, args: tuple) -> Runner:
        """A callable running the artifact; ``args`` are example inputs (compile uses them)."""
        raise NotImplementedError

    def run_model(self, program: "torch.export.ExportedProgram", args: tuple, *,
                  edit: Callable[[Any], Any] | None = None) -> ModelCapture:
        """Run a whole exported model and capture every intermediate the backend materialises.

        ``program`` is the reference program (core ATen, as ``xray drift`` exported it); its
        graph's node names key ``ModelCapture.values``. ``edit``, when given, is called with the
        backend's own program before it runs (an ``onnx.ModelProto``, ExecuTorch's edge
        program manager, the compiled ``GraphModule``) and may change it in place or return a
        replacement: tests inject faults into the deployed graph this way. Failures raise
        ``BackendError`` with the stage (EXPORT_FAIL, LOWER_FAIL, RUN_FAIL).
        """
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"{self.kind}: whole-model runs are not supported")

    def run_isolated(self, program: "torch.export.ExportedProgram", args: tuple,
                     reference: dict[str, list[torch.Tensor]], *,
                     edit: Callable[[Any], Any] | None = None) -> ModelCapture:
        """Run the whole model with every captured edge between nodes cut: each node reads the
        ``reference`` values (node name -> its eager outputs) of its inputs instead of what the
        backend computed upstream, so each captured value is that node's own error on this backend
        (``xray drift``'s isolated mode). Optional: backends that cannot feed intermediates raise."""
        raise BackendError(ReplayStatus.EXPORT_FAIL, f"{self.kind}: isolated runs are not supported")

    def tolerance_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The precision the backend computes in (fp16 presets compare with fp16 tolerances)."""
        return dtype

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.options})"


def is_macos() -> bool:
    return platform.system() == "Darwin"


def short_error(e: BaseException, limit: int = 600) -> str:
    """The first lines of an exception, on one line: enough to tell failures apart in a CSV."""
    text = f"{type(e).__name__}: {e}".strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:limit]
