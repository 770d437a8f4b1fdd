"""Where inside a torch.compile'd program two runs diverge: record a compiled run at the grain it
runs (one record per generated kernel output and extern kernel call), pair it with an eager run of
the same graph, and let compare name the first divergence (docs/compile.md).

    from xray.compiled import compile_check
    result = compile_check(model, (x,), out="xray-compile")
    result.summary["first_divergence"]
"""
from __future__ import annotations

from typing import Any

__all__ = ["compile_check", "CompileCheckResult", "CompileCheckError"]


def __getattr__(name: str) -> Any:  # PEP 562: the CLI's --help must not pay for torch
    if name in __all__:
        from . import check

        return getattr(check, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
