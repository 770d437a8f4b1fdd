"""Numerics shared by xray's tools: finite-safe pairwise metrics (``metrics``) and the
tolerances, noise floors, ulp distances and pass/warn/fail rule (``rules``).

Imports nothing from a tool package, so compare, gen and replay can all stand on it.
"""
