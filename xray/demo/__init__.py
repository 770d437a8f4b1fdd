"""Demo material, not the core: ``xray demo`` (run.py), the small real models it and the tests
record (models.py), fault injection (inject.py), recorded example pairs (examples.py) and
synthetic dumps for the compare tests and benchmarks (synthetic.py)."""
