"""The reader's errors, in one place every part of the dump layer can raise them from."""
from __future__ import annotations


class DumpFormatError(ValueError):
    """The file is not a readable xray dump; the message says which file and what to do."""


class TruncatedDumpWarning(UserWarning):
    """The dump was never finalised (the process died); records come from the journal."""


class ColumnsError(DumpFormatError):
    """A columnar index is not valid (raised with the index file's name when it is known)."""


class RefusedRecordsWarning(UserWarning):
    """The validator refused some records (``TraceDump.refused`` says which and why); the
    rest of the dump opened."""
