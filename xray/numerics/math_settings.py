"""The math settings a run computed under: what a legitimate kernel on its device may round.

Why: a GPU's matmul may use TF32 or split-K reductions in bf16, its attention and norms sum in
another order than the CPU's. Compare sets each op's noise floor from these settings, so the
recorder writes them into the dump's header (``"math"``, docs/format.md) and compare reads them
back; a dump without them (older recorders) has them inferred from its tensors' devices and dtypes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def current() -> dict[str, Any]:
    """The calling process's math settings, as JSON values (the dump header's ``"math"``)."""
    import torch

    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": None,
        "allow_tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "allow_tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "reduced_precision_reduction_fp16": bool(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
        "reduced_precision_reduction_bf16": bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "autocast": None,
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


@dataclass(frozen=True)
class RunMath:
    """What compare needs of a run's math settings. ``recorded``: read from the dump, not inferred."""

    device: str = "cpu"  # "cpu", "cuda", ... (the tensors' device type)
    tf32_matmul: bool = False  # matmuls may round their inputs to TF32 (an accelerator's setting)
    tf32_conv: bool = False  # convolutions may (cudnn's allow_tf32, on by default in torch)
    reduced_reduction: bool = False  # half-precision split-K reductions allowed
    autocast: str | None = None
    recorded: bool = False


def run_math(header: dict | None, devices: set[str]) -> RunMath:
    """RunMath from a dump header's ``"math"`` (when recorded) and its tensors' device types.

    Without recorded settings TF32 is not assumed (a CUDA run in fp32 may have had it off, and
    its floor would then hide a 1e-3 bug): compare then admits a reduced-precision
    step only where the run itself shows it on every call of a kind (causality's measured
    precision classes)."""
    device = next((d for d in sorted(devices) if d != "cpu"), "cpu")
    m = (header or {}).get("math")
    if isinstance(m, str):  # a module dump's HDF5 attribute holds it as JSON
        try:
            m = json.loads(m)
        except ValueError:
            m = None
    if not isinstance(m, dict):
        return RunMath(device=device)
    accel = device != "cpu"
    tf32_matmul = accel and (bool(m.get("allow_tf32_matmul")) or m.get("float32_matmul_precision") in ("high", "medium"))
    reduced = accel and (bool(m.get("reduced_precision_reduction_fp16")) or bool(m.get("reduced_precision_reduction_bf16")))
    return RunMath(device=device, tf32_matmul=tf32_matmul, tf32_conv=accel and bool(m.get("allow_tf32_cudnn")),
                   reduced_reduction=reduced,
                   autocast=m.get("autocast") if isinstance(m.get("autocast"), str) else None, recorded=True)
