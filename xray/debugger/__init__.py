"""Module-level precision dump: PrecisionDebugger writes one HDF5 file per rank (xray-module)."""
from .debugger import OverflowReport, PrecisionDebugger
from ..dump.module_reader import ModuleDump, read_module_dump
from .steps import SelectionError, parse_selection
from ..dump.module_writer import DumpPathError

__all__ = ["PrecisionDebugger", "OverflowReport", "ModuleDump", "read_module_dump", "SelectionError",
           "parse_selection", "DumpPathError"]
