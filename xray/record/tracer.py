"""The recording TorchDispatchMode: sees every ATen call and hands its description on.

The mode only collects. Every op call becomes index rows on one general path (``rows``), whose
common call also runs in C (``_fastpath``, deciding nothing of its own: ``rows.op_facts``). A
``Record`` is built only where a Record is what is wanted: module-boundary records (MODULES), a
writer without ``add_rows`` (the module debugger's sink, which consumes Records), and
``XRAY_ROW_PATH=0``, the tests' reference encoding; all write the same index.
Statistics live in ``xray.dump.stats``, encoding in ``encode``, data edges (each input's
``src``) in ``producers``, storage in ``xray.dump.writer``. All of the tracer's own tensor work
runs with dispatch modes disabled, so it never records itself and never disturbs another mode.
"""
from __future__ import annotations

import dataclasses
import os
import traceback
import warnings
import weakref
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .config import DebugFlags, DumpConfig
from ..dump.dispatch_modes import no_dispatch_modes, no_torch_function
from ..dump.model import Record, Stats, TensorMeta
from ..dump.stats import DeferredStats, StatsCache, norm_of, stats_of_row, stats_row, tensor_stats
from ..dump.writer import DumpWriteError, DumpWriter, Fold
from .encode import (ATOMS as _ATOMS, bind_inputs, encode_value, noted_meta, not_saved, op_info, recorded_result,
                     dedup_key, signature_key, tensor_meta, unsupported, writes_now)
from .flatten import PLAIN_TENSORS as _PLAIN_TYPES, flatten_tensors
from .elementwise_check import HALF as HALF_PRECISION, reference_dtype
from .self_check import OPS as CHECKED_OPS, checked, self_checks
from .modules import ModuleStack
from .producers import Producers
from .unwritten import UNWRITTEN, Unwritten
from .cache_rules import cache_view_outputs, forget_written, reuse_input_stats
from .rows import FALLBACK as _FALLBACK, RowCall, RowPath, native_path, placeholder, wait_collective
from .sharded import dtensor_type, fake_mode_active, sharding_of

_XRAY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _user_stack(depth: int) -> list[str]:
    frames = [f for f in traceback.extract_stack()[:-1]
              if not f.filename.startswith((_XRAY_DIR, _TORCH_DIR))]
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames[-depth:]]


def _holds_tensor(v: Any) -> bool:
    """A tensor or a Tensor[] argument (aten.cat's inputs): kept even without META."""
    return isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v))


DEFERRED_ENV = "XRAY_DEFERRED_STATS"
# "0": every call takes the Record path, the reference the row path's tests compare against.
ROW_PATH_ENV = "XRAY_ROW_PATH"


def _stats_function(deferred: DeferredStats, sync=tensor_stats):
    """How the recorder computes statistics, chosen by ``XRAY_DEFERRED_STATS`` (read when a
    dump begins): "auto" (default) launches them on the device for accelerator tensors, read
    back once per flush (no host sync per tensor), and takes the synchronous one-pass path on
    CPU, where nothing is gained by waiting; "1" defers on every device, CPU included (tests
    prove the O(flushes) transfers with it); "0" never defers. ``sync`` computes the
    synchronous ones (``stats_row`` for the row path: cells instead of a ``Stats``)."""
    mode = _deferred_mode()
    if mode == "never":
        return sync
    if mode == "everywhere":
        return lambda t: deferred.launch(t) if type(t) in _PLAIN_TYPES else sync(t)
    # Subclasses (DTensor, fake and wrapper tensors) stay synchronous: their torch ops may
    # communicate or have no storage to reduce into a buffer.
    return lambda t: sync(t) if t.is_cpu or type(t) not in _PLAIN_TYPES else deferred.launch(t)


def _deferred_mode() -> str:
    """``XRAY_DEFERRED_STATS`` as "never", "everywhere" or "auto" (accelerators only)."""
    mode = os.environ.get(DEFERRED_ENV, "auto").strip().lower()
    if mode in ("0", "false", "no", "off"):
        return "never"
    if mode in ("1", "true", "yes", "on", "all"):
        return "everywhere"
    return "auto"


_RECORDERS: "weakref.WeakSet[Recorder]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child (DataLoader worker, compile worker) inherits the active dispatch mode and
    module hooks; only the process that called begin_dump records, so the child's copies go
    quiet at once, at no cost to the parent's hot path."""
    for recorder in list(_RECORDERS):
        recorder.failed = "forked child process: recording stays in the parent"
        recorder.modules.disown()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Recorder:
    """State of one dump session: sequence counter, de-dup table, statistics cache, writer."""

    def __init__(self, config: DumpConfig, writer: DumpWriter) -> None:
        self.config = config
        self.writer = writer
        self.stats_on = config.has(DebugFlags.STATS)
        self.meta_on = config.has(DebugFlags.META)
        self.backward_on = config.has(DebugFlags.BACKWARD)
        self.stack_on = config.has(DebugFlags.STACK)
        self.dedup = config.dedup
        self.seq = 0
        self.op_calls = 0
        self.records_written = 0
        self.tensors_saved = 0
        self.unrecorded_backward = 0  # backward calls seen without BACKWARD (X_DEBUG 0x008)
        # a checked op made a half-precision output: the run computes in half precision, and its
        # float32 elementwise outputs are self-checked from then on (wants_check)
        self.half_precision_seen = False
        self.failed: str | None = None
        self.dtensor_depth = 0  # DTensor ops being dispatched now (their local kernels are recorded inside)
        self._passing = None  # the DTensor op handed on to DTensor's own dispatch (on_dtensor_op)
        # where and why recording stopped (dump.json summary.stopped), None while it runs
        self.stopped: dict | None = None
        # (signature, module, roles) -> the count of the record its calls fold into (dedup_key)
        self._seen: dict[tuple, Fold] = {}
        # keys still making records: (how many, the pass of the first); a loop's keys in their first
        # pass, with the record their calls fold into from the next pass on (_folds_into)
        self._records_of: dict[tuple, tuple[int, int]] = {}
        self._open: dict[tuple, Fold] = {}
        self._pass = 0  # outermost module calls begun (ModuleStack's on_pass)
        # signatures whose first record copied its tensors (X_DUMP_NUM): later records of them,
        # in other modules, keep statistics only
        self._saved: set[tuple] = set()
        self.deferred = DeferredStats()
        # The row path takes every op call of a writer that takes rows; the Record path remains
        # for a sink that consumes Records (the module debugger's) and as the tests' reference.
        rows = hasattr(writer, "add_rows") and os.environ.get(ROW_PATH_ENV, "1").strip() != "0"
        # Deferred statistics need a writer that calls before_flush ahead of encoding; a sink
        # that consumes records at once (the module debugger's) gets synchronous ones.
        deferrable = hasattr(writer, "before_flush")
        sync = stats_row if rows else tensor_stats
        self._stats = StatsCache(_stats_function(self.deferred, sync) if deferrable else sync,
                                 keep_parameters=False, writes_seen=True)
        if deferrable:
            writer.before_flush = self.deferred.resolve  # fills the deferred Stats before encoding
            self._stats.resample = self.deferred.resample  # a view's sample, gathered on its device
        # A plain CPU tensor's statistics are ``sync``'s (the native row path may compute them itself)
        self.cpu_sync = not deferrable or _deferred_mode() != "everywhere"
        self.producers = Producers()
        # storages allocated uninitialised and not yet written (unwritten.py); the C path takes no
        # call while ``unwritten_buffers`` is not empty
        self.unwritten = Unwritten()
        self.unwritten_buffers = self.unwritten.buffers
        self.rows = RowPath(self, writer) if rows else None
        self.modules = ModuleStack(
            on_enter=self._module_enter if config.has(DebugFlags.MODULES) else None,
            on_exit=self._module_exit if config.has(DebugFlags.MODULES) else None,
            backward=self.backward_on, producers=self.producers, on_error=self._fail,
            on_pass=self.next_pass if self.dedup else None)
        # The row path's common call in C, where built: the same index, same state (rows.native_path)
        self.native = native_path(self)
        _RECORDERS.add(self)

    @contextmanager
    def attributed_to(self, frames: list[tuple[str, str]]) -> Iterator[None]:
        """Record the calls made inside as running in ``frames`` ((path, class), outermost first):
        for a caller that runs graph nodes carrying their own module stack (``xray drift``
        replays an exported program, whose modules no longer run)."""
        stack = self.modules.forward_stack
        saved = list(stack)
        stack[:] = frames
        try:
            yield
        finally:
            stack[:] = saved

    def stats(self, t: torch.Tensor) -> Stats:
        return stats_of_row(self._stats.get(t))

    def _meta(self, t: torch.Tensor, source: str | None = None) -> TensorMeta:
        """A tensor the recorder cannot read (meta, nested, quantized...) is described with a
        note instead of statistics: it must never stop the recording. A DTensor is described by
        its local shard, with where that shard sits (sharded.py): nothing is communicated."""
        if type(t) is not torch.Tensor and type(t) is dtensor_type():
            meta = self._meta(t._local_tensor, source)
            meta.sharding = sharding_of(t)
            if self.meta_on:
                meta.requires_grad = t.requires_grad
            return meta
        why = unsupported(t)
        flagged = self.unwritten.flagged
        if why is None and flagged is not None and id(t) in flagged:
            why = UNWRITTEN
        if why is not None:
            meta = noted_meta(t, why)
            meta.source = source
            return meta
        try:
            stats = stats_of_row(self._stats.get(t)) if self.stats_on else None
        except Exception as e:  # noqa: BLE001 - an exotic tensor type: note it, record on
            meta = noted_meta(t, f"no statistics ({type(e).__name__}: {str(e)[:200]})")
            meta.source = source
            return meta
        return tensor_meta(t, stats, self.meta_on, source)

    def _input_meta(self, t: torch.Tensor) -> TensorMeta:
        """An input's meta names the data edge it arrived on (outputs are the record's own)."""
        return self._meta(t, self.producers.source_of(t))

    # -- DTensor ops ----------------------------------------------------------------------------------
    def on_dtensor_op(self, mode, func, args: tuple, kwargs: dict) -> Any:
        """A call on DTensors: recorded as one record of its local shards (``_meta``), closed
        after the kernels DTensor runs for it, which are recorded in their own right (its
        redistributions' collectives, the local matmul). How: the mode hands the call back to
        DTensor's dispatch (NotImplemented) with itself pushed again, so that what DTensor
        dispatches lands here as plain-tensor calls. Its seq is taken when it returns, as a
        module record's is, so seqs stay in execution order."""
        if self._passing is func:  # our own call below, back once: DTensor's dispatch takes it
            self._passing = None
            return NotImplemented
        if self.failed is not None:
            return NotImplemented
        backward = torch._C._current_graph_task_id() != -1
        if backward and not self.backward_on:  # its local kernels are counted as unrecorded
            return NotImplemented
        # the recorder's own work runs with the modes below it off, where there are any
        quiet = _disable_current_modes if torch._C._len_torch_dispatch_stack() > 0 else nullcontext
        try:
            with quiet():
                rec = self._dtensor_before(func, args, kwargs, backward)
        except Exception as e:  # noqa: BLE001 - a recorder bug must never break the user's step
            self._fail(e, func)
            return NotImplemented
        from torch.utils._python_dispatch import _pop_mode, _push_mode

        self._passing = func
        self.dtensor_depth += 1
        _push_mode(mode)
        try:
            out = func(*args, **kwargs)
        finally:
            _pop_mode()
            self.dtensor_depth -= 1
            self._passing = None
        try:
            with quiet():
                self._dtensor_after(rec, func, args, kwargs, out)
        except Exception as e:  # noqa: BLE001
            self._fail(e, func)
        return out

    def _dtensor_before(self, func, args: tuple, kwargs: dict, backward: bool) -> Record:
        """The DTensor call's record with its inputs described (before an in-place call changes
        them); its seq is set by ``_dtensor_after``. Never de-duplicated, no tensors saved: its
        local kernels' records hold those."""
        info = op_info(func)
        frames = self.modules.current(backward)
        rec = Record(seq=-1, kind="op", op=info.name, direction="backward" if backward else "forward",
                     module=frames[-1][0] if frames else None, module_stack=list(frames),
                     mutates=list(info.mutates))
        if self.stack_on:
            rec.stack = _user_stack(self.config.stack_depth)
        if self.meta_on or self.stats_on:
            rec.inputs = self._inputs(bind_inputs(info, args, kwargs))
        rec.kernels = self.seq  # where its kernels' records start; a count once it returns
        return rec

    def _dtensor_after(self, rec: Record, func, args: tuple, kwargs: dict, out: Any) -> None:
        info = op_info(func)
        self.op_calls += 1
        rec.kernels = self.seq - rec.kernels
        rec.seq = self.seq
        self.seq += 1
        bound = bind_inputs(info, args, kwargs) if info.written_results or info.writes else None
        if info.written_results:
            out = recorded_result(info, out, bound)
        self.producers.produced(rec.seq, info.roles, out, writes=bool(info.mutates))
        if info.writes:  # its local kernels wrote the shards; the DTensors' own entries go too
            forget_written(self._stats, info, bound)
        if self.meta_on or self.stats_on:
            outs = list(out) if info.returns > 1 else [out]
            rec.outputs = [encode_value(v, self._meta) for v in outs]
        self._emit(rec)

    # -- the hot path ----------------------------------------------------------------------------
    def on_op(self, func, args: tuple, kwargs: dict) -> Any:
        if self.failed is not None:
            return func(*args, **kwargs)
        # Inside __torch_dispatch__ our own mode is already off: only modes below ours need
        # disabling, and with none the context manager's cost is skipped.
        below = torch._C._len_torch_dispatch_stack() > 0
        tracked = self.unwritten.wants(func)  # uninitialised memory in play (unwritten.py)
        try:
            if below:
                with _disable_current_modes():
                    pending = self._before(func, args, kwargs, tracked)
            else:
                pending = self._before(func, args, kwargs, tracked)
        except Exception as e:  # a recorder bug must never break the user's forward
            self.unwritten.done()
            self._fail(e, func)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if pending is not None or tracked:
            try:
                if below:
                    with _disable_current_modes():
                        self._after_call(func, pending, args, kwargs, out, tracked)
                else:
                    self._after_call(func, pending, args, kwargs, out, tracked)
            except Exception as e:
                self._fail(e, func)
            finally:
                self.unwritten.done()
        return out

    def _after_call(self, func, pending, args: tuple, kwargs: dict, out: Any, tracked: bool) -> None:
        if tracked:
            self.unwritten.after(func, args, kwargs, out)
        if pending is None:
            return
        if type(pending) is int:  # folded by de-dup: no record, but it produced its outputs
            info = op_info(func)
            self.producers.produced(pending, info.roles, out, writes=bool(info.mutates))
        else:
            self._after(pending, args, out)

    def _before(self, func, args: tuple, kwargs: dict, tracked: bool = False):
        """None: not recorded (backward without BACKWARD); the call's seq: folded by de-dup into
        an earlier record, it still produces its outputs under its own seq; else the pending
        call with what _after needs: the row path's ``RowCall`` (every call of a writer that takes
        rows), or the Record path's tuple. ``tracked``: the call touches uninitialised memory,
        whose inputs are flagged first (unwritten.py), recorded or not."""
        if tracked:
            self.unwritten.before(func, args, kwargs)
        backward = torch._C._current_graph_task_id() != -1
        if backward and not self.backward_on:
            self.unrecorded_backward += 1  # said in dump.json: compare's verdict then covers the forward only
            self._unseen_write(func)
            return None
        self.op_calls += 1
        seq = self.seq
        self.seq += 1
        info = op_info(func)
        frames = self.modules.current(backward)
        key = None
        if self.dedup:
            try:
                key = dedup_key(signature_key(info, args, kwargs), frames, self.producers.roles(args, kwargs))
                seen = self._seen.get(key)
            except (TypeError, RuntimeError):  # a symbolic or missing size: recorded, never folded
                key = seen = None
            if seen is not None:
                seen.count += 1
                seen.last = seq
                if not seen.dirty:
                    seen.dirty = True
                    self.writer.count_changed(seen)
                if seen.writes:  # not described, but it wrote (see _unseen_write)
                    self._stats.wrote()
                self.writer.folded(seq, seen.seq, *self.producers.op_source(args[0] if args else None))
                return seq
        if self.rows is not None:
            stack = _user_stack(self.config.stack_depth) if self.stack_on else None
            return self.rows.before(func, info, args, kwargs, seq, backward, frames, stack, key)
        rec = Record(seq=seq, kind="op", op=info.name, direction="backward" if backward else "forward",
                     module=frames[-1][0] if frames else None, module_stack=list(frames),
                     mutates=list(info.mutates))
        if self.stack_on:
            rec.stack = _user_stack(self.config.stack_depth)
        budget = [self.tensor_budget(key)]
        # Inputs are described (and copied) before the call: in-place ops mutate them.
        bound = bind_inputs(info, args, kwargs)
        if self.meta_on or self.stats_on:
            rec.inputs = self._inputs(bound)
        if budget[0]:  # X_DUMP_NUM inputs, and as many outputs again (_after): ``budget`` stays whole
            self._save(rec, "in", bound, rec.inputs, list(budget))
        return rec, info, key, budget, bound

    def wants_check(self, op: str, first: torch.Tensor) -> bool:
        """Whether a new record of checked op ``op`` with first output ``first`` is self-checked:
        every op of CHECKED_OPS; an elementwise op where ``elementwise_check.reference_dtype``
        gives it a reference: its output in half precision, or in float32 once a checked op has
        made a half-precision output (its float32 values then carry half precision's rounding,
        whose band hides a few wrong elements), and in any run where its float32 output is small
        (``SMALL_OUTPUT``). Any other elementwise call of a run all float32 costs no more than this
        test."""
        if first.dtype in HALF_PRECISION:
            self.half_precision_seen = True
        return op in CHECKED_OPS or reference_dtype(first, self.half_precision_seen) is not None

    def tensor_budget(self, key: tuple | None) -> int:
        """X_DUMP_NUM for a new record (so many of its inputs, and so many of its outputs: an
        SDPA backward's six inputs must not leave its gradients unsaved); 0 where de-dup already copied the tensors of its
        signature's first record (one module's, with one set of input roles), so that its other
        records (other modules', other roles') keep statistics only: tensors cost what every
        layer's would, statistics little. (The C path
        takes no call while X_DUMP_NUM is set, so only this path copies tensors.)"""
        return self.config.dump_num if key is None or key[0] not in self._saved else 0

    def _folds_into(self, key: tuple | None, seq: int, writes: bool) -> None:
        """A new record of de-dup key ``key``: the key's first ``dedup_records`` calls each get a
        record, and later calls fold into the last of them. A call de-dup folds is seen only
        through its consumers; a second record of each key (a layer's second residual add, the
        second step's call) lets compare judge a fault there on its own inputs. Within the pass
        of its first record (one outermost module call and what follows it: its backward, an
        optimizer step), a key keeps a record per call up to ``dedup_pass_records``, so that a
        loop inside one forward (a scan's steps, attention's blocks) is judged call by call as
        every call would be; it folds from the next pass on. A training loop's steady state still
        folds every call. (The C path asks here too: it folds what ``_seen`` holds.)"""
        if key is None:
            return
        made, first = self._records_of.pop(key, (0, self._pass))
        made += 1
        if made < self.config.dedup_records:
            self._records_of[key] = (made, first)
        elif first == self._pass and made < self.config.dedup_pass_records:
            self._records_of[key] = (made, first)
            self._open[key] = Fold(seq, writes)
        else:
            self._open.pop(key, None)
            self._seen[key] = Fold(seq, writes)
        if self.config.dump_num:  # (tensor_budget's question; none without X_DUMP_NUM)
            self._saved.add(key[0])

    def next_pass(self) -> None:
        """An outermost module call begins: the keys a loop kept open in the last pass fold from now on."""
        self._pass += 1
        if self._open:
            for key, fold in self._open.items():
                self._records_of.pop(key, None)
                self._seen[key] = fold
            self._open.clear()

    def _unseen_write(self, func) -> None:
        """A call that is not described may still write a tensor: inference tensors, cached
        without a version counter, must not keep their statistics across it."""
        if op_info(func).writes:
            self._stats.wrote()

    def _inputs(self, bound: dict, meta_of=None) -> dict:
        """The described arguments: every one with META, else only those holding tensors.
        Exact types first (the common cases), the general encoder for the rest."""
        inputs = {}
        meta_on = self.meta_on
        meta_of = self._input_meta if meta_of is None else meta_of
        for k, v in bound.items():
            kind = type(v)
            if kind in _PLAIN_TYPES:
                inputs[k] = meta_of(v)
            elif kind in _ATOMS:
                if meta_on:
                    inputs[k] = v
            elif meta_on or _holds_tensor(v):
                inputs[k] = encode_value(v, meta_of)
        return inputs

    def skeleton_record(self, info, args: tuple, kwargs: dict, out: Any) -> Record:
        """A call's Record with every tensor a placeholder: its non-tensor rest, for the row
        path's plans (the same encoding as the records this path makes)."""
        if not (self.meta_on or self.stats_on):  # the op's name only
            return Record(seq=0, kind="op", op=info.name, mutates=list(info.mutates))
        outs = list(out) if info.returns > 1 else [out]
        return Record(seq=0, kind="op", op=info.name, mutates=list(info.mutates),
                      inputs=self._inputs(bind_inputs(info, args, kwargs), placeholder),
                      outputs=[encode_value(v, placeholder) for v in outs])

    def _after(self, pending, args: tuple, out: Any) -> None:
        if type(pending) is RowCall:
            call = pending
            if call.info.written_results:
                out = recorded_result(call.info, out, bind_inputs(call.info, call.args, call.kwargs))
            self.producers.produced(call.seq, call.info.roles, out, writes=bool(call.info.mutates))
            self.rows.after(call, out)
            self.records_written += 1
            self._folds_into(call.signature, call.seq, call.info.writes)
            return
        rec, info, key, budget, bound = pending
        if info.written_results:
            out = recorded_result(info, out, bound)
        self.producers.produced(rec.seq, info.roles, out, writes=bool(info.mutates))
        outs = list(out) if info.returns > 1 else [out]
        if info.collective:
            wait_collective(outs)
        forget_written(self._stats, info, bound)  # the version counter is bumped only after we return
        if self.stats_on and info.stats_preserving and self.unwritten.flagged is None:  # (not garbage's)
            meta = rec.inputs.get(info.arg_names[0]) if info.arg_names else None
            reuse_input_stats(self._stats, info, args, out, meta.stats if type(meta) is TensorMeta else None)
        if self.meta_on or self.stats_on:
            rec.outputs = [encode_value(v, self._meta) for v in outs]
            if info.view and self.stats_on:
                cache_view_outputs(self._stats, args, _described(outs, rec.outputs))
            first = rec.outputs[0] if rec.outputs else None
            if self.stats_on and checked(info.name) and type(first) is TensorMeta and type(first.stats) is Stats \
                    and self.cpu_sync and outs[0].is_cpu and self.wants_check(info.name, outs[0]):
                # (a deferred Stats is filled at the flush: none then)
                metas = [m if type(m) is TensorMeta and type(m.stats) is Stats else None for m in rec.outputs]
                checks = self_checks(info.name, bound, outs, norms=[m and norm_of(m.stats) for m in metas],
                                     mixed=self.half_precision_seen)
                for k, check in checks.items():
                    if metas[k] is not None:  # a copy: the cache hands this Stats on to the views of the output
                        metas[k].stats = dataclasses.replace(metas[k].stats, check=check)
        if budget[0]:
            self._save(rec, "out", dict(enumerate(outs)), dict(enumerate(rec.outputs)), budget)
        self._folds_into(key, rec.seq, info.writes)
        self._emit(rec)

    def _save(self, rec: Record, prefix: str, live: dict, encoded: dict, budget: list[int]) -> None:
        """Copy up to ``budget`` tensors of one side (inputs or outputs, in schema order)."""
        for name, value in live.items():
            pairs = [(value, encoded.get(name))] if not isinstance(value, (list, tuple)) else \
                list(zip(value, encoded.get(name) or [None] * len(value)))
            for i, (t, meta) in enumerate(pairs):
                if budget[0] <= 0:
                    return
                if (not isinstance(t, torch.Tensor) or not isinstance(meta, TensorMeta)
                        or meta.note is not None or t.layout != torch.strided):
                    continue
                arg = f"{prefix}.{name}" + (f".{i}" if isinstance(value, (list, tuple)) else "")
                # contiguous now, so the flush's to_numpy need not copy a strided view again
                why = not_saved(t)
                if why is not None:
                    meta.note = why
                    continue
                try:
                    copy = t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
                except (RuntimeError, MemoryError) as e:  # an expand of 2**52 elements: statistics only
                    meta.note = f"not saved: {str(e).splitlines()[0][:200]}"
                    continue
                meta.data = self.writer.save_tensor(rec, arg, copy)
                self.tensors_saved += 1
                budget[0] -= 1

    def _emit(self, rec: Record) -> None:
        try:
            self.writer.add(rec)
            self.records_written += 1
        except DumpWriteError as e:
            self._fail(e)

    def _fail(self, e: Exception, func=None) -> None:
        """Stop recording after an error, but never break the user's code. The records made
        so far go to the journal first; after an I/O error the journal is closed, else
        end_dump still writes dump.json, whose summary says where recording stopped (``stopped``)."""
        if self.failed is not None:
            return
        self.failed = f"{type(e).__name__}: {e}" if not isinstance(e, OSError) else str(e)
        self.stopped = _stop_point(self, e, func)
        warnings.warn(f"xray: recording stopped: {self.failed} (at {_stop_text(self.stopped)}). "
                      "What was recorded before stays readable.", RuntimeWarning, stacklevel=4)
        self.modules.disown()
        if isinstance(e, DumpWriteError):
            self.writer.abandon()
        else:
            try:
                with no_dispatch_modes():
                    self.writer.flush()
            except Exception:  # noqa: BLE001 - an I/O error now, or a writer without flush()
                self.writer.abandon()

    # -- module boundaries (X_DEBUG & MODULES) ------------------------------------------------------
    def _module_enter(self, frame, module: torch.nn.Module, args: tuple) -> tuple[dict, dict]:
        """The module's positional inputs and its own parameters and buffers, described before
        it runs (it may mutate them). State goes to ``Record.params``, never among the inputs."""
        with no_dispatch_modes():
            inputs = {f"input.{i}": self._input_meta(t) for i, t in enumerate(flatten_tensors(args))}
            params = {name: self._input_meta(t) for state in (module._parameters, module._buffers)
                      for name, t in state.items() if isinstance(t, torch.Tensor)}
        return inputs, params

    def _module_exit(self, frame, call_index: int, kwargs: dict, output: Any,
                     entered: tuple[dict, dict] | None) -> None:
        if self.failed is not None or entered is None:
            return
        inputs, params = entered
        with no_dispatch_modes():
            for k, v in kwargs.items():
                for i, t in enumerate(flatten_tensors(v)):
                    inputs[f"{k}.{i}"] = self._input_meta(t)
            outputs = [self._meta(t) for t in flatten_tensors(output)]
        path, cls = frame
        rec = Record(seq=self.seq, kind="module", op=cls, module=path,
                     module_stack=list(self.modules.forward_stack), inputs=inputs, outputs=outputs,
                     call_index=call_index, params=params)
        self.seq += 1
        self._emit(rec)


def _stop_point(recorder: "Recorder", e: BaseException, func) -> dict:
    """Where recording stopped: the first seq left unrecorded, the call it stopped in (None when
    the error came between calls: a module hook, a flush), its module, the reason and the
    innermost frame that raised (for a bug report)."""
    frames = recorder.modules.forward_stack
    tb = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ is not None else []
    name = None
    if func is not None:
        try:
            name = op_info(func).name
        except Exception:  # noqa: BLE001 - an op the encoder cannot name: its text
            name = str(func)
    return {"seq": recorder.seq, "op": name, "module": frames[-1][0] if frames else None,
            "reason": recorder.failed[:2000], "raised_at": f"{tb[0].filename}:{tb[0].lineno} in {tb[0].name}" if tb else None}


def _stop_text(stopped: dict) -> str:
    """``seq 12 (aten._local_scalar_dense.default in model.q)``: a stop point in one line."""
    what = " in ".join(x for x in (stopped.get("op"), stopped.get("module") or None) if x)
    return f"seq {stopped.get('seq')}" + (f" ({what})" if what else "")


def _described(outs: list, metas: list) -> Iterator[tuple[torch.Tensor, Stats]]:
    """(output tensor, its statistics) for each described output, Tensor[] items included."""
    for o, m in zip(outs, metas):
        if type(o) in (list, tuple) and type(m) is list:  # split, chunk, unbind: Tensor[]
            yield from _described(o, m)
        elif type(m) is TensorMeta and m.stats is not None:
            yield o, m.stats


try:  # the eval-frame hook Dynamo compiles through (a C function, cheap to import), probed once
    from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame
    _set_eval_frame(_set_eval_frame(None))
except Exception:  # noqa: BLE001 - absent or with another signature here: torch's wrapper then
    _set_eval_frame = None


class XrayTracer(TorchDispatchMode):
    """Forwards every ATen call to the Recorder, which calls the real op exactly once.

    TorchDispatchMode wraps a subclass's ``__torch_dispatch__`` in ``torch._disable_dynamo`` so
    that a compiled region never traces into a mode's Python code (inside the mode's own call
    the mode is popped, and Dynamo would compile the recorder, writer flush included). That
    wrapper costs about 2 us per ATen call, 0.65 ms of the reference Llama's 13 ms forward. This
    mode does the same job with two C calls: it switches the eval-frame callback off around its
    work, and its own frame is marked for Dynamo to skip (``_guard_dynamo``, at every start)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return _set_eval_frame is None  # torch's wrapper where the cheaper guard cannot work

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder
        # the C row path, tried first; FALLBACK: the Recorder takes the call (rows.native_path)
        self._native = None if recorder.native is None else recorder.native.on_op
        self._deferred = recorder.deferred
        self._dtensor = None  # torch's DTensor class once imported (Tracing.start looks again)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        prior = None if _set_eval_frame is None else _set_eval_frame(None)
        deferred = self._deferred
        writes = deferred.used and writes_now(op_info(func), args, kwargs)
        try:
            if types:  # a tensor subclass among the arguments (plain calls have none)
                dt = self._dtensor
                if dt is None:
                    dt = self._dtensor = dtensor_type()
                if dt is not None and dt in types:
                    return self.recorder.on_dtensor_op(self, func, args, kwargs)
            if self.recorder.dtensor_depth and fake_mode_active():  # DTensor's shape propagation
                return func(*args, **kwargs)
            if writes:  # queued statistics read the values each tensor had at its call
                deferred.before_write()
                deferred.at_once = True
            # the recorder's own torch calls are not the model's: a user's TorchFunctionMode (a
            # counter, ``with torch.device(...)``) must see the model's calls only
            with no_torch_function():
                if self._native is not None:
                    out = self._native(func, args, kwargs)
                    if out is not _FALLBACK:
                        return out
                return self.recorder.on_op(func, args, kwargs)
        finally:
            if writes:
                deferred.at_once = False
            if _set_eval_frame is not None:
                _set_eval_frame(prior)


_SKIP_CODE: Any = None  # torch._dynamo's skip_code, imported at the first start; False: unavailable


def _guard_dynamo() -> None:
    """Mark the dispatch frame for Dynamo to skip, at every start (``torch._dynamo.reset()``
    may have cleared the mark). The first call imports torch._dynamo (about 1 s, as torch's own
    wrapper does at the first ATen call); where this torch has no skip_code, fall back to the
    wrapper."""
    global _SKIP_CODE
    if _set_eval_frame is None or _SKIP_CODE is False:
        return
    raw = XrayTracer.__dict__["__torch_dispatch__"]
    try:
        if _SKIP_CODE is None:
            from torch._dynamo.eval_frame import skip_code as _SKIP_CODE
        _SKIP_CODE(raw.__code__)
    except Exception:  # noqa: BLE001 - an older or newer Dynamo: torch's own wrapper then
        XrayTracer.__torch_dispatch__ = torch._disable_dynamo(raw, recursive=True)
        _SKIP_CODE = False


_RESIZE_WATCH: list = []  # the Unwritten told of storage resizes while recording (at most one)


def _watch_resizes(unwritten: Unwritten | None) -> None:
    """Tell ``unwritten`` of ``UntypedStorage.resize_`` calls (no dispatched op shows them: FSDP2
    re-allocates its unsharded parameters so); None: stop. torch's method is put back as it was."""
    cls = torch.UntypedStorage
    if unwritten is None:
        _RESIZE_WATCH.clear()
        if "resize_" in cls.__dict__ and getattr(cls.__dict__["resize_"], "_xray", False):
            delattr(cls, "resize_")
        return
    _RESIZE_WATCH[:] = [unwritten]
    if "resize_" in cls.__dict__:  # ours already, or someone else's: leave it
        return
    original = cls.resize_

    def resize_(self, size):
        before = self.nbytes()
        out = original(self, size)
        if _RESIZE_WATCH and self.nbytes() > before:
            _RESIZE_WATCH[0].resized(self, before)
        return out

    resize_._xray = True
    cls.resize_ = resize_


class Tracing:
    """A Recorder's dispatch mode and module hooks, switched on and off together."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.mode = XrayTracer(recorder)
        self.active = False

    def start(self) -> None:
        if not self.active:
            _guard_dynamo()
            self.recorder._stats.wrote()  # whatever ran while paused went unseen
            self.recorder.unwritten.forget_all()  # and may have written any buffer
            self.recorder.modules.install()
            self.mode._dtensor = dtensor_type()
            self.mode.__enter__()
            _watch_resizes(self.recorder.unwritten)
            self.active = True

    def stop(self) -> None:
        if self.active:
            _watch_resizes(None)
            self.mode.__exit__(None, None, None)
            self.recorder.deferred.before_write()  # what runs while paused goes unseen
            self.recorder.modules.remove()
            self.active = False
