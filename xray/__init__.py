"""xray: operator-level precision debugging for PyTorch.

Record every ATen call (``begin_dump``/``end_dump``) or every module (``PrecisionDebugger``),
then generate op tests, replay on deployment backends, and compare dumps.
"""
from .config import DebugFlags, DumpConfig
from .dump import DumpFormatError, Record, Stats, TensorMeta, load_dump
from .record import DumpUsageError, begin_dump, dump, end_dump

__version__ = "0.1.0"

__all__ = ["begin_dump", "end_dump", "dump", "load_dump", "DebugFlags", "DumpConfig", "Record", "Stats",
           "TensorMeta", "DumpFormatError", "DumpUsageError", "PrecisionDebugger", "__version__"]


def __getattr__(name):  # the module debugger pulls in more; import it on first use
    if name in ("PrecisionDebugger", "OverflowReport"):
        from . import debugger

        return getattr(debugger, name)
    if name == "read_module_dump":
        from .dump.module_reader import read_module_dump

        return read_module_dump
    raise AttributeError(name)
