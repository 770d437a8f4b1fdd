"""The module-dump file layout (``xray-module``): names, the index table, root attributes.

Writer and reader both import these, so the layout is spelled out once (docs/format.md,
section 2). Statistics live in one compound ``index`` table per step rather than in per-dataset
attributes: a table is written in one call and read in one call, which keeps statistics-only
dumps cheap and lets readers summarise a multi-GB file without touching tensor data.
"""
from __future__ import annotations

import h5py
import numpy as np

FORMAT_NAME = "xray-module"
# 2: index column `keyword`, fixed-length strings, datasets carry only torch_dtype;
# 3: buffers (role `forward_buffers`) and index column `source` ("param:<name>" / "buffer:<name>")
FORMAT_VERSION = 3

FORWARD_ROLES = ("forward_input", "forward_params", "forward_buffers", "forward_output")
BACKWARD_ROLES = ("backward_input", "params_grad", "backward_output")
ROLES = FORWARD_ROLES + BACKWARD_ROLES
#: Roles whose tensors are the module's own state: read into Record.params, never its inputs.
STATE_ROLES = {"forward_params": "param", "forward_buffers": "buffer"}

_STR = h5py.string_dtype("utf-8")

#: One row per recorded tensor, in the order they were captured. ``seq`` groups rows into
#: module calls (records); ``data`` is the dataset path inside the file, "" if not saved;
#: ``keyword`` names the keyword argument a forward input came from ("" if positional);
#: ``source`` names a parameter or buffer by its qualified name in the model ("" otherwise).
INDEX_DTYPE = np.dtype([
    ("seq", np.int64), ("name", _STR), ("module", _STR), ("cls", _STR), ("call_index", np.int32),
    ("direction", _STR), ("role", _STR), ("key", _STR), ("dtype", _STR), ("shape", _STR),
    ("device", _STR), ("requires_grad", np.bool_),
    ("min", np.float64), ("max", np.float64), ("mean", np.float64), ("std", np.float64),
    ("nan", np.int64), ("posinf", np.int64), ("neginf", np.int64), ("numel", np.int64),
    ("data", _STR), ("keyword", _STR), ("source", _STR),
])
#: Columns a reader must not require: added after version 1 (their value there is "").
OPTIONAL_COLUMNS = frozenset({"keyword", "source"})

#: The string columns, which the writer stores as fixed-length UTF-8 (variable-length cells are
#: slow to write). Readers take both kinds (h5py hands fixed-length ones back as bytes).
_STR_COLUMNS = frozenset(n for n in INDEX_DTYPE.names if INDEX_DTYPE[n] == _STR)


_STRING_TYPES: dict[int, np.dtype] = {}  # width -> h5py fixed-length UTF-8 dtype, built once


def _string_type(width: int) -> np.dtype:
    t = _STRING_TYPES.get(width)
    if t is None:
        t = _STRING_TYPES[width] = h5py.string_dtype("utf-8", width)
    return t


# The last table's encoded string columns, by column name: (cells, encoded array). A module
# dump's steps repeat the same names, classes, shapes... so a step usually re-uses every string
# column of the one before (a tuple comparison) instead of encoding it again.
_ENCODED: dict[str, tuple[tuple, np.ndarray]] = {}


def _encode(name: str, cells: tuple) -> np.ndarray:
    hit = _ENCODED.get(name)
    if hit is not None and hit[0] == cells:
        return hit[1]
    try:  # numpy encodes ASCII itself, in one call
        column = np.array(cells, dtype=np.bytes_)
    except UnicodeEncodeError:
        column = np.array([c.encode("utf-8") for c in cells], dtype=np.bytes_)
    _ENCODED[name] = (cells, column)
    return column


def index_table(rows: list[tuple]) -> np.ndarray:
    """The index rows (tuples in INDEX_DTYPE's field order) as one structured array whose string
    columns are fixed-length UTF-8, each as wide as its longest cell."""
    if not rows:
        return np.array([], dtype=INDEX_DTYPE)
    fields, columns = [], []
    for name, column in zip(INDEX_DTYPE.names, zip(*rows)):
        if name in _STR_COLUMNS:
            column = _encode(name, column)
            fields.append((name, _string_type(max(column.dtype.itemsize, 1))))
        else:
            fields.append((name, INDEX_DTYPE[name]))
        columns.append(column)
    table = np.empty(len(rows), dtype=fields)
    for (name, _), column in zip(fields, columns):
        table[name] = column
    return table


INDEX = "index"  # the per-step table: /step_<s>/index
ATEN = "aten"  # the per-step ATen op records (dump_torch_api=True): /step_<s>/aten, JSON strings


def step_group(step: int) -> str:
    return f"step_{step}"


def module_prefix(path: str, cls: str, call_index: int) -> str:
    """``<path>.<Class>.<call>``; the root module (path "") is named by its class alone."""
    return f"{path}.{cls}.{call_index}" if path else f"{cls}.{call_index}"


def prefixed_name(prefix: str, role: str, key: str) -> str:
    """A tensor's name from its module prefix: callers naming many tensors of one call build
    the prefix once."""
    return f"{prefix}.{role}.{key}"


def rank_file_stem(global_rank: int, local_rank: int) -> str:
    return f"globalrank-{global_rank}_localrank-{local_rank}"
