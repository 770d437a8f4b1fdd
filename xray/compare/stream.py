"""Read a saved tensor chunk by chunk, so comparing huge tensors needs memory for a few chunks.

HDF5 datasets can be sliced without reading the rest; ``chunk_selections`` cuts a C-ordered
shape into contiguous hyperslabs of at most ``max_elems`` elements.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from ..dump.model import TensorMeta
from ..dump.protocol import Dump
from ..dump.tensorio import DTYPE_ATTR, from_numpy

CHUNK_ELEMS = 1 << 20  # 4 MiB of float32 per side: large enough to amortise call overhead, cache friendly


def chunk_selections(shape: tuple[int, ...], max_elems: int = CHUNK_ELEMS) -> Iterator[tuple]:
    """Index tuples covering ``shape`` in C order, each a contiguous block of <= max_elems elements
    (or one row of the innermost dimension when that alone is larger)."""
    if len(shape) == 0:
        yield ()
        return
    inner = 1
    for s in shape[1:]:
        inner *= s
    if inner <= max_elems or len(shape) == 1:
        rows = max(1, max_elems // max(inner, 1)) if len(shape) > 1 else max_elems
        for lo in range(0, shape[0], rows):
            yield (slice(lo, min(lo + rows, shape[0])),)
        return
    for i in range(shape[0]):
        for sub in chunk_selections(shape[1:], max_elems):
            yield (i,) + sub


def _dataset(dump: Dump, meta: TensorMeta):
    """The h5py dataset behind ``meta``, or None when this dump type does not expose one."""
    opener = getattr(dump, "dataset", None)
    return opener(meta) if callable(opener) else None


def iter_chunks(dump: Dump, meta: TensorMeta, max_elems: int = CHUNK_ELEMS) -> Iterator[torch.Tensor]:
    """The saved tensor of ``meta`` as flat chunks in C order, in its own dtype."""
    ds = _dataset(dump, meta)
    if ds is None:  # unknown dump type: fall back to its whole-tensor loader
        yield dump.load_tensor(meta).reshape(-1)
        return
    name = ds.attrs.get(DTYPE_ATTR)
    if isinstance(name, bytes):
        name = name.decode()
    shape = tuple(ds.shape)
    for sel in chunk_selections(shape, max_elems):
        arr = ds[sel]
        if not isinstance(arr, np.ndarray):
            arr = np.asarray(arr)
        yield from_numpy(arr, name or str(arr.dtype)).reshape(-1)


def data_bytes(meta: TensorMeta) -> int:
    try:
        from ..dump.tensorio import dtype_from_name

        return meta.numel * dtype_from_name(meta.dtype).itemsize
    except ValueError:
        return 0
