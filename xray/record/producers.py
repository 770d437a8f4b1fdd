"""Where each live tensor's value came from: the data edges of the format's ``src`` (v2).

The tracer registers every op call's output tensors under the call's sequence number, and the
module stack registers each entered module's parameters and buffers under their qualified
names. Looking a tensor up then names its producer: ``op:<seq>:<k>``, ``param:<name>``,
``buffer:<name>``, or ``input`` for anything never registered (model inputs, tensors made
before recording, or made by code the recorder does not see).

Identity is the Python tensor object, checked through a weak reference, so the map keeps no
tensor alive and an ``id`` reused by a new object never inherits a dead one's producer. The
data pointer is checked too: ``x.data = y`` swaps the storage under the same object without an
ATen call, and the old producer no longer describes the value (it then reads as ``input``).
In-place and ``out=`` calls return their mutated tensor, so registering outputs makes the
mutating call its latest producer. A base written through a view (``x[0].zero_()``, DeepSeek-V3's
key filled slice by slice: ``k[..., :d].copy_(a)``) takes the writing call as its producer too
(``wrote_through``: the written view's output index names it), so later reads of the base follow
the last writer, and what it wrote (precision lost upstream) is carried through; the base named
is the view's ``_base`` (the root of its views), not an intermediate view of it. Module state keeps its name even when an in-place call
updates it (an optimizer step, running statistics): to compare runs, a parameter is the edge.

Each entry also keeps its producer's *role*, what de-dup keys a call by (``roles``): the producing
op's name (with its output's index past the first: ``OpInfo.roles``), or "param"/"buffer".

xray/record/_fastpath.c mirrors ``entry_of``, ``produced`` and ``roles`` for the recorder's common call, on
this same table (it reads ``_by_id`` afresh each time: a sweep replaces it): a change to these
rules is a change there too; tests/test_record_rows.py compares the two. (``wrote_through`` runs
in Python only: the C path hands every writing call's result to Python, and calls this method
for the writing calls it folds.)
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from .flatten import PLAIN_TENSORS as _PLAIN
from .sharded import is_dtensor

# ``k`` counts the call's output tensors in order, a Tensor[] output's items one by one (the
# order of Record.output_tensors()); non-tensor outputs (None, numbers) are skipped.
# (weakref to the tensor, seq or "param:..."/"buffer:...", k, data_ptr, role): one flat tuple;
# role: an ``OpInfo.roles`` item (the producing op's name), or "param"/"buffer"
_Entry = tuple
# the role of a tensor no entry names (a model input, or made where the recorder did not see)
INPUT_ROLE = "input"


def _data_ptr(t: torch.Tensor) -> int | None:
    try:
        return t.data_ptr()
    except RuntimeError:  # sparse, nested and wrapper-subclass tensors have no single pointer
        return None


class Producers:
    """id(tensor) -> (weak reference, source, data pointer); dead entries swept as it grows."""

    def __init__(self) -> None:
        self._by_id: dict[int, _Entry] = {}
        self._sweep_at = 4096

    def source_of(self, t: torch.Tensor) -> str:
        entry = self.entry_of(t)
        if entry is None and is_dtensor(t):
            # wrapped around its shard without a call (DTensor's backward re-wraps each incoming
            # gradient, from_local): the values are the shard's, whose producer was recorded
            entry = self.entry_of(t._local_tensor)
        if entry is None:
            return "input"
        src = entry[1]
        return src if type(src) is str else f"op:{src}:{entry[2]}"

    def entry_of(self, t: torch.Tensor) -> _Entry | None:
        """The live entry naming ``t``'s producer (its ``[1]``: a seq, or "param:..."/"buffer:...";
        its ``[2]``: the output index; its ``[4]``: the role), or None when ``t`` is a model input."""
        entry = self._by_id.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        try:
            if t.data_ptr() != entry[3]:
                return None
        except RuntimeError:  # no single data pointer (see _data_ptr)
            if entry[3] is not None:
                return None
        return entry

    def op_source(self, t: Any) -> tuple[int, int]:
        """(seq, k) of the op call that produced ``t``; (-1, -1) when ``t`` is no tensor, or came
        from a parameter, a buffer or outside the recorded calls (a de-dup fold's first argument)."""
        entry = self.entry_of(t) if isinstance(t, torch.Tensor) else None
        if entry is None or type(entry[1]) is str:
            return -1, -1
        return entry[1], entry[2]

    def roles(self, args: tuple, kwargs: dict) -> tuple:
        """What produced each tensor argument, in argument order (a list's items, keyword values
        after): its op's name (``OpInfo.roles``), "param", "buffer" or "input". Part of a call's de-dup identity
        (encode.dedup_key): a kind of producer, not a call, so a loop's later steps still fold.
        Hot under de-dup (every call), so plain tensors are looked up inline."""
        roles: list = []
        for a in args:
            if type(a) in _PLAIN:
                entry = self.entry_of(a)
                roles.append(INPUT_ROLE if entry is None else entry[4])
            elif type(a) is list or type(a) is tuple or isinstance(a, torch.Tensor):
                self._roles(a, roles)
        if kwargs:
            for a in kwargs.values():
                self._roles(a, roles)
        return tuple(roles)

    def _roles(self, a: Any, roles: list) -> None:
        if isinstance(a, torch.Tensor):
            entry = self.entry_of(a)
            roles.append(INPUT_ROLE if entry is None else entry[4])
        elif type(a) is list or type(a) is tuple:
            for x in a:
                self._roles(x, roles)

    def produced(self, seq: int, roles: tuple[str, ...], out: Any, writes: bool = False) -> None:
        """The output tensors of call ``seq`` (its raw result) now hold its values, each in its
        role (its op's ``OpInfo.roles``: item i of a tuple result takes ``roles[i]``, a Tensor[]
        result's items ``roles[0]``); ``writes`` (an in-place or ``out=`` call): so do the bases
        of those that are views (``wrote_through``). Hot: runs for every call, de-duplicated ones
        included, so exact types are tried first."""
        kind = type(out)
        if kind in _PLAIN:
            self._produce(out, seq, 0, roles[0])
        elif kind is tuple or kind is list:
            k = 0
            for i, o in enumerate(out):
                role = roles[i] if i < len(roles) else roles[0]
                if type(o) in _PLAIN or isinstance(o, torch.Tensor):
                    self._produce(o, seq, k, role)
                    k += 1
                elif isinstance(o, (list, tuple)):
                    for x in o:
                        if isinstance(x, torch.Tensor):
                            self._produce(x, seq, k, role)
                            k += 1
        elif isinstance(out, torch.Tensor):  # a subclass
            self._produce(out, seq, 0, roles[0])
        if writes:
            self.wrote_through(seq, roles, out)

    def wrote_through(self, seq: int, roles: tuple[str, ...], out: Any) -> None:
        """Call ``seq`` wrote its results (in-place, ``out=``; ``produced`` came first): each one
        that is a view names the call as its base's producer too, under the view's index ``k``."""
        kind = type(out)
        items = out if kind is tuple or kind is list else (out,)
        flat = [x for o in items for x in (o if isinstance(o, (list, tuple)) else (o,)) if isinstance(x, torch.Tensor)]
        for k, view in enumerate(flat):  # k counts output tensors as ``produced`` does
            base = getattr(view, "_base", None)
            if base is not None and type(base) in _PLAIN:
                self._produce(base, seq, k, roles[0])

    def _produce(self, t: torch.Tensor, seq: int, k: int, role: str) -> None:
        by_id = self._by_id
        key = id(t)
        entry = by_id.get(key)
        if entry is not None and type(entry[1]) is str and entry[0]() is t:
            return  # module state mutated in place keeps its name
        try:
            ptr = t.data_ptr()
        except RuntimeError:  # see _data_ptr
            ptr = None
        by_id[key] = (weakref.ref(t), seq, k, ptr, role)
        if len(by_id) > self._sweep_at:
            self._sweep()

    def name_state(self, t: Any, kind: str, name: str) -> None:
        """``t`` is module state: ``kind`` "param" or "buffer", ``name`` its qualified name."""
        self.name_source(t, f"{kind}:{name}")

    def name_source(self, t: Any, src: str) -> None:
        """``t`` is module state named ``src`` ("param:<name>" or "buffer:<name>"); the module
        stack calls this at every module entry, with the same string object each time."""
        if type(t) not in _PLAIN and not isinstance(t, torch.Tensor):  # a buffer slot registered as None
            return
        entry = self._by_id.get(id(t))
        if entry is None or entry[1] != src or entry[0]() is not t or entry[3] != _data_ptr(t):
            self._by_id[id(t)] = (weakref.ref(t), src, 0, _data_ptr(t), "param" if src.startswith("param:") else "buffer")

    def _sweep(self) -> None:
        self._by_id = {k: e for k, e in self._by_id.items() if e[0]() is not None}
        self._sweep_at = max(4096, 2 * len(self._by_id))
