"""``xray explain`` and ``xray fix``: from *where* two runs differ to *what to do about it*.

    from xray.explain import explain, fix
    x = explain(model, (ids,), target="cpu:bf16")         # how much of the final error each place makes
    f = fix(model, (ids,), target="cpu:fp16", max_error=1e-2)   # the fewest fp32 islands under the bound
    print(f.code)

Both graft the bench's values into reruns of the target (module hooks, and a dispatch mode for
single ATen calls matched by compare). docs/explain.md.
"""
from __future__ import annotations

from typing import Any

__all__ = ["explain", "fix"]


def explain(model: Any, args: Any, kwargs: dict | None = None, **options: Any):
    """See ``xray.explain.analysis.explain``; imported on first use (torch is heavy)."""
    from .analysis import explain as run

    return run(model, args, kwargs, **options)


def fix(model: Any, args: Any, kwargs: dict | None = None, **options: Any):
    """See ``xray.explain.search.fix``."""
    from .search import fix as run

    return run(model, args, kwargs, **options)
