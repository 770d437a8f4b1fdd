"""One PrecisionDebugger per training run for the framework callbacks, and none of its errors
reaching the training loop.

A callback outlives a run: ``trainer.train()`` called again, or a new Trainer given the same
callback, restarts the framework's step count at 0, and a debugger's steps only advance. Each
run therefore gets its own debugger; the first run's file stays where it is, a later run's goes
into ``<dump_path>/run-<n>/`` beside it, never over it. A debugger error (a full disk, a bad
argument, a bug) becomes one warning and stops that run's capture: training goes on.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..debugger import PrecisionDebugger
from ..debugger.steps import Selection

T = TypeVar("T")


class DebuggerRuns:
    """The debugger of the current training run (``debugger``: the last run's, kept after it
    ends so its state can be read)."""

    def __init__(self, owner: str, dump_path: str | os.PathLike, step: Selection, rank: Selection,
                 kwargs: dict[str, Any]) -> None:
        self.owner = owner  # the callback's class name, for warnings
        self.dump_path, self.step, self.rank, self.kwargs = dump_path, step, rank, kwargs
        self.debugger: PrecisionDebugger | None = None
        self.runs = 0
        self.failed: str | None = None  # why the current run's capture stopped
        self._open = False

    def begin(self, model: Any, process_rank: tuple[int, int, int]) -> None:
        """A training run starts: a fresh debugger (one left open by a run that never ended is
        closed first)."""
        self.end()
        self.runs += 1
        self.failed = None
        path = Path(self.dump_path) if self.runs == 1 else Path(self.dump_path) / f"run-{self.runs}"
        debugger = self._guard("the start of training", lambda: PrecisionDebugger(
            path, model=model, step=self.step, rank=self.rank, process_rank=process_rank, **self.kwargs))
        if debugger is not None:
            self.debugger, self._open = debugger, True

    def step_begin(self, step: int) -> None:
        """Capture framework step ``step``, if selected (a step never ended is stopped first)."""
        debugger = self._live()
        if debugger is not None:
            self._guard(f"step {step}", lambda: (debugger.stop(), debugger.set_step(step), debugger.start()))

    def step_end(self) -> None:
        debugger = self._live()
        if debugger is not None:
            self._guard("the end of a step", debugger.stop)

    def end(self) -> None:
        """The run ends (or failed): what was captured reaches the file."""
        debugger = self._live()
        self._open = False
        if debugger is not None:
            self._guard("the end of training", debugger.close)

    def _live(self) -> PrecisionDebugger | None:
        return self.debugger if self._open and self.failed is None else None

    def _guard(self, when: str, action: Callable[[], T]) -> T | None:
        try:
            return action()
        except Exception as e:  # noqa: BLE001 - a callback must never break the user's training
            self.failed = f"{type(e).__name__}: {e}"
            warnings.warn(f"xray {self.owner}: capture stopped at {when}: {self.failed}; training goes on",
                          RuntimeWarning, stacklevel=3)
            if self.debugger is not None and self._open:
                try:
                    self.debugger.close()  # hooks off, and the steps captured so far to the file
                except Exception:  # noqa: BLE001 - already warned
                    pass
            return None
