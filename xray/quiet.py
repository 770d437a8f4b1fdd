"""Known third-party log lines that are not xray's and say nothing about the user's run.

transformers imports torchao whenever it is installed (ExecuTorch requires it): torchao then logs
"Failed to load .../_C*.so" for its prebuilt kernels built for CUDA or another Python, and torch
warns that torchao's enums need no pytree registration. xray's console scripts drop exactly those
lines; every other log line and warning still prints.
"""
from __future__ import annotations

import logging

#: logger name -> fragments of the messages to drop (only records logged on that logger itself)
KNOWN_NOISE = {
    "torchao": ("Failed to load ", "Skipping import of cpp extensions"),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported",),
}


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


def one_line(error: object, limit: int = 500) -> str:
    """An error message on one line of at most ``limit`` characters: a library's message (h5py's,
    HDF5's) may span several, and a hostile dump's values must not flood the terminal."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
