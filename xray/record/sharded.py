"""DTensors under the recorder: each described by its local shard, never by communicating.

Why: a DTensor's statistics taken the ordinary way reduce the global tensor, which makes DTensor
run collectives inside the recorder (and ``item()`` of a partial scalar fails outright). A rank
describes what it holds: the local shard's shape, statistics and sample, and where that shard
sits in the global tensor (``Sharding``: placements, mesh, global shape and offset), with no
communication at all. The local kernels that DTensor runs for an op are recorded in their own
right, nested inside the DTensor op's record (docs/format.md, "Sharded tensors").
"""
from __future__ import annotations

import sys
from typing import Any

import torch

from ..dump.model import Sharding


def dtensor_type() -> type | None:
    """torch's DTensor class, once a program has imported it (never imported here: plain runs
    pay nothing for it)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def is_dtensor(t: Any) -> bool:
    cls = dtensor_type()
    return cls is not None and isinstance(t, cls)


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds for ``t`` (``t`` itself when it is no DTensor)."""
    return t._local_tensor if is_dtensor(t) else t


_SHARDINGS: dict[tuple, Sharding] = {}  # (spec, coordinate) -> its Sharding: DTensor specs repeat every step


def sharding_of(t: torch.Tensor) -> Sharding:
    """Where ``t``'s local shard sits in the global tensor, from its spec and this rank's mesh
    coordinate (no communication)."""
    spec = t._spec
    mesh = spec.mesh
    coordinate = tuple(mesh.get_coordinate() or ())
    key = (spec, coordinate)
    got = _SHARDINGS.get(key)
    if got is None:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape = tuple(int(n) for n in t.shape)
        _, offset = compute_local_shape_and_global_offset(shape, mesh, spec.placements)
        names = getattr(mesh, "mesh_dim_names", None)
        got = Sharding(placements=tuple(str(p) for p in spec.placements), mesh=tuple(int(n) for n in mesh.shape),
                       coordinate=coordinate, global_shape=shape, global_offset=tuple(int(n) for n in offset),
                       mesh_dims=None if names is None else tuple(str(n) for n in names))
        if len(_SHARDINGS) >= 4096:  # a bound, for specs that never repeat
            _SHARDINGS.clear()
        _SHARDINGS[key] = got
    return got


def fake_mode_active() -> bool:
    """Whether a FakeTensorMode runs now: DTensor's sharding propagation computes output shapes
    on fake tensors, calls that compute nothing the user's program sees."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
