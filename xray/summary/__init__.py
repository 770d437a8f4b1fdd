"""xray-summary: a statistics table of any xray dump (module-level .h5 or tracer folder)."""
from .table import SUMMARY_COLUMNS, CSV_COLUMNS, SummaryRow, dump_rows, filter_rows

__all__ = ["SUMMARY_COLUMNS", "CSV_COLUMNS", "SummaryRow", "dump_rows", "filter_rows"]
