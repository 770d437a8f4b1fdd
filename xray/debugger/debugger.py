"""PrecisionDebugger: dump every module's inputs, parameters, outputs (and gradients) per step.

The API mirrors the ptdbg / torch_xray one users know: ``start()`` before the forward,
``stop()`` after the backward, ``step()`` at the end of a training step. Outside the selected
steps and ranks ``start()`` installs nothing, so the cost there is one comparison.

When the file is written: tensor mode at every ``stop()`` (its data is in the file already).
Statistics-only dumps keep their index rows in memory and write them every ``flush_secs``
(one second by default) or MAX_HELD_ROWS rows, at the last selected step, at ``flush()`` /
``close()`` and at interpreter exit (writing the file every step was half of the
statistics-only overhead); the summary CSV gets every step at ``stop()``. A hard crash (a
segfault, SIGKILL) loses at most the last ``flush_secs`` of the HDF5 index, never the CSV's rows.
"""
from __future__ import annotations

import atexit
import itertools
import math
import os
import platform
import sys
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from ..dump.model import Record, Source, Stats
from ..numerics import math_settings
from ..record.ranks import dist_ranks
from ..dump.summary_csv import append_index_csv
from .aten import AtenCapture
from .capture import CallKey, TensorCapture
from .hooks import ModuleHooks
from ..dump.module_layout import rank_file_stem
from .steps import Selection, parse_selection
from ..dump.module_writer import DumpPathError, ModuleDumpWriter

HOOK_NAMES = ("dump", "overflow_check")
# Statistics-only rows held in memory before the file is written whatever flush_secs says
# (~0.2 KB each: a long flush_secs on a fast loop must not grow memory without bound).
MAX_HELD_ROWS = 1 << 16
TASKS = ("tensor", "statistics")


@dataclass(frozen=True)
class OverflowReport:
    """Where NaN/Inf first appeared in a module's outputs (or input gradients, in backward)."""

    step: int
    rank: int
    name: str  # full tensor name, e.g. "model.layers.0.mlp.Linear.0.forward_output.0"
    module: str
    module_class: str
    call_index: int
    direction: str
    nan: int
    posinf: int
    neginf: int

    def __str__(self) -> str:
        return (f"first NaN/Inf at {self.name} (step {self.step}, rank {self.rank}, {self.direction}): "
                f"nan={self.nan} +inf={self.posinf} -inf={self.neginf}")


class PrecisionDebugger:
    """Module-level precision dump into ``<dump_path>/globalrank-<g>_localrank-<l>.h5``.

    ``hook_name``: "dump" records every tensor; "overflow_check" records only tensors holding
    NaN/Inf and reports the first module whose outputs hold them (``first_overflow``).
    ``task``: "tensor" saves tensor data and statistics; "statistics" saves statistics only.
    ``rank``/``step``: what to dump (None or [] means all; ranges like "4-6" accepted).
    ``dump_torch_api``: also record the ATen ops inside each module (xray's tracer).
    ``flush_secs``: statistics-only dumps write the HDF5 index at most this often (0: at every
    ``stop()``); see the module docstring.
    ``process_rank``: (global rank, local rank, world size) when a training framework knows them
    (default: torch.distributed's, or rank 0).
    """

    def __init__(self, dump_path: str | os.PathLike = "xray_module_dump", hook_name: str = "dump",
                 rank: Selection = None, step: Selection = None, model: torch.nn.Module | None = None,
                 dump_torch_api: bool = False, *, task: str = "tensor", backward: bool = True,
                 flush_secs: float = 1.0, process_rank: tuple[int, int, int] | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"PrecisionDebugger: model must be a torch.nn.Module, got {type(model).__name__}; "
                            "pass model=<your nn.Module>")
        if hook_name not in HOOK_NAMES:
            raise ValueError(f"PrecisionDebugger: hook_name={hook_name!r}; use one of {', '.join(HOOK_NAMES)}")
        if task not in TASKS:
            raise ValueError(f"PrecisionDebugger: task={task!r}; use one of {', '.join(TASKS)}")
        if isinstance(flush_secs, bool) or not isinstance(flush_secs, (int, float)) or not flush_secs >= 0:
            raise ValueError(f"PrecisionDebugger: flush_secs={flush_secs!r}; use a number of seconds >= 0")
        self.model = model
        self.hook_name = hook_name
        self.task = task
        self.steps = parse_selection(step, "step")
        self.ranks = parse_selection(rank, "rank")
        self.dump_torch_api = dump_torch_api
        self.flush_secs = float(flush_secs)
        self._flushed_at = -math.inf  # time.monotonic() of the last write: the first stop() writes
        # (global rank, local rank, world size): a training framework's own (the callbacks in
        # xray.integrations pass them), else torch.distributed's; a single process is rank 0
        g, local, self.world_size = process_rank if process_rank is not None else dist_ranks()
        self.global_rank, self.local_rank = g or 0, local or 0
        self.dump_path = Path(dump_path)
        self.current_step = 0
        self.first_overflow: OverflowReport | None = None
        self.failed: str | None = None
        self._next_seq = itertools.count().__next__  # the sequence number of the next record
        self._running = False
        self.file = self.dump_path / f"{rank_file_stem(self.global_rank, self.local_rank)}.h5"
        self.summary_csv = self.dump_path / f"{rank_file_stem(self.global_rank, self.local_rank)}_summary.csv"
        self._csv_rows = 0  # rows already in summary_csv
        self._csv_step: int | None = None  # the step last appended to it
        self._csv_mark = (0, 0)  # (bytes, rows) of the CSV before that step's rows
        self._check_writable()
        self._writer = ModuleDumpWriter(self.file, {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch_version": torch.__version__,
            "python_version": platform.python_version(), "host": platform.node(), "pid": os.getpid(),
            "rank": self.global_rank, "global_rank": self.global_rank, "local_rank": self.local_rank,
            "world_size": self.world_size, "hook_name": hook_name, "task": task,
            "model_class": type(model).__name__, "dump_torch_api": bool(dump_torch_api),
            "math": math_settings.current()})
        self._capture = TensorCapture(self._writer, save_data=task == "tensor",
                                      overflow_only=hook_name == "overflow_check", on_overflow=self._on_overflow)
        self._hooks = ModuleHooks(model, self._capture, self._next_seq, backward=backward, on_error=self._fail)
        self._aten: AtenCapture | None = None
        self._aten_seq: dict[int, int] = {}  # this step's recorder seq -> the dump's seq
        # Rows still in memory reach the file when the debugger is collected or Python exits,
        # even without close(): including a step cut short by an exception, the rows up to it.
        self._finalizer = weakref.finalize(self, _write_pending, self._writer)
        # At exit, run it before h5py's own exit hook closes every HDF5 object: atexit runs
        # last-registered first, and weakref.finalize's hook may predate h5py's import.
        self._finalizer.atexit = False
        atexit.register(self._finalizer)

    def _check_writable(self) -> None:
        if not self.rank_selected:
            return
        try:
            self.dump_path.mkdir(parents=True, exist_ok=True)
            probe = self.dump_path / f".xray-write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise DumpPathError(f"PrecisionDebugger: cannot write to dump_path {self.dump_path}: "
                                f"{e.strerror or e}; pass a writable folder") from None

    # -- selection ---------------------------------------------------------------------------
    @property
    def rank_selected(self) -> bool:
        return self.ranks is None or self.global_rank in self.ranks

    @property
    def step_selected(self) -> bool:
        return self._selected(self.current_step)

    def _selected(self, step: int) -> bool:
        return self.steps is None or step in self.steps

    @property
    def running(self) -> bool:
        return self._running

    # -- the API -----------------------------------------------------------------------------
    def start(self) -> None:
        """Begin capturing, if this rank and the current step are selected (else do nothing)."""
        if self._running or self.failed is not None or not (self.rank_selected and self.step_selected):
            return
        if self.task == "tensor":  # its data goes into the file during the step
            self._writer.open()
        self._capture.new_step()
        self._aten_seq.clear()
        self._hooks.install(self.current_step)
        if self.dump_torch_api:
            if self._aten is None:
                self._aten = AtenCapture(self.model, self._on_op)
            self._aten.start()
        self._running = True

    def stop(self) -> Path | None:
        """Stop capturing (every forward is restored), append the step's rows to the summary
        CSV and, when due (see the module docstring), finish the file: complete, renamed into
        place. Returns the file's path if it was written."""
        if not self._running:
            return None
        self._running = False
        self._hooks.remove()
        if self._aten is not None:
            self._aten.stop()
        if self._writer.failed:  # a write error dropped this step (see _fail)
            return None
        try:
            self._capture.end_step(self.current_step)
            self._append_csv()
            if (self._writer.is_open or not self._selected(self.current_step + 1)
                    or self._writer.held_rows >= MAX_HELD_ROWS
                    or time.monotonic() - self._flushed_at >= self.flush_secs):
                return self.flush()
        except OSError as e:  # a full disk: warn, keep the steps written, never break training
            self._fail(e)
        return None

    def flush(self) -> Path | None:
        """Write every captured step the file lacks, between steps; returns the file's path if
        it was written."""
        if self._running:
            raise RuntimeError("PrecisionDebugger.flush() is for between steps: call stop() first")
        try:
            path = self._writer.close()
        except OSError as e:
            self._fail(e)
            return None
        self._flushed_at = time.monotonic()
        # Only the current step can be captured again (steps only advance): earlier rows are in
        # the file and the CSV, and keeping them would grow memory with every step of a long run.
        self._writer.forget_before(self.current_step)
        return path

    def _append_csv(self) -> None:
        if self._csv_step == self.current_step:  # captured this step again: replace its rows
            size, self._csv_rows = self._csv_mark
            if self._csv_rows:
                os.truncate(self.summary_csv, size)
        else:
            self._csv_mark = (self.summary_csv.stat().st_size if self._csv_rows else 0, self._csv_rows)
        self._csv_rows = append_index_csv(self._writer.csv_rows(self.current_step), self.current_step,
                                          self.global_rank, self.summary_csv, self._csv_rows)
        self._csv_step = self.current_step

    def set_step(self, step: int) -> None:
        """Take a training framework's own step number (its callbacks count steps, not this
        debugger); between steps only, and steps only advance."""
        if self._running:
            raise RuntimeError("PrecisionDebugger.set_step() is for between steps: call stop() first")
        if isinstance(step, bool) or not isinstance(step, int) or step < self.current_step:
            raise ValueError(f"PrecisionDebugger.set_step({step!r}): steps only advance (now {self.current_step})")
        self.current_step = step

    def step(self) -> None:
        """End the current training step: stop if running, and count the next step."""
        self.stop()
        self.current_step += 1

    def close(self) -> None:
        """Stop if running and write what the file lacks. (The model carries nothing of the
        debugger's outside ``start()``/``stop()``.)"""
        self.stop()
        self.flush()

    def __enter__(self) -> "PrecisionDebugger":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()  # a ``with`` block leaves nothing on the model

    # -- callbacks ---------------------------------------------------------------------------
    def _on_op(self, record: Record) -> None:
        if not self._running or self.failed is not None:
            return
        seq = self._next_seq()
        self._aten_seq[record.seq] = seq
        _renumber_sources(record, self._aten_seq)
        record.seq = record.first_seq = record.last_seq = seq
        record.step = self.current_step
        self._writer.add_aten(self.current_step, record.to_json())

    def _on_overflow(self, call: CallKey, name: str, s: Stats) -> None:
        if self.first_overflow is not None:
            return
        self.first_overflow = OverflowReport(call.step, self.global_rank, name, call.path, call.cls,
                                             call.call_index, call.direction, s.nan, s.posinf, s.neginf)
        print(f"xray overflow_check: {self.first_overflow}", file=sys.stderr)

    def _fail(self, e: Exception) -> None:
        """Stop capturing after an error (disk full, a bug), but never break the user's model.
        A write error (OSError) also drops the step being captured, whose data the disk did
        not take, and finishes the file with the steps before it (ModuleDumpWriter.abandon)."""
        if self.failed is not None:
            return
        self.failed = f"{type(e).__name__}: {e}"
        self._hooks.remove()
        kept = ""
        if isinstance(e, OSError):
            path = self._writer.abandon(self.current_step)
            kept = (f"; the steps written before step {self.current_step} stay readable in {path}" if path
                    else f"; {self._writer.path} could not be finished")
        warnings.warn(f"xray PrecisionDebugger: capture stopped: {self.failed}{kept}", RuntimeWarning, stacklevel=3)


def _write_pending(writer: ModuleDumpWriter) -> None:
    """The finalizer's job (no reference to the debugger, or it would never be collected). A
    dump folder removed meanwhile is left removed."""
    if (writer.pending or writer.is_open) and not writer.failed and writer.path.parent.is_dir():
        try:
            writer.close()
        except Exception as e:  # at exit there is no caller to raise to
            print(f"xray PrecisionDebugger: could not write {writer.path}: {e}", file=sys.stderr)


def _renumber_sources(record: Record, seq_of: dict[int, int]) -> None:
    """Point op sources at the dump's numbering; a producer outside this step's records is an
    input of the step (it ran before start())."""
    for _, meta in record.input_tensors():
        src = Source.parse(meta.source)
        if src is not None and src.kind == "op":
            new = seq_of.get(src.seq)
            meta.source = "input" if new is None else f"op:{new}:{src.index}"
