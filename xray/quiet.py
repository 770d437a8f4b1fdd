"""Known third-party log lines that are not xray's and say nothing about the user's run.

transformers imports torchao whenever it is installed (ExecuTorch requires it): torchao then logs
"Failed to load .../_C*.so" for its prebuilt kernels built for CUDA or another Python, and torch
warns that torchao's enums need no pytree registration; torch.export and the ONNX exporter add
a pytree deprecation warning and one line per torchvision op they cannot register. xray's console
scripts drop exactly those lines; every other log line and warning still prints.

A user's own program gets the same by calling ``xray.quiet_third_party()`` before it imports
transformers (docs/guide.md). ``import xray`` alone changes nothing: filters are installed
only when asked for, and only on those loggers and that one warning message.
"""
from __future__ import annotations

import io
import logging
import sys
import warnings
from contextlib import contextmanager, redirect_stderr
from typing import Iterator

#: logger name -> fragments of the messages to drop (only records logged on that logger itself)
KNOWN_NOISE = {
    "torchao": ("Failed to load ", "Skipping import of cpp extensions"),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported",),
    # the ONNX exporter announces every torchvision op it cannot register (xray drift, replay)
    "torch.onnx._internal.exporter._registration": ("torchvision is not installed",),
}
#: (category, message regex) of warnings torch raises from its own internals during export
KNOWN_WARNINGS = ((FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),)


class _DropKnown(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(f in message for f in self.fragments)


def quiet_third_party() -> None:
    """Drop the known foreign lines from now on (idempotent; cheap: imports nothing)."""
    for name, fragments in KNOWN_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(fragments))
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def one_line(error: object, limit: int = 500) -> str:
    """An error message on one line of at most ``limit`` characters: a library's message (h5py's,
    HDF5's) may span several, and a hostile dump's values must not flood the terminal."""
    from .dump.model import printable

    text = printable(" ".join(str(error).split()))  # a dump's names in a message: no terminal escapes
    return text if len(text) <= limit else text[: limit - 3] + "..."


def os_error_line(error: OSError, path: object = None) -> str:
    """An OSError as ``<file>: <reason>`` on one line: the file from the error itself, else
    ``path``; an OutputWriteError's message already names its file and is used as it is."""
    from .dump.atomic import OutputWriteError

    if isinstance(error, OutputWriteError):
        return one_line(error.strerror or error)
    where = error.filename or path
    reason = error.strerror or error
    return one_line(f"{where}: {reason}" if where else reason)


#: line prefixes of ExecuTorch's C++ runtime logs that say nothing about the run: XNNPACK's
#: threadpool probing for ARM CPU ids on every program load (the prebuilt wheel logs at Info
#: level, fixed at build time; its pybindings route the C++ log into Python's sys.stderr)
EXECUTORCH_NOISE = ("[cpuinfo_utils.cpp:",)


@contextmanager
def executorch_logs() -> Iterator[None]:
    """Around ExecuTorch runtime calls: drop its known log lines (EXECUTORCH_NOISE), pass every
    other line it writes on to stderr afterwards, in order."""
    buffer = io.StringIO()
    try:
        with redirect_stderr(buffer):
            yield
    finally:
        kept = [line for line in buffer.getvalue().splitlines(keepends=True) if not line.startswith(EXECUTORCH_NOISE)]
        if kept:
            sys.stderr.write("".join(kept))
