"""The recorder's general path: every op call goes straight to index cells, with no Record in between.

Why: building a ``Record`` per call (with a ``TensorMeta`` and ``Stats`` per tensor, dicts and
lists) and converting it to columns at flush was most of the cost of full recording, and those
objects kept the garbage collector busy. Here a call becomes one tuple for its record and three
flat tuples per tensor (layout, statistics, source), appended to the writer's pending chunk.
Everything a call can carry is written this way: saved tensors (X_DUMP_NUM, copied before an
in-place call changes its inputs), Python stacks (STACK), collectives (waited for, every
argument forgotten by the cache), tensor subclasses, values of any kind (keyed by their
encoding), and records without tensors (neither META nor STATS).

What depends only on the *shape* of a call (the op, its non-tensor arguments, the structure of
its result) is worked out once, as a ``Plan``: the skeleton string and each tensor's role and
name, taken from the data model's encoding (``Recorder.skeleton_record``, a call with every
tensor a placeholder), so this path writes what a reader's ``Record`` holds. Statistics come
from the recorder's one cache, as cells (``stats_row``).

The common call (plain tensors and values, META and STATS on, no saved tensors or stacks) is
taken by the same steps in C (``_fastpath.c``, built by pip install where a compiler is;
``native_path``), over this module's own state: its plans, texts, cache entries and data edges
are the ones these methods make, each op's facts are ``op_facts``' (the rules stay here and in
``cache_rules``), and whatever the C code does not take it hands to them.
``XRAY_NATIVE_ROWS=0`` switches it off. Either way the index is the same
(tests/test_record_rows.py, against the Record encoding too: ``XRAY_ROW_PATH=0``).
"""
from __future__ import annotations

import functools
import json
import os
import warnings
from typing import Any

import torch

from ..dump.column_builder import shape_text, skeleton_of, source_cells, stack_text
from ..dump.columns import DIRECTIONS, NONE, SRC_INPUT, SRC_NONE, SRC_OP
from ..dump.stats import NO_STATS, norm_of
from ..dump.tensorio import dtype_name
from .cache_rules import cache_view_outputs, forget_written, reuse_input_stats, same_values
from ..dump.model import TensorMeta, value_to_json
from .encode import ATOMS as _ATOMS, bind_inputs, encode_value, noted_meta, not_saved, op_info, stable_repr, unsupported
from .flatten import PLAIN_TENSORS as _PLAIN
from .self_check import checked, self_checks
from .unwritten import UNWRITTEN, allocates

# Non-tensor argument types keyed by value (hashable, with an exact equality).
_VALUES = frozenset({torch.dtype, torch.device, torch.layout, torch.memory_format})
_KEYED = _ATOMS | _VALUES
_TENSOR = ("T",)
_FORWARD, _BACKWARD = DIRECTIONS.index("forward"), DIRECTIONS.index("backward")
_INPUT_SOURCE = (SRC_INPUT, 0, 0, NONE)


class _Noted(Exception):
    """A tensor the recorder cannot read (``unsupported``): described by a note."""

    def __init__(self, why: str) -> None:
        self.why = why


class Plan:
    """What every call of one shape shares: its op's and skeleton's strings, its tensors' roles and names."""

    __slots__ = ("op", "skeleton", "roles", "names")

    def __init__(self, op: int, skeleton: int, roles: tuple[int, ...], names: tuple[int, ...]) -> None:
        self.op, self.skeleton, self.roles, self.names = op, skeleton, roles, names


class RowCall:
    """A call between ``before`` and ``after``: its inputs' cells, taken before it ran; ``key``
    the shape of its arguments (for the plan), ``signature`` its de-dup key (None without)."""

    __slots__ = ("info", "seq", "direction", "frames", "key", "signature", "args", "kwargs",
                 "layouts", "stats", "sources", "notes", "outs", "data", "stack")


try:  # the common call in C (xray/record/_fastpath.c), built by pip install where a compiler is
    from . import _fastpath
except ImportError:
    _fastpath = None
else:  # one RowCall type, so that calls the C path hands back pass Recorder._after's type test
    RowCall = _fastpath.RowCall  # noqa: F811
# "0": no C path even where it is built (the Python row path takes every call; same index).
NATIVE_ENV = "XRAY_NATIVE_ROWS"
# What the C path answers for a call it leaves to the Recorder (nothing done yet)
FALLBACK = None if _fastpath is None else _fastpath.FALLBACK


class RowPath:
    """Turns op calls into rows of ``writer``'s index, sharing the recorder's statistics cache
    and producer map."""

    def __init__(self, recorder, writer) -> None:
        self.recorder = recorder
        self.writer = writer
        self.intern = writer.strings.intern
        self.meta_on = recorder.meta_on
        self.stats_on = recorder.stats_on
        self._plans: dict[tuple, Plan] = {}
        self._dims: dict[tuple, int] = {}  # a shape or stride -> its text's id
        self._dtypes: dict[torch.dtype, int] = {}
        self._devices: dict[torch.device, int] = {}
        self._cpu = self.intern("cpu")
        self._frames: dict[tuple, tuple[int, int]] = {}  # module stack -> (module id, stack id)
        self._state: dict[str, tuple] = {}  # "param:<name>" -> its source cells
        self._cache = recorder._stats
        self.unwritten = recorder.unwritten  # its ``flagged``: the call's tensors recorded unwritten
        self._describe = self._cache.describe
        self._fast = self.meta_on and self.stats_on  # _new_output's one-step case
        self.described = self.meta_on or self.stats_on  # else a record names its op only
        self.dump_num = recorder.config.dump_num  # tensors copied per call: so many inputs, so many outputs
        self.stack_depth = recorder.config.stack_depth

    # -- before the call: inputs, described before an in-place op changes them ----------------
    def before(self, func, info, args: tuple, kwargs: dict, seq: int, backward: bool, frames: list,
               stack: list[str] | None = None, signature: tuple | None = None) -> RowCall:
        """The pending call: its inputs described (and copied, up to the recorder's
        ``tensor_budget``) before it runs, since an in-place op changes them; ``stack`` the user's
        Python frames (STACK); ``signature`` its de-dup key."""
        call = RowCall()
        call.layouts, call.stats, call.sources, call.notes, call.data = [], [], [], None, None
        parts = [info]  # the op, hashed by identity
        if self.described:
            for a in args:  # the common kinds inline (this runs for every call)
                kind = type(a)
                if kind in _PLAIN:
                    self._tensor(a, call, self._source(a))
                    parts.append(_TENSOR)
                elif kind in _KEYED:
                    parts.append((kind, a))
                else:
                    parts.append(self._input(a, call))
            if kwargs:
                parts += [(name, self._input(a, call)) for name, a in kwargs.items()]
        call.info, call.seq, call.frames, call.signature = info, seq, tuple(frames), signature  # the stack as it is now
        call.direction = _BACKWARD if backward else _FORWARD
        call.key = tuple(parts)
        call.args, call.kwargs, call.stack = args, kwargs, stack
        if self.dump_num and (budget := self.recorder.tensor_budget(signature)):
            self._save(call, "in", bind_inputs(info, args, kwargs), 0, budget)
        return call

    def _input(self, a: Any, call: RowCall) -> Any:
        """``a``'s part of the plan key; its tensors' cells go into ``call``. A value of another
        kind (a SymInt, an opaque object) is keyed by its encoding, which its skeleton holds."""
        kind = type(a)
        if kind in _PLAIN:
            self._tensor(a, call, self._source(a))
            return _TENSOR
        if kind in _KEYED:
            return (kind, a)
        if kind is float:  # 1.0 == 1 == True and NaN != NaN in a dict: keyed by text
            return (kind, repr(a))
        if kind is list or kind is tuple:
            return (kind, tuple([self._input(x, call) for x in a]))
        if isinstance(a, torch.Tensor):  # a subclass (DTensor, a wrapper): described all the same
            self._tensor(a, call, self._source(a))
            return _TENSOR
        return (kind, _encoded_text(a))

    def _source(self, t: torch.Tensor) -> tuple:
        entry = self.recorder.producers.entry_of(t)
        if entry is None:
            return _INPUT_SOURCE
        src = entry[1]
        if type(src) is int:
            return (SRC_OP, src, entry[2], NONE)
        return self._state_cells(src)

    def _state_cells(self, src: str) -> tuple:
        cells = self._state.get(src)  # "param:<name>", "buffer:<name>"
        if cells is None:
            cells = self._state[src] = source_cells(src, self.writer.strings)
        return cells

    def _new_output(self, t: torch.Tensor, call: RowCall) -> bool:
        """Describe and cache a call's single result in one step, when it is a new plain tensor
        (nearly always): its input's statistics where the op keeps its values
        (``reuse_input_stats``), else its own; cached under its base's stamp for a view
        (``cache_view_outputs``), else under its own. False: the caller takes the general steps,
        which give the same cells and cache entry."""
        if not self._fast or type(t) is not _TENSOR_TYPE or self.unwritten.flagged is not None:
            return False
        info = call.info
        args = call.args
        first = args[0] if args else None
        cache = self._cache
        try:
            if cache.holds(t):  # an existing tensor (lift_fresh returns its input)
                return False
            stamp = cache.stamp
            if info.view:
                if type(first) not in _PLAIN:
                    return False
                version = stamp(first)
            else:
                version = stamp(t) if t.is_inference() else t._version
            if version is None:
                return False
            ptr = t.data_ptr()
            layout = self._layout(t)
            if (info.stats_preserving and type(first) in _PLAIN and not (call.notes and 0 in call.notes)
                    and same_values(first, t)):
                stats = cache.resample(call.stats[0], t)  # the same values, at t's own sample positions
            else:
                stats = cache.compute(t)
        except Exception:  # noqa: BLE001 - a noted or exotic tensor: the general steps note it
            return False
        cache.store(t, version, ptr, stats, layout)
        call.layouts.append(layout + (t.requires_grad,))
        call.stats.append(stats)
        call.sources.append(_NO_SOURCE)
        return True

    def _tensor(self, t: torch.Tensor, call: RowCall, source: tuple) -> None:
        """Append ``t``'s layout, statistics and source cells: what the Record path's ``_meta``
        and ``tensor_meta`` write, cell for cell. Layout and statistics are cached together
        under the tensor's version (an in-place op, metadata ones too, bumps it); whether it
        requires grad is read each time (``requires_grad_()`` bumps nothing). A tensor viewing
        memory not yet written is described by the ``UNWRITTEN`` note (unwritten.py)."""
        flagged = self.unwritten.flagged
        if flagged is not None and id(t) in flagged and unsupported(t) is None:
            self._noted(t, call, source, UNWRITTEN)
            return
        if self.stats_on:
            try:
                stats, layout = self._describe(t, self._layout)
            except _Noted as e:
                self._noted(t, call, source, e.why)
                return
            except Exception as e:  # noqa: BLE001 - an exotic tensor: note it, record on
                self._noted(t, call, source, f"no statistics ({type(e).__name__}: {str(e)[:200]})")
                return
        else:
            why = unsupported(t)
            if why is not None:
                self._noted(t, call, source, why)
                return
            stats, layout = NO_STATS, self._layout(t)
        call.layouts.append(layout + (t.requires_grad,) if self.meta_on else layout + (False,))
        call.stats.append(stats)
        call.sources.append(source)

    def _layout(self, t: torch.Tensor) -> tuple:
        """dtype, shape, stride, offset, device cells (requires_grad is appended by the caller)."""
        why = unsupported(t)
        if why is not None:
            raise _Noted(why)
        dims = self._dims
        shape = t.shape
        shape_id = dims.get(shape)
        if shape_id is None:
            shape_id = dims[tuple(shape)] = self.intern(shape_text(tuple(shape)))
        dtype = self._dtypes.get(t.dtype)
        if dtype is None:
            dtype = self._dtypes[t.dtype] = self.intern(dtype_name(t.dtype))
        if not self.meta_on:
            return (dtype, shape_id, NONE, 0, self._cpu)
        try:
            stride, offset = t.stride(), t.storage_offset()
        except RuntimeError:  # sparse and other layouts have no strides
            stride, offset = None, 0
        stride_id = NONE if stride is None else dims.get(stride)
        if stride_id is None:
            stride_id = dims[stride] = self.intern(shape_text(stride))
        return (dtype, shape_id, stride_id, offset, self._cpu if t.is_cpu else self._device(t.device))

    def _device(self, device: torch.device) -> int:
        i = self._devices.get(device)
        if i is None:
            i = self._devices[device] = self.intern(str(device))
        return i

    def _noted(self, t: torch.Tensor, call: RowCall, source: tuple, why: str) -> None:
        """A tensor described by a note instead of statistics (the Record path's ``noted_meta``)."""
        meta = noted_meta(t, why)
        if call.notes is None:
            call.notes = {}
        call.notes[len(call.layouts)] = self.intern(meta.note)
        call.layouts.append((self.intern(meta.dtype), self.intern(shape_text(meta.shape)), NONE, 0,
                             self.intern(meta.device), meta.requires_grad))
        call.stats.append(NO_STATS)
        call.sources.append(source)

    # -- after the call: outputs, the record -------------------------------------------------------
    def after(self, call: RowCall, out: Any) -> None:
        info = call.info
        cache = self.recorder._stats
        if info.collective:  # its tensors are final only once waited for
            wait_collective(list(out) if info.returns > 1 else [out])
        if info.mutates or info.collective:  # (info.writes) the version counter is bumped only after we return
            forget_written(cache, info, bind_inputs(info, call.args, call.kwargs))
        first_out = len(call.layouts)
        call.outs = outs = []
        if not self.described:
            key = call.key
        elif type(out) in _PLAIN and self._new_output(out, call):  # the common result, cached in one step
            key = (call.key, _TENSOR)
        else:
            if self.stats_on and info.stats_preserving and self.unwritten.flagged is None:  # (not garbage's)
                first_input_described = (call.args and type(call.args[0]) in _PLAIN
                                         and not (call.notes and 0 in call.notes))
                reuse_input_stats(cache, info, call.args, out, call.stats[0] if first_input_described else None)
            key = (call.key, self._output(out, call))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(call, key, out, len(call.layouts))
        if info.view and self.stats_on and outs:  # (outs stays empty after _new_output)
            notes = call.notes or {}
            cache_view_outputs(cache, call.args, [(o, call.stats[i]) for i, o in enumerate(outs, start=first_out)
                                                  if i not in notes])
        if self.dump_num and self.described and (budget := self.recorder.tensor_budget(call.signature)):
            self._save(call, "out", dict(enumerate(list(out) if info.returns > 1 else [out])), first_out, budget)
        frames = call.frames
        ids = self._frames.get(frames)
        if ids is None:
            ids = self._frame_ids(frames)
        seq = call.seq
        stack = NONE if not call.stack else self.intern(json.dumps(call.stack, separators=(",", ":")))
        checks = self.checks(call, out, first_out)
        self.writer.add_rows((seq, 0, call.direction, plan.op, ids[0], 1, seq, seq, 0, NONE, ids[1], stack,
                              plan.skeleton),
                             call.layouts, call.stats, call.sources, plan.roles, plan.names, call.notes, call.data,
                             checks)

    def checks(self, call: RowCall, out: Any, first_out: int) -> dict[int, Any] | None:
        """A checked op's self-checks (self_check.py) by the row of each output they check
        (``first_out``: its first output's), or None: not a checked op, statistics off, its first
        output noted, or nothing the check could measure. The C path's records call it too."""
        info = call.info
        notes = call.notes or ()
        if not (self.stats_on and checked(info.name)) or first_out in notes:
            return None
        outs = list(out) if info.returns > 1 else [out]  # (a norm backward's input gradient first)
        if not isinstance(outs[0], torch.Tensor) or not self.recorder.wants_check(info.name, outs[0]):
            return None
        now = outs[0].is_cpu and self.recorder.cpu_sync  # else as its statistics: read at the flush
        norms = [norm_of(call.stats[first_out + k]) if now and first_out + k not in notes
                 and isinstance(o, torch.Tensor) else None for k, o in enumerate(outs)]
        got = self_checks(info.name, bind_inputs(info, call.args, call.kwargs), outs, defer=not now, norms=norms,
                          mixed=self.recorder.half_precision_seen)
        return {first_out + k: v for k, v in got.items() if first_out + k not in notes} or None

    def _save(self, call: RowCall, prefix: str, live: dict, first: int, budget: int) -> int:
        """Copy up to ``budget`` of the call's tensors (``live``: its inputs by name, or its
        outputs by index; ``first``: the row of the first one), to the writer's segment: a
        tensor or a Tensor[]'s items, in row order, each named ``<prefix>.<name>[.<i>]``."""
        row = first
        for name, value in live.items():
            if type(value) in _PLAIN or isinstance(value, torch.Tensor):
                budget -= self._save_one(call, row, value, f"{prefix}.{name}", budget)
                row += 1
            elif isinstance(value, (list, tuple)):
                for i, t in enumerate(value):
                    if isinstance(t, torch.Tensor):
                        budget -= self._save_one(call, row, t, f"{prefix}.{name}.{i}", budget)
                        row += 1
                    else:
                        row += _tensors_in(t)
        return budget

    def _save_one(self, call: RowCall, row: int, t: torch.Tensor, arg: str, budget: int) -> int:
        """1 when ``t`` (the call's tensor row ``row``) was copied; a tensor with a note, of
        another layout, or too large an expand (noted here) is not."""
        if budget <= 0 or (call.notes and row in call.notes) or t.layout != torch.strided:
            return 0
        why = not_saved(t)
        if why is not None:
            return self._note(call, row, why)
        try:  # contiguous now, so the flush's to_numpy need not copy a strided view again
            copy = t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
        except (RuntimeError, MemoryError) as e:  # an expand of 2**52 elements: statistics only
            return self._note(call, row, f"not saved: {str(e).splitlines()[0][:200]}")
        if call.data is None:
            call.data = {}
        call.data[row] = self.intern(self.writer.save_tensor(call.seq, arg, copy))
        self.recorder.tensors_saved += 1
        return 1

    def _note(self, call: RowCall, row: int, note: str) -> int:
        if call.notes is None:
            call.notes = {}
        call.notes[row] = self.intern(note)
        return 0

    def _frame_ids(self, frames: tuple) -> tuple[int, int]:
        """(module id, module stack id) of a module stack, interned once."""
        ids = self._frames[frames] = (
            (self.intern(frames[-1][0]), self.intern(stack_text(frames))) if frames else (NONE, NONE))
        return ids

    def _output(self, out: Any, call: RowCall) -> Any:
        """``out``'s part of the plan key; its tensors' cells go into ``call`` (anything unknown
        is keyed by its text)."""
        kind = type(out)
        if kind in _PLAIN or isinstance(out, torch.Tensor):
            call.outs.append(out)
            self._tensor(out, call, _NO_SOURCE)
            return _TENSOR
        if kind is list or kind is tuple:
            return (kind, tuple([self._output(x, call) for x in out]))
        if kind in _KEYED:
            return (kind, out)
        return (kind, stable_repr(out))

    def _plan(self, call: RowCall, key: tuple, out: Any, tensors: int) -> Plan:
        """Skeleton and tensor names of this shape of call, from the Record path's encoding (once
        per process: a new dump session only interns the texts into its own string table)."""
        texts_key = (self.meta_on, key)
        texts = _PLAN_TEXTS.get(texts_key)
        if texts is None:
            rec = self.recorder.skeleton_record(call.info, call.args, call.kwargs, out)
            text, roles, names = skeleton_of(rec)
            if len(_PLAN_TEXTS) >= _PLAN_TEXTS_MAX:  # a bound, for shapes that never repeat
                _PLAN_TEXTS.clear()
            texts = _PLAN_TEXTS[texts_key] = (text, roles, names)
        text, roles, names = texts
        if len(roles) != tensors:
            raise RuntimeError(f"the row path found {tensors} tensors in a call of {call.info.name}, "
                               f"the record path {len(roles)}")
        return Plan(self.intern(call.info.name), self.intern(text), roles, tuple(self.intern(n) for n in names))


# (META on?, call shape) -> (skeleton text, roles, names): what a Plan holds before interning.
_PLAN_TEXTS: dict[tuple, tuple[str, tuple[int, ...], tuple[str, ...]]] = {}
_PLAN_TEXTS_MAX = 1 << 16


_NO_SOURCE = (SRC_NONE, 0, 0, NONE)  # outputs carry no source
_PLACEHOLDER = TensorMeta((), "float32")


def placeholder(t: torch.Tensor) -> TensorMeta:
    """Every tensor as one TensorMeta: a call's encoding without describing its tensors."""
    return _PLACEHOLDER


def _encoded_text(a: Any) -> str:
    """The plan key of a value of another kind: its skeleton's own text (encode.encode_value)."""
    return json.dumps(value_to_json(encode_value(a, placeholder)), default=str)


def _tensors_in(v: Any) -> int:
    """The tensor rows a value holds (its tensors at any depth, as _input and _output walk it)."""
    if isinstance(v, torch.Tensor):
        return 1
    if isinstance(v, (list, tuple)):
        return sum(_tensors_in(x) for x in v)
    return 0


def wait_collective(outs: list) -> None:
    """A collective returns before its tensors are final (a c10d Work, or a functional
    collective's tensor, which holds this rank's own term until ``wait_tensor``): wait, so the
    recorded result is the reduced one and not a race. The user's own wait later finds nothing
    pending and returns at once: values are unchanged, only the overlap is lost."""
    for o in outs:
        if isinstance(o, torch.Tensor):
            torch.ops._c10d_functional.wait_tensor.default(o)
        elif isinstance(o, (list, tuple)):
            wait_collective(list(o))
        else:
            wait = getattr(o, "wait", None)
            if callable(wait):
                wait()
_TENSOR_TYPE = torch.Tensor


def op_facts(func, records: bool = True) -> tuple:
    """What the C path needs to know of an op, worked out once per op here, where the rules
    live: (its OpInfo, whether the C path takes its calls that de-dup folds, whether it takes
    those that make a new record (never where the session's ``records`` is False: X_DUMP_NUM's
    tensors are copied in Python), and whether each of the statistics cache's rules applies:
    ``cache_view_outputs`` (a view), ``reuse_input_stats`` (keeps its input's values),
    ``forget_written`` (an in-place call: its result goes to Python), and whether it may write
    (de-dup's folded calls then count as writes)), and whether its new records are self-checked
    (``RowPath.checks``). A collective waits for its Work and forgets every argument: the
    general path's."""
    info = op_info(func)
    # an allocation starts tracking uninitialised memory (unwritten.py): Python's, folded or not
    takes = not info.collective and not allocates(func)
    records = records and takes
    # a checked op's new record gets its self-checks from RowPath.checks (its folded calls, none)
    return (info, takes, records, info.view, info.stats_preserving, bool(info.mutates), info.writes,
            checked(info.name))


def native_path(recorder):
    """The C path over ``recorder``'s row path, or None: not built, switched off
    (``XRAY_NATIVE_ROWS=0``), or a configuration it does not take (it needs META and STATS, the
    row path's one-step case, and leaves Python stacks to Python). Under X_DUMP_NUM it takes only
    the calls de-dup folds, which copy no tensor; so without de-dup it takes none. Every piece of
    state it shares is handed over here; besides, it reads by name the recorder's ``seq``, ``op_calls``, ``records_written`` and ``failed`` (in
    its instance dict) and its ``unwritten_buffers`` (while not empty, Python takes every call), ``Producers._by_id``/``_sweep_at``, ``StatsCache._sweep_at``/``writes``,
    the writer's ``_builder``/``_last_flush``/``flush_records``/``flush_seconds``, and the fields
    of ``Plan`` and ``Fold``; each op's facts come from ``op_facts``, and whether a new record's later
    calls fold into it from ``Recorder._folds_into``."""
    rows = recorder.rows
    if (_fastpath is None or rows is None or not rows._fast or (rows.dump_num and not recorder.dedup)
            or recorder.stack_on or os.environ.get(NATIVE_ENV, "1").strip().lower() in ("0", "false", "no", "off")):
        return None
    import time

    from ..dump import samples, stats
    from ..dump.writer import DumpWriter
    cache, producers, writer = recorder._stats, recorder.producers, recorder.writer
    try:
        return _fastpath.FastPath(
            recorder=recorder, cache=cache, producers=producers, entries=cache.entries,
            seen=recorder._seen if recorder.dedup else None, stack=recorder.modules.forward_stack,
            plans=rows._plans, frame_ids=rows._frames, dims=rows._dims, dtypes=rows._dtypes, state=rows._state,
            devices=rows._devices,
            cpu=rows._cpu, keyed=_KEYED, tensor_mark=_TENSOR, input_source=_INPUT_SOURCE, no_source=_NO_SOURCE,
            src_op=SRC_OP, none_id=NONE, forward=_FORWARD, tensor_type=torch.Tensor, param_type=torch.nn.Parameter,
            folds_into=recorder._folds_into, op_facts=functools.partial(op_facts, records=not rows.dump_num), compute=cache.compute,
            len_modes=torch._C._len_torch_dispatch_stack,
            graph_task=torch._C._current_graph_task_id, py_tensor=rows._tensor, py_layout=rows._layout,
            py_plan=rows._plan, py_state_cells=rows._state_cells, py_frame_ids=rows._frame_ids,
            py_after=recorder._after, py_fail=recorder._fail, py_add_rows=writer.add_rows,
            py_count_changed=writer.count_changed, py_sweep=cache.sweep, py_wrote=cache.wrote,
            py_produced=producers.produced, py_producers_sweep=producers._sweep, writes_seen=cache._writes_seen,
            native_kinds=stats._NATIVE_KINDS if recorder.cpu_sync else {}, native_max=stats._NATIVE_MAX,
            strided=torch.strided, monotonic=time.monotonic, resample=cache.resample,
            sample_offsets=samples.offsets_bytes, py_checks=rows.checks,
            # a writer that keeps DumpWriter's add_rows: the C path appends to its chunk itself
            writer=writer if getattr(type(writer), "add_rows", None) is DumpWriter.add_rows else None)
    except Exception as e:  # noqa: BLE001 - a mismatch with this build: the Python row path records
        warnings.warn(f"xray: the C row path is off ({type(e).__name__}: {e}); recording in Python, "
                      "same dump, slower", RuntimeWarning, stacklevel=2)
        return None
