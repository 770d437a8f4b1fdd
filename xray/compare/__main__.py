"""``python -m xray.compare BENCH TARGET OUT/``: under torchrun, each rank compares its own rank
pair from its node's disk and rank 0 reports; without torchrun, one process compares them all."""
import sys

from .distributed import main

sys.exit(main())
