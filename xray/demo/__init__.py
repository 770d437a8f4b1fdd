"""Demo material, not the core: the small real models that the demo, the tests, the benchmarks
and drift's examples record (models.py), fault injection (inject.py), recorded example pairs
(examples.py) and synthetic dumps for the compare tests and benchmarks (synthetic.py).

It imports no tool but the recorder, so every tool may use it; ``xray demo`` itself, which runs
every tool, is ``xray/demo_command.py``."""
