"""Lossless tensor <-> HDF5 dataset conversion, shared by the recorder and the module debugger.

HDF5 (via numpy) has no bfloat16 or float8, so such tensors are stored bit-for-bit as unsigned
integers of the same width, with the true dtype in the ``torch_dtype`` attribute. Complex tensors
are stored natively. Reading never executes anything from the file.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import h5py
import numpy as np
import torch

from .errors import DumpFormatError

DTYPE_ATTR = "torch_dtype"

_NUMPY_NATIVE = {
    torch.float64: np.float64,
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
}
_BIT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """Resolve a recorded dtype name, accepting only real torch dtypes (never arbitrary attrs)."""
    dt = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def to_numpy(t: torch.Tensor, *, copy: bool = True) -> np.ndarray:
    """A CPU numpy array holding exactly the bits of ``t``. ``copy=False`` may share memory with
    ``t``: for callers that consume the array at once (an HDF5 write copies it into the file)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.dtype not in _NUMPY_NATIVE:
        t = t.view(_BIT_VIEW[t.element_size()])
    arr = t.numpy()
    return arr.copy() if copy and t.data_ptr() else arr


def from_numpy(a: np.ndarray, dtype_name_: str) -> torch.Tensor:
    dtype = dtype_from_name(dtype_name_)
    t = torch.from_numpy(np.asarray(a, order="C"))  # (ascontiguousarray makes 0-d arrays 1-d)
    if t.dtype != dtype:
        t = t.view(dtype)
    return t


def write_dataset(group, name: str, t: torch.Tensor) -> None:
    arr = to_numpy(t, copy=False)  # create_dataset copies the data into the file right away
    ds = group.create_dataset(name, data=arr)
    ds.attrs[DTYPE_ATTR] = dtype_name(t.dtype)


def stored_dtype_name(ds) -> str:
    """The torch dtype name ``read_dataset`` gives ``ds``, from its header alone (no data read)."""
    name = ds.attrs.get(DTYPE_ATTR)
    if isinstance(name, bytes):
        name = name.decode()
    return name or str(ds.dtype)


class UnsafeDatasetError(ValueError):
    """An HDF5 object whose bytes could come from outside its file: never read it."""


def file_inside(folder: str | os.PathLike, name: str) -> Path:
    """``folder/name`` if it is, once every symlink is resolved, a regular file directly in
    ``folder``; else DumpFormatError. A dump's files (segments, index, journal chunks) always
    are: a symlink out of the folder, a FIFO or a device is how a crafted dump would make xray
    read bytes it does not hold."""
    folder = Path(folder)
    path = folder / name
    if "/" in name or "\\" in name or name in ("", ".", ".."):
        raise DumpFormatError(f"{folder}: refusing file reference {name[:80]!r} outside the dump")
    try:
        real, home = path.resolve(strict=True), folder.resolve(strict=True)
        mode = os.stat(real).st_mode
    except (OSError, RuntimeError) as e:  # missing, a symlink loop, unreadable
        raise DumpFormatError(f"{path}: cannot open ({getattr(e, 'strerror', None) or e})") from None
    if real.parent != home:
        raise DumpFormatError(f"{path}: refused: it leads to {real}, outside the dump folder")
    if not stat.S_ISREG(mode):
        raise DumpFormatError(f"{path}: refused: not a regular file")
    return real


def open_dataset(f: h5py.File, path: str) -> h5py.Dataset:
    """``f[path]``, refusing every way HDF5 offers to reach outside ``f``, and every dataset
    whose read could take more than the file holds (``check_storage``).

    External links, soft links (a dump never writes links; following one is how a crafted file
    would redirect a read), datasets whose bytes live in another file (external storage) and
    virtual datasets (mapped from other files) are all refused, so a dump can only ever make
    xray read bytes that are inside the file the user named.
    """
    where = f"{f.filename}:{path}"
    parts = str(path).strip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafeDatasetError(f"{where}: refused: not the path of a dataset")
    node = ""
    try:
        for part in parts:
            node = f"{node}/{part}"
            link = f.get(node, getlink=True)
            if link is None:
                raise KeyError(f"{where}: no such dataset")
            if not isinstance(link, h5py.HardLink):
                raise UnsafeDatasetError(f"{where}: refused: {node} is a {type(link).__name__}, not stored in the file")
        ds = f[path]
    except (OSError, RuntimeError, TypeError) as e:  # HDF5 on a damaged or odd name
        raise UnsafeDatasetError(f"{where}: unreadable ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(ds, h5py.Dataset):
        raise UnsafeDatasetError(f"{where}: not a dataset (a {type(ds).__name__})")
    if ds.is_virtual:
        raise UnsafeDatasetError(f"{where}: refused: a virtual dataset (its bytes are mapped from other files)")
    if ds.external:
        raise UnsafeDatasetError(f"{where}: refused: external storage (its bytes live in another file)")
    check_storage(ds, where)
    return ds


def check_storage(ds: h5py.Dataset, where: str) -> None:
    """Refuse a dataset whose read would take more bytes than its file holds.

    xray's writers store every dataset unfiltered (no compression), so the budget of a read is
    exact: the bytes it returns are bytes of the file. A filter (a gzip chunk that inflates
    2 GiB from a few KB), a chunk larger than its dataset (read whole to return 48 values), or
    a size the file cannot hold (a header that declares gigabytes in a file of kilobytes, or
    storage never written) is refused before any byte is read."""
    plist = ds.id.get_create_plist()
    if plist.get_nfilters():
        names = [plist.get_filter(i)[3].decode(errors="replace") or str(plist.get_filter(i)[0])
                 for i in range(plist.get_nfilters())]
        raise UnsafeDatasetError(f"{where}: refused: filtered storage ({', '.join(names)}); "
                                 "xray writes datasets unfiltered")
    if ds.chunks is not None and any(c > max(n, 1) for c, n in zip(ds.chunks, ds.shape)):
        raise UnsafeDatasetError(f"{where}: refused: chunks of {list(ds.chunks)} for a dataset of {list(ds.shape)}")
    nbytes = ds.size * ds.dtype.itemsize
    if nbytes:
        stored, size = ds.id.get_storage_size(), ds.file.id.get_filesize()
        if stored < nbytes or stored > size:
            raise UnsafeDatasetError(f"{where}: refused: declares {nbytes} bytes, {stored} stored, "
                                     f"in a file of {size} bytes")


def check_dataset(ds: h5py.Dataset, shape: tuple[int, ...], dtype: str, where: str) -> h5py.Dataset:
    """``ds`` if it can hold the recorded tensor: numbers of the recorded dtype's width and its
    element count. A shorter dataset would otherwise be compared on its prefix, and an empty
    one pass vacuously."""
    if ds.dtype.kind not in "biufc":
        raise ValueError(f"{where}: dataset holds {ds.dtype} values, not numbers")
    numel = 1
    for n in shape:
        numel *= n
    if ds.size != numel:
        raise ValueError(f"{where}: dataset holds {ds.size} elements, the record says {numel} {list(shape)}")
    name = stored_dtype_name(ds)
    try:
        width = torch.empty((), dtype=dtype_from_name(name)).element_size()
        recorded = torch.empty((), dtype=dtype_from_name(dtype)).element_size()
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if name != dtype or width != ds.dtype.itemsize or width != recorded:
        raise ValueError(f"{where}: dataset is {name} ({ds.dtype}), the record says {dtype}")
    return ds


def read_dataset(ds) -> torch.Tensor:
    if ds.dtype.kind not in "biufc":
        raise ValueError(f"{ds.file.filename}:{ds.name}: dataset holds {ds.dtype} values, not numbers")
    name = stored_dtype_name(ds)
    arr = ds[()]
    if not isinstance(arr, np.ndarray):
        arr = np.asarray(arr)
    return from_numpy(arr, name)
