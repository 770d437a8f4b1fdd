"""xray-summary: a statistics table of any xray dump (module-level .h5 or tracer folder)."""

__all__ = ["SUMMARY_COLUMNS", "CSV_COLUMNS", "SummaryRow", "dump_rows", "filter_rows"]


def __getattr__(name: str):  # PEP 562: ``xray-summary --help`` must not pay for torch and h5py
    if name in __all__:
        from . import table

        return getattr(table, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
