"""Which operators a dump may never make xray run: those that touch files or the process.

A dump is untrusted input. xray-gen, xray-replay and compare's recomputation rebuild recorded
calls, so an op name alone must not be able to read or write files (``aten.from_file``),
alias raw memory (``aten.set_`` from a Storage) or change process state (the profiler's
record-function ops, collectives that need peers). Judged by the schema first, so custom ops
with a path argument are caught without being listed, then by a reviewed deny-list.
"""
from __future__ import annotations

import re

import torch

# A string argument whose name says it is a location on disk (or the network).
_PATH_ARG = re.compile(r"(file|path|dir|folder|url|uri)", re.IGNORECASE)

# Reviewed against torch._C._jit_get_all_schemas() of torch 2.13: ops the schema rule misses.
_DENIED_NAMESPACES = {
    "profiler": "changes the profiler's process-wide state",
    "c10d": "a collective: needs its process group and peers",
    "_c10d_functional": "a collective: needs its process group and peers",
    "_c10d_functional_autograd": "a collective: needs its process group and peers",
    "_dtensor": "a distributed op: needs its process group and peers",
}
_DENIED_OPS = {
    "aten.from_file": "reads (and with shared=True writes) a file named by the dump",
    "aten.save": "writes a file named by the dump",
    "aten._print": "writes to the process's stdout",
}


def refusal(func: torch._ops.OpOverload) -> str | None:
    """Why ``func`` must not be run from a dump, or None when it may."""
    packet = func.name().split("::", 1)
    namespace = packet[0]
    name = f"{namespace}.{packet[-1].split('.')[0]}"
    if namespace in _DENIED_NAMESPACES:
        return _DENIED_NAMESPACES[namespace]
    if name in _DENIED_OPS:
        return _DENIED_OPS[name]
    for arg in func._schema.arguments:
        kind = str(arg.type)
        if "Storage" in kind:
            return f"argument {arg.name!r} is a raw Storage (aliases memory the dump describes)"
        if kind.replace("?", "") in ("str", "List[str]", "str[]") and _PATH_ARG.search(arg.name):
            return f"string argument {arg.name!r} names a file or path"
    return None
