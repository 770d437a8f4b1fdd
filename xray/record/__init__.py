"""Recording ATen calls and module boundaries (the tracer)."""
from .session import DumpUsageError, active_session, begin_dump, dump, end_dump, mark_program

__all__ = ["begin_dump", "end_dump", "dump", "active_session", "DumpUsageError", "mark_program"]
