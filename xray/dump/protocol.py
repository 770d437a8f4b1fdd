"""``Dump``: what every tool may ask of an opened dump, whichever format it is in.

``TraceDump`` (a tracer folder) and ``ModuleDump`` (a PrecisionDebugger ``.h5``) both provide
it, so compare, gen and replay take either without knowing which one they were handed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

import h5py
import torch

from .model import Record, TensorMeta


@runtime_checkable
class Dump(Protocol):
    """An opened dump: its records in execution order, its header, and saved tensors on demand."""

    @property
    def format(self) -> str:
        """The format name: "xray-trace" or "xray-module"."""

    @property
    def folder(self) -> Path:
        """The folder the dump's files are in (for messages and relative paths)."""

    @property
    def header(self) -> dict[str, Any]:
        """The writer's header: versions, host, rank..."""

    @property
    def complete(self) -> bool:
        """False when the writer never finished (its records may stop early)."""

    @property
    def records(self) -> Sequence[Record]:
        """Every record, in execution order (a version-3 trace builds each one when it is read)."""

    def __iter__(self) -> Iterator[Record]: ...

    def __len__(self) -> int: ...

    def has_data(self, meta: TensorMeta) -> bool:
        """Whether the tensor's data was saved and is still there."""

    def dataset(self, meta: TensorMeta | str) -> h5py.Dataset:
        """The HDF5 dataset behind ``meta``, for chunked reads; KeyError if it was not saved."""

    def load_tensor(self, meta: TensorMeta | str) -> torch.Tensor:
        """The saved tensor, on CPU; KeyError if it was not saved."""

    def close(self) -> None:
        """Close the files it holds open."""

    def __enter__(self) -> "Dump": ...

    def __exit__(self, *exc: object) -> None: ...
