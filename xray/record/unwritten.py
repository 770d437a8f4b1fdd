"""Memory written before it is read: which recorded tensors hold values no call has written yet.

Why: ``k = x.new_empty(...); k[..., :d] = a; k[..., d:] = b`` (DeepSeek-V3's key; ``empty_like``
then ``index_put_`` in a MoE un-permute; ``out=`` buffers) records the slice views, and the
buffer the copies write into, before the copies: their statistics describe whatever the
allocator returned, and two identical runs differ there. Such a tensor is recorded with the
note ``UNWRITTEN`` instead of statistics (docs/format.md), and compare skips it.

The rule, per storage, exact to the element:

- the result of an allocating op (``ALLOCATING``: ``empty``, ``new_empty``, ``empty_like``,
  ``empty_strided``...) starts a mask of its storage's elements, all unwritten;
- a call that writes an argument (its schema's ``is_write`` alias info: ``copy_``,
  ``index_put_``, ``fill_``, ``out=``...) marks the elements that argument views as written;
  an ``index_put_`` or scatter marks its whole destination (its indices are not read);
- a described tensor is unwritten when any element it views is: the buffer before its last
  copy, a slice taken before its copy (the second slice too, taken after the first copy);
- a call that computes from unwritten elements of a tracked tensor (not a view, not an allocation, not
  the written argument of a write) shows that something this recorder did not see wrote it (a
  Triton kernel launched on the buffer, an extension): its storage counts as written from then
  on. A program that truly computes on garbage is then compared as before;
- once every element is written (or the buffer is gone), the storage is forgotten;
- ops whose schemas do not declare what they write (``UNDECLARED``: c10d's collectives write
  their output tensors, FSDP2's ``all_gather_copy_in`` copies this rank's shard into its slice of
  the all-gather buffer) are read by that table: the written arguments are not read, and the
  buffer stays unwritten where the call did not write it;
- a storage re-allocated in place (``untyped_storage().resize_``, how FSDP2 frees and re-creates
  its unsharded parameters between forward and backward) is uninitialised like an allocation's:
  no dispatched op shows it, so the recorder watches ``UntypedStorage.resize_`` while recording.

What it misses: a write through a view of another element size than the allocation (a uint8
view of a float buffer) counts as writing the whole storage; a buffer that an unseen kernel
writes reads as unwritten through the views taken before its first compute read.

Cost: nothing while no buffer is tracked (the recorder's C path checks that the table is empty);
while one is, every call goes to the Python path, and each tracked tensor costs a masked
``all`` (a device sync on an accelerator), each write a masked fill.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from ..dump.model import UNWRITTEN
from ..ops.reads import SHAPE_ONLY as _SHAPE_ONLY
from .encode import OpInfo, bind_inputs, op_info
from .flatten import PLAIN_TENSORS as _PLAIN

# aten op names (every overload) whose result is uninitialised memory (xray/ops/nondeterminism.py
# lists the same for compare, with resize_)
ALLOCATING = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})
# In-place ops that change a tensor's metadata, not its values (their schemas say they write).
_METADATA_WRITES = frozenset({"resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_", "squeeze_",
                              "unsqueeze_", "swapdims_", "swapaxes_", "detach_", "requires_grad_"})

# Ops whose schemas do not say what they write: op name -> (arguments they write and do not read,
# indices of results that are the slice they wrote). c10d's collectives mark nothing as written;
# FSDP2's all_gather_copy_in writes this rank's slice of ``all_gather_output`` (its result 0).
UNDECLARED: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "c10d._allgather_base_.default": (("output_tensor",), ()),
    "c10d._reduce_scatter_base_.default": (("output_tensor",), ()),
    "c10d.allgather_.default": (("output_tensors",), ()),
    "c10d.reduce_scatter_.default": (("output_tensors",), ()),
    "c10d.allgather_into_tensor_coalesced_.default": (("outputs",), ()),
    "c10d.reduce_scatter_tensor_coalesced_.default": (("outputs",), ()),
    "c10d.recv_.default": (("tensors",), ()),
    "fsdp.all_gather_copy_in.default": ((), (0,)),
}
_UNREAD: dict[str, tuple[str, ...]] = {"fsdp.all_gather_copy_in.default": ("all_gather_output",)}

__all__ = ["ALLOCATING", "UNDECLARED", "UNWRITTEN", "Unwritten"]


class _Kind:
    """What a call does to the memory of its tensors, from its op alone (cached per OpInfo)."""

    __slots__ = ("allocates", "view", "reads", "writes", "unread", "wrote_results")

    def __init__(self, info: OpInfo) -> None:
        packet = info.name.split(".")[1] if info.name.startswith("aten.") else ""
        self.allocates = packet in ALLOCATING
        self.view = info.view
        self.writes = () if packet in _METADATA_WRITES else info.mutates
        self.reads = not (self.allocates or self.view or packet in _SHAPE_ONLY or packet in _METADATA_WRITES)
        undeclared, self.wrote_results = UNDECLARED.get(info.name, ((), ()))
        self.writes = tuple(self.writes) + tuple(n for n in undeclared if n not in self.writes)
        self.unread = _UNREAD.get(info.name, ())  # arguments whose values the call never reads


_KINDS: dict[int, tuple[Any, _Kind]] = {}


def _kind(func) -> _Kind:
    hit = _KINDS.get(id(func))
    if hit is not None and hit[0] is func:
        return hit[1]
    kind = _Kind(op_info(func))
    _KINDS[id(func)] = (func, kind)
    return kind


def allocates(func) -> bool:
    """Whether ``func`` returns uninitialised memory (the C path leaves such calls to Python)."""
    return _kind(func).allocates


class _Buffer:
    """One tracked storage: a weak reference to the tensor that allocated it (its views hold it
    through ``_base``) or to the storage re-allocated in place, its size, and a mask of written
    elements (the allocation's element size; a re-allocated storage's, that of its first view)."""

    __slots__ = ("owner", "nbytes", "itemsize", "mask")

    def __init__(self, t: torch.Tensor | None, nbytes: int, storage: Any = None) -> None:
        if t is not None:
            self.owner = weakref.ref(t)
            self.itemsize = t.element_size()
            self.mask = torch.zeros(nbytes // self.itemsize, dtype=torch.bool, device=t.device)
        else:
            from torch.multiprocessing.reductions import StorageWeakRef

            ref = StorageWeakRef(storage)
            self.owner = lambda: None if ref.expired() else True
            self.itemsize, self.mask = None, None
        self.nbytes = nbytes

    def view(self, t: torch.Tensor) -> torch.Tensor | None:
        """The mask of the elements ``t`` views; None where its element size does not divide
        into the allocation's (counted as the whole storage)."""
        size = t.element_size()
        if self.mask is None:
            if self.nbytes % size:
                return None
            self.itemsize = size
            self.mask = torch.zeros(self.nbytes // size, dtype=torch.bool, device=t.device)
        if size == self.itemsize:
            return self.mask.as_strided(t.shape, t.stride(), t.storage_offset())
        if size % self.itemsize:
            return None
        n = size // self.itemsize
        return self.mask.as_strided((*t.shape, n), tuple(s * n for s in t.stride()) + (1,), t.storage_offset() * n)


class Unwritten:
    """The storages allocated uninitialised and not yet wholly written, by storage address;
    ``flagged``: ids of the tensors of the call being described that are recorded unwritten."""

    def __init__(self) -> None:
        self.buffers: dict[int, _Buffer] = {}  # never replaced: the C path reads its size
        self.flagged: set[int] | None = None

    def wants(self, func) -> bool:
        """Whether the call needs looking at: a buffer is tracked, or it allocates one."""
        return bool(self.buffers) or _kind(func).allocates

    def forget_all(self) -> None:
        """Calls ran unseen (recording paused): whatever they wrote is data from now on."""
        self.buffers.clear()
        self.flagged = None

    def before(self, func, args: tuple, kwargs: dict) -> None:
        """Before the call: a value read counts as written (see the module docstring), then the
        inputs that still view unwritten memory are flagged."""
        kind = _kind(func)
        if not self.buffers:
            self.flagged = None
            return
        tensors = _tensors((args, kwargs))
        written = self._written_args(func, kind, args, kwargs) if kind.writes else ()
        if kind.reads:
            unread = _tensors([bind_inputs(op_info(func), args, kwargs).get(n) for n in kind.unread]) if kind.unread else ()
            for t in tensors:
                if not any(t is w for w in (*written, *unread)):
                    self._forget(t)
        self.flagged = {id(t) for t in tensors if self._unwritten(t)} or None

    def after(self, func, args: tuple, kwargs: dict, out: Any) -> None:
        """After the call: a new buffer is tracked, written arguments are marked, and the
        results that view unwritten memory are flagged."""
        kind = _kind(func)
        if kind.allocates:
            for t in _tensors(out):
                self._track(t)
        if kind.writes and self.buffers:
            for t in self._written_args(func, kind, args, kwargs):
                self._wrote(t)
        if kind.wrote_results and self.buffers:
            results = out if isinstance(out, (list, tuple)) else (out,)
            for i in kind.wrote_results:
                if i < len(results) and isinstance(results[i], torch.Tensor):
                    self._wrote(results[i])
        self.flagged = ({id(t) for t in _tensors(out) if self._unwritten(t)} or None) if self.buffers else None

    def done(self) -> None:
        self.flagged = None

    def resized(self, storage: Any, before: int) -> None:
        """``storage`` was resized in place from ``before`` bytes: grown, its new memory is
        uninitialised (resizing re-allocates; what it held is copied, which FSDP2 never needs,
        freeing to 0 first)."""
        try:
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return
        self.buffers.pop(key, None)
        if key and nbytes > 0 and before == 0 and storage.device.type != "meta":
            self.buffers[key] = _Buffer(None, nbytes, storage)

    # -- per tensor ----------------------------------------------------------------------------
    @staticmethod
    def _written_args(func, kind: _Kind, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        bound = bind_inputs(op_info(func), args, kwargs)
        return _tensors([bound.get(n) for n in kind.writes])

    def _buffer(self, t: torch.Tensor) -> tuple[int, _Buffer] | None:
        if type(t) not in _PLAIN or t.layout != torch.strided or t.is_meta:
            return None
        try:
            storage = t.untyped_storage()
            key = storage.data_ptr()
        except (RuntimeError, NotImplementedError):
            return None
        buf = self.buffers.get(key)
        if buf is None:
            return None
        if buf.owner() is None or storage.nbytes() != buf.nbytes:  # freed: the address is another storage's
            del self.buffers[key]
            return None
        return key, buf

    def _track(self, t: torch.Tensor) -> None:
        if type(t) not in _PLAIN or t.layout != torch.strided or t.is_meta or t.numel() == 0:
            return
        try:
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return
        if key and nbytes % t.element_size() == 0:
            self.buffers[key] = _Buffer(t, nbytes)

    def _unwritten(self, t: torch.Tensor) -> bool:
        hit = self._buffer(t)
        if hit is None:
            return False
        mask = hit[1].view(t)
        return mask is not None and mask.numel() > 0 and not bool(mask.all())

    def _wrote(self, t: torch.Tensor) -> None:
        hit = self._buffer(t)
        if hit is None:
            return
        key, buf = hit
        mask = buf.view(t)
        if mask is None:
            del self.buffers[key]
            return
        mask.fill_(True)
        if bool(buf.mask.all()):
            del self.buffers[key]

    def _forget(self, t: torch.Tensor) -> None:
        """``t`` is read: where it views unwritten elements, something unseen wrote them (a read of
        elements already written, such as FSDP2's all-gather input inside its output buffer,
        tells nothing)."""
        hit = self._buffer(t)
        if hit is not None and self._unwritten(t):
            del self.buffers[hit[0]]


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (arguments, results), lists and dicts walked."""
    out: list[torch.Tensor] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
    return out
