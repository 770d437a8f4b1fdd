"""Which process this is in a distributed job: torch.distributed when initialised, else the
variables torchrun sets before init_process_group. One answer for the tracer and the debugger."""
from __future__ import annotations

import os

import torch


def dist_ranks() -> tuple[int | None, int | None, int]:
    """(global rank, local rank, world size); the ranks are None outside a distributed job."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        g, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        g, world = _env_int("RANK"), _env_int("WORLD_SIZE") or 1
    local = _env_int("LOCAL_RANK")
    return g, (g if local is None else local), world


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    return int(v) if v.isdigit() else None
