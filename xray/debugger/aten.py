"""dump_torch_api=True: record the ATen ops inside each module with the tracer (xray.record).

The tracer's Recorder runs unchanged; only its writer is replaced by a sink that renumbers
each op record into the debugger's sequence (so ops and module calls share one order) and
hands it to the module-dump writer, which stores the records of a step as JSON lines in
``/step_<s>/aten``. Each op record's ``module`` field names the module it ran in.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

from ..record.config import DebugFlags, DumpConfig
from ..dump.model import Record
from ..record.tracer import Recorder, Tracing


class _OpSink:
    """The part of DumpWriter's interface the Recorder uses; tensors are never saved here."""

    def __init__(self, on_record: Callable[[Record], None]) -> None:
        self.on_record = on_record

    def add(self, record: Record) -> None:
        self.on_record(record)

    def count_changed(self, fold) -> None:  # de-duplication is off
        pass

    def save_tensor(self, record: Record, arg: str, t: torch.Tensor) -> str:
        raise RuntimeError("module dumps keep ATen op statistics only (dump_num=0)")

    def abandon(self) -> None:
        pass


class AtenCapture:
    def __init__(self, model: torch.nn.Module, on_record: Callable[[Record], None]) -> None:
        config = DumpConfig(debug=DebugFlags.META | DebugFlags.STATS | DebugFlags.BACKWARD, dedup=False, dump_num=0)
        self.recorder = Recorder(config, _OpSink(on_record))
        self.recorder.modules.path_of(model)  # name the model's tree first, so its root path is ""
        self.tracing = Tracing(self.recorder)
        self.thread: int | None = None
        _only_on_thread(self.recorder.modules, self)

    def start(self) -> None:
        self.thread = threading.get_ident()  # the tracer's ops are this thread's (its mode is thread-local)
        self.tracing.start()

    def stop(self) -> None:
        self.tracing.stop()

    @property
    def failed(self) -> str | None:
        return self.recorder.failed


def _only_on_thread(modules, owner: AtenCapture) -> None:
    """The tracer's module stack follows modules through process-wide forward hooks: another
    model running in a second thread would push its modules onto the stack and the recorded
    ops would be attributed to them. Its hooks are set per instance here to act only on the
    recording thread (``install`` reads them when tracing starts)."""
    pre, post, ident = modules._pre, modules._post, threading.get_ident

    def _pre(module, args):
        if ident() == owner.thread:
            return pre(module, args)
        return None

    def _post(module, args, *rest):
        if ident() == owner.thread:
            return post(module, args, *rest)
        return None

    modules._pre, modules._post = _pre, _post
