"""The math settings a run computed under: what a legitimate kernel on its device may round.

Why: a GPU's matmul may use TF32 or split-K reductions in bf16, its attention and norms sum in
another order than the CPU's. Compare sets each op's noise floor from these settings, so the
recorder writes them into the dump's header (``"math"``, docs/format.md) and compare reads them
back; a dump without them (older recorders) has them inferred from its tensors' devices and dtypes.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any, Iterator


# environment variables a vendor library reads behind torch's back: NVIDIA_TF32_OVERRIDE=0 turns
# TF32 off in cuBLAS and cuDNN whatever torch's flags say
MATH_ENV = ("NVIDIA_TF32_OVERRIDE",)

# out-of-tree devices' reduced-precision fp32 switches (module under torch, attribute path):
# torch_npu's HF32 for matmuls (default off) and convolutions (default on); HF32 keeps about as
# many mantissa bits as TF32, so compare treats both as TF32's step
VENDOR_SWITCHES = {"npu_matmul_allow_hf32": ("npu", "matmul", "allow_hf32"),
                   "npu_conv_allow_hf32": ("npu", "conv", "allow_hf32")}

# torch >= 2.9's per-backend fp32 math (torch.backends.<backend>.<op>.fp32_precision): "ieee",
# "tf32" or "bf16" ("none" defers to the backend's setting, then the generic one)
# the header key a recorder that knows its kernels sets: the reduced-precision steps they may
# round fp32 to (a list, possibly empty); absent, compare allows any step a run shows
ROUNDS_TO = "fp32_rounds_to"

FP32_PRECISIONS = (("cuda", "matmul"), ("cudnn", "conv"), ("cudnn", "rnn"),
                   ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn"))


def _fp32_precision(backend: str, op: str) -> str | None:
    """The fp32 math ``op`` of ``backend`` runs with (None: this torch has no such setting)."""
    import torch

    found = False
    for path in ((backend, op), (backend,), ()):
        obj: Any = torch.backends
        try:
            for name in path:
                obj = getattr(obj, name)
            value = obj.fp32_precision
        except (AttributeError, RuntimeError):
            continue
        found = True
        if isinstance(value, str) and value != "none":
            return value
    return "ieee" if found else None


def _read(getter: Any, fallback: Any) -> Any:
    """A legacy setting's value. torch >= 2.9 raises when the program set the same thing through
    the new fp32_precision API (a mix it refuses to reconcile): then what that API says."""
    try:
        return getter()
    except RuntimeError:
        return fallback


@contextlib.contextmanager
def tf32(on: bool = True) -> Iterator[None]:
    """cuBLAS matmuls and cudnn convolutions with TF32 ``on`` (or off) inside, what was set
    before restored after. Through torch >= 2.9's fp32_precision API where it exists: torch
    refuses to read the legacy flags once a program mixed the two."""
    import torch

    if hasattr(torch.backends, "fp32_precision"):
        settings = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
        saved = [s.fp32_precision for s in settings]
        for s in settings:
            s.fp32_precision = "tf32" if on else "ieee"
        try:
            yield
        finally:
            for s, value in zip(settings, saved):
                s.fp32_precision = value
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def current() -> dict[str, Any]:
    """The calling process's math settings, as JSON values (the dump header's ``"math"``).
    Never raises: a setting this torch cannot report is left out or null."""
    import torch

    precision = {f"{b}_{o}": v for b, o in FP32_PRECISIONS if (v := _fp32_precision(b, o)) is not None}
    cublas_tf32 = precision.get("cuda_matmul") == "tf32"
    m = torch.backends.cuda.matmul
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": None,
        "allow_tf32_matmul": bool(_read(lambda: m.allow_tf32, cublas_tf32)),
        "allow_tf32_cudnn": bool(_read(lambda: torch.backends.cudnn.allow_tf32, precision.get("cudnn_conv") == "tf32")),
        "reduced_precision_reduction_fp16": bool(_read(lambda: m.allow_fp16_reduced_precision_reduction, False)),
        "reduced_precision_reduction_bf16": bool(_read(lambda: m.allow_bf16_reduced_precision_reduction, False)),
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision, "high" if cublas_tf32 else None),
        "fp32_precision": precision or None,
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "autocast": None,
        "vendor": _vendor_switches(torch) or None,
        "env": {k: os.environ[k] for k in MATH_ENV if k in os.environ} or None,
    }
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["device"] = torch.cuda.get_device_name()
    except RuntimeError:  # a broken driver must not stop a recording
        pass
    for device in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device):
                out["autocast"] = f"{device}:{str(torch.get_autocast_dtype(device)).removeprefix('torch.')}"
                break
        except (RuntimeError, TypeError, AttributeError):
            continue
    return out


def _vendor_switches(torch: Any) -> dict[str, bool]:
    """VENDOR_SWITCHES that this process has (an out-of-tree device's module was imported)."""
    out = {}
    for key, path in VENDOR_SWITCHES.items():
        obj: Any = torch
        try:
            for name in path:
                obj = getattr(obj, name)
        except (AttributeError, RuntimeError, ImportError):
            continue
        if isinstance(obj, bool):
            out[key] = obj
    return out


@dataclass(frozen=True)
class RunMath:
    """What compare needs of a run's math settings. ``recorded``: read from the dump, not inferred."""

    device: str = "cpu"  # "cpu", "cuda", ... (the tensors' device type)
    tf32_matmul: bool = False  # matmuls may round their inputs to TF32 or HF32 (an accelerator's setting)
    tf32_conv: bool = False  # convolutions may (cudnn's allow_tf32 and torch_npu's conv HF32: on by default)
    tf32_rnn: bool = False  # RNN kernels may (cudnn's allow_tf32 again, or its rnn fp32_precision)
    reduced_reduction: bool = False  # half-precision split-K reductions allowed
    autocast: str | None = None
    recorded: bool = False
    # the reduced-precision steps (numerics.rules.PRECISION_STEPS) the run's fp32 kernels may round
    # to, where the recorder knows its kernels (compile-check: inductor's); None: unknown, any
    rounds_to: frozenset[str] | None = None

    def may_round(self, step: str) -> bool:
        """Whether a kernel of this run may legitimately show ``step``'s rounding in fp32."""
        return self.rounds_to is None or step in self.rounds_to


def run_math(header: dict | None, devices: set[str], tf32: bool | None = None) -> RunMath:
    """RunMath from a dump header's ``"math"`` (when recorded) and its tensors' device types.
    ``tf32``: declared by the user (compare's ``--tf32 on|off``), it wins over the header: a
    switch xray cannot read (a vendor library's, an emulator's) or one set outside the program.

    Each device type reads its own switches: cuda cuBLAS' and cudnn's (off under
    NVIDIA_TF32_OVERRIDE=0), xpu oneDNN's (``torch.backends.mkldnn``), npu torch_npu's HF32.
    Without recorded settings TF32 is not assumed (a CUDA run in fp32 may have had it off, and
    its floor would then hide a 1e-3 bug): compare then admits a reduced-precision
    step only where the run itself shows it on every call of a kind (causality's measured
    precision classes). On CPU no step is assumed: cuBLAS' and cudnn's settings do not apply,
    and oneDNN's (``torch.backends.mkldnn``, which ``set_float32_matmul_precision`` sets too)
    is a request that CPUs without the instructions ignore, and that this 2-core machine's
    AVX512-BF16 answers with bf16x3 (a 256-square matmul: 6.9e-7 against 3.7e-7 in IEEE fp32):
    the header records it, and a CPU run that does round shows its step on every call of a kind."""
    device = next((d for d in sorted(devices) if d != "cpu"), "cpu")
    declared = {} if tf32 is None else {"tf32_matmul": tf32, "tf32_conv": tf32, "tf32_rnn": tf32}
    m = (header or {}).get("math")
    if isinstance(m, str):  # a module dump's HDF5 attribute holds it as JSON
        try:
            m = json.loads(m)
        except ValueError:
            m = None
    if not isinstance(m, dict):
        return RunMath(device=device, recorded=bool(declared), **declared)
    matmul, conv, rnn = _tf32_switches(m, device)
    reduced = device != "cpu" and (bool(m.get("reduced_precision_reduction_fp16"))
                                   or bool(m.get("reduced_precision_reduction_bf16")))
    found = {"tf32_matmul": matmul, "tf32_conv": conv, "tf32_rnn": rnn, **declared}
    rounds = m.get(ROUNDS_TO)
    rounds = frozenset(str(x) for x in rounds) if isinstance(rounds, list) else None
    return RunMath(device=device, reduced_reduction=reduced, recorded=True, rounds_to=rounds,
                   autocast=m.get("autocast") if isinstance(m.get("autocast"), str) else None, **found)


def cpu_fp32_rounding(m: dict) -> list[str] | None:
    """The header's ``ROUNDS_TO`` for a CPU run of a program whose own kernels compute fp32 in
    fp32 (inductor's C++ kernels), under settings ``m`` (``current()``): the steps oneDNN's extern
    kernels were asked for (``fp32_precision`` ``"bf16"`` or ``"tf32"``), else none. None
    (unknown) under autocast, which changes the ops' dtypes."""
    if m.get("autocast"):
        return None
    new = m.get("fp32_precision") if isinstance(m.get("fp32_precision"), dict) else {}
    asked = {v for k, v in new.items() if k.startswith("mkldnn_")}
    return sorted({"bf16": "bf16", "tf32": "tf32/fp16"}[v] for v in asked if v in ("bf16", "tf32"))


def _tf32_switches(m: dict, device: str) -> tuple[bool, bool, bool]:
    """(matmul, convolution, RNN) may round fp32 inputs to a 10-bit mantissa on ``device``, by
    the switches its own libraries read."""
    new = m.get("fp32_precision") if isinstance(m.get("fp32_precision"), dict) else {}
    vendor = m.get("vendor") if isinstance(m.get("vendor"), dict) else {}
    env = m.get("env") if isinstance(m.get("env"), dict) else {}
    if device == "npu":
        return bool(vendor.get("npu_matmul_allow_hf32")), bool(vendor.get("npu_conv_allow_hf32")), False
    if device == "xpu":
        return new.get("mkldnn_matmul") == "tf32", new.get("mkldnn_conv") == "tf32", new.get("mkldnn_rnn") == "tf32"
    if device != "cuda" or str(env.get("NVIDIA_TF32_OVERRIDE", "")).strip() == "0":
        return False, False, False
    matmul = bool(m.get("allow_tf32_matmul")) or m.get("float32_matmul_precision") in ("high", "medium") \
        or new.get("cuda_matmul") == "tf32"
    cudnn = bool(m.get("allow_tf32_cudnn"))
    return matmul, cudnn or new.get("cudnn_conv") == "tf32", cudnn or new.get("cudnn_rnn") == "tf32"
