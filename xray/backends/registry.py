"""Named backend presets, with ``name:key=value,...`` overrides (e.g. ``onnxrt-cpu:opset=18``).

A preset is a backend module plus options. Adding a backend means adding one file with a
``BACKEND`` class and a line here.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from .base import Backend


@dataclass(frozen=True)
class Preset:
    """A named backend configuration; ``module`` is the file under xray/backends/."""

    module: str
    options: dict[str, Any] = field(default_factory=dict)
    help: str = ""


PRESETS: dict[str, Preset] = {
    "torch-cpu": Preset("torch_eager", {"device": "cpu"}, "PyTorch eager on CPU (the default baseline)"),
    "torch-cuda": Preset("torch_eager", {"device": "cuda"}, "PyTorch eager on CUDA"),
    "torch-compile": Preset("torch_compile", {"backend": "inductor"}, "torch.compile with inductor, CPU"),
    "onnxrt-cpu": Preset("onnxrt", {"opset": None, "provider": "CPUExecutionProvider"},
                         "ONNX (dynamo exporter, default opset) on ONNX Runtime CPU"),
    "onnxrt-cpu-opset17": Preset("onnxrt", {"opset": 17, "provider": "CPUExecutionProvider"},
                                 "ONNX opset 17 on ONNX Runtime CPU"),
    "executorch-xnnpack": Preset("executorch", {"partitioner": "xnnpack"}, "ExecuTorch, XNNPACK delegate"),
    "executorch-portable": Preset("executorch", {"partitioner": None}, "ExecuTorch portable kernels, no delegate"),
    "coreml": Preset("coreml", {"fp16": False}, "CoreML mlprogram, fp32 (predict on macOS only)"),
    "coreml-fp16": Preset("coreml", {"fp16": True}, "CoreML mlprogram, fp16 compute (predict on macOS only)"),
}


class UnknownBackendError(ValueError):
    """A backend name that is not a preset; the message lists the presets."""


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"onnxrt-cpu:opset=18,threads=2"`` -> ("onnxrt-cpu", {"opset": 18, "threads": 2})."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if name not in PRESETS:
        known = ", ".join(PRESETS)
        raise UnknownBackendError(f"unknown backend {name!r}; presets: {known} "
                                  "(override options as name:key=value,...)")
    overrides: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UnknownBackendError(f"bad override {item!r} in backend {spec!r}; write key=value")
        overrides[key.strip()] = _parse_value(value.strip())
    check_options(name, overrides)
    return name, overrides


def backend_class(name: str) -> type[Backend]:
    """The class of a preset (its file is imported; the heavy libraries are imported on use)."""
    return importlib.import_module(f"{__package__}.{PRESETS[name].module}").BACKEND


def check_options(name: str, options: dict[str, Any]) -> None:
    """Refuse an option the preset's backend does not take, naming the ones it does."""
    takes = backend_class(name).OPTIONS
    unknown = [k for k in options if k not in takes]
    if unknown:
        listed = "; ".join(f"{k}: {v}" for k, v in takes.items()) or "none"
        raise UnknownBackendError(f"backend {name!r} takes no option {', '.join(map(repr, unknown))}; "
                                  f"its options are {listed}")
    for key, allowed in backend_class(name).OPTION_CHOICES.items():
        if key in options and options[key] not in allowed:
            raise UnknownBackendError(f"backend {name!r}: {key}={options[key]!r} is not supported; "
                                      f"{key} takes {', '.join(str(a) for a in allowed if a is not None)}")


def create(spec: str, **overrides: Any) -> Backend:
    """The backend for a preset name (with optional ``:key=value`` overrides in the spec)."""
    name, parsed = parse_spec(spec)
    check_options(name, overrides)
    options = {**PRESETS[name].options, **parsed, **overrides}
    return backend_class(name)(spec if (parsed or overrides) else name, **options)


def describe() -> list[tuple[str, str]]:
    """(name, help) of every preset, for ``xray-replay --list-backends``."""
    return [(n, p.help) for n, p in PRESETS.items()]
