"""A dump only makes xray read bytes inside it, and no more bytes than its files hold (issue 31,
items 7, 8, 9 and 12).

Every case is a real recording with one file made hostile: a segment that is a symlink out of
the folder, a data reference to the HDF5 root, a gzip chunk far larger than its dataset, index
datasets that declare gigabytes in a file of kilobytes. Each is refused in one line, before any
byte is read or inflated.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import xray
from xray.dump import DumpFormatError
from xray.dump.tensorio import UnsafeDatasetError


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with torch.no_grad(), xray.dump(dump_dir=tmp_path_factory.mktemp("rec"), X_DEDUP=False, X_DUMP_NUM=100) as d:
        model(torch.randn(3, 8))
    return d.folder


@pytest.fixture
def dump_copy(recorded, tmp_path) -> Path:
    folder = tmp_path / "dump"
    shutil.copytree(recorded, folder)
    return folder


def _saved(folder: Path):
    dump = xray.load_dump(folder)
    metas = [m for r in dump.records for _, m in (*r.input_tensors(), *r.output_tensors()) if m.data]
    dump.close()
    return metas


def test_a_segment_symlinked_out_of_the_dump_is_refused(dump_copy, tmp_path):
    """The old reader followed the link: load_tensor and xray-gen --factory load returned the
    outside file's values."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for seg in dump_copy.glob("tensors-*.h5"):
        with h5py.File(seg, "r+") as f:  # the outside copy holds other values
            f.visititems(lambda n, o: o.__setitem__(..., np.full(o.shape, 7, o.dtype))
                         if isinstance(o, h5py.Dataset) else None)
        shutil.move(seg, outside / seg.name)
        seg.symlink_to(outside / seg.name)
    meta = _saved(dump_copy)[0]
    dump = xray.load_dump(dump_copy)
    with pytest.raises(DumpFormatError, match="outside the dump folder"):
        dump.load_tensor(meta)
    from xray.gen.cli import main as gen_main

    assert gen_main([str(dump_copy), "-o", str(tmp_path / "gen"), "-q", "--factory", "load"]) != 0
    assert not list((tmp_path / "gen").glob("data/*.h5"))


def test_a_symlink_inside_the_dump_is_followed(dump_copy):
    """A link that stays in the folder is the folder's own bytes: allowed."""
    seg = next(dump_copy.glob("tensors-*.h5"))
    seg.rename(dump_copy / "moved.h5")
    seg.symlink_to("moved.h5")
    for meta in _saved(dump_copy):
        xray.load_dump(dump_copy).load_tensor(meta)


def test_a_data_reference_to_the_hdf5_root_is_one_error(dump_copy):
    seg = next(dump_copy.glob("tensors-*.h5")).name
    dump = xray.load_dump(dump_copy)
    with pytest.raises(UnsafeDatasetError, match="not the path of a dataset"):
        dump.load_tensor(f"{seg}:/")
    with pytest.raises((UnsafeDatasetError, KeyError)):  # either way, one line naming the file
        dump.load_tensor(f"{seg}:r0//x")


def test_a_gzip_chunk_larger_than_its_dataset_is_refused_before_inflating(dump_copy):
    """48 floats stored as one gzip chunk of 2^22: the old reader inflated the whole chunk."""
    metas = _saved(dump_copy)
    fname, path = metas[0].data.split(":", 1)
    with h5py.File(dump_copy / fname, "r+") as f:
        data, attrs = f[path][()], dict(f[path].attrs)
        del f[path]
        ds = f.create_dataset(path, data=data.reshape(-1), maxshape=(None,), chunks=(1 << 22,), compression="gzip")
        ds.attrs.update(attrs)
    with pytest.raises(UnsafeDatasetError, match="refused"):
        xray.load_dump(dump_copy).load_tensor(metas[0].data)


def _index_file(folder: Path) -> Path:
    return folder / json.loads((folder / "dump.json").read_text())["index"]


def _replace(folder: Path, name: str, make) -> None:
    with h5py.File(_index_file(folder), "r+") as f:
        rows = f[name].attrs.get("rows")
        del f[name]
        make(f)
        if rows is not None:
            f[name].attrs["rows"] = rows


INDEX_BOMBS = {
    # declared, never written: reading them would allocate (and fill) all of it
    "strings blob of 4 GiB": ("strings", lambda f: f.create_dataset("strings", shape=(4 << 30,), dtype="u1")),
    "string_ends of 300M entries": ("string_ends", lambda f: f.create_dataset("string_ends", shape=(300_000_000,),
                                                                                 dtype="<i8")),
    "records table gzip-compressed": ("records", None),
}


@pytest.mark.parametrize("case", sorted(INDEX_BOMBS))
def test_index_datasets_that_declare_more_than_the_file_holds_are_refused(dump_copy, case):
    name, make = INDEX_BOMBS[case]
    if make is None:  # a filter the writer never uses: a gzip bomb inflates gigabytes from kilobytes
        with h5py.File(_index_file(dump_copy), "r") as f:
            blob = f[name][()]
        make = lambda f: f.create_dataset(name, data=blob, compression="gzip")  # noqa: E731
    _replace(dump_copy, name, make)
    with pytest.raises(DumpFormatError, match="refused") as err:
        xray.load_dump(dump_copy)
    assert "\n" not in str(err.value) and str(_index_file(dump_copy)) in str(err.value)


def test_the_recording_itself_reads_back(recorded):
    """The checks leave real dumps alone: every saved tensor loads, equal to its statistics."""
    dump = xray.load_dump(recorded)
    for meta in _saved(recorded):
        t = dump.load_tensor(meta)
        assert t.shape == tuple(meta.shape) and float(t.min()) == pytest.approx(meta.stats.min)
