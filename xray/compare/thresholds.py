"""Compare's rules are xray.numerics.rules; this name stays for the command line's imports."""
from __future__ import annotations

from ..numerics.rules import Rules, Tolerance, default_tolerance, parse_tolerance_arg

__all__ = ["Rules", "Tolerance", "default_tolerance", "parse_tolerance_arg"]
