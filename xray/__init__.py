"""xray: operator-level precision debugging for PyTorch.

Record every ATen call (``begin_dump``/``end_dump``) or every module (``PrecisionDebugger``),
then generate op tests, replay on deployment backends, and compare dumps.

The public names are imported on first use (PEP 562): ``import xray`` and every console
script's ``--help`` stay free of torch, which takes seconds to import.
"""
from __future__ import annotations

import importlib
import sys
import types

__version__ = "0.1.0"

_PUBLIC = {  # name -> the module that defines it
    "begin_dump": ".record", "end_dump": ".record", "dump": ".record", "DumpUsageError": ".record",
    "load_dump": ".dump", "DumpFormatError": ".dump", "Record": ".dump", "Stats": ".dump", "TensorMeta": ".dump",
    "DebugFlags": ".record.config", "DumpConfig": ".record.config",
    "PrecisionDebugger": ".debugger", "OverflowReport": ".debugger",
    "read_module_dump": ".dump.module_reader",
    "drift": ".drift",
    "quiet_third_party": ".quiet",
}

__all__ = ["begin_dump", "end_dump", "dump", "load_dump", "DebugFlags", "DumpConfig", "Record", "Stats",
           "TensorMeta", "DumpFormatError", "DumpUsageError", "PrecisionDebugger", "drift", "quiet_third_party",
           "__version__"]


_SHADOWED = ("dump", "drift")  # functions named like the subpackage that implements them


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'xray' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


class _Package(types.ModuleType):
    """``xray.dump`` is the recording session (``with xray.dump(...)``), not the ``xray.dump`` subpackage;
    ``xray.drift`` is the function, not the ``xray.drift`` subpackage.

    The import system binds every loaded subpackage on its parent; this keeps that binding from
    hiding the function (the subpackage stays importable by its full name).
    """

    def __setattr__(self, name: str, value) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
