"""``xray drift``: where does a deployed model start to drift from eager, layer by layer?

    from xray.drift import drift
    result = drift(model, (ids,), backends=["onnxrt-cpu", "torch-compile"], out="drift/")

The model is exported once; each backend runs the whole program and exposes what it
materialises; every backend run becomes an xray trace dump that ``xray-compare`` reads against
the recorded eager run, and compare's first divergence names the first drifting layer.
docs/drift.md.
"""
from __future__ import annotations

from typing import Any

__all__ = ["drift"]


def drift(model: Any, example_args: Any, backends=("onnxrt-cpu",), out="xray-drift", **options: Any):
    """See ``xray.drift.run.drift``; imported on first use (torch is heavy)."""
    from .run import drift as run

    return run(model, example_args, backends, out, **options)
