"""xray-gen: turn a dump into a portable pytest suite, run it against a CPU reference, diff two runs."""
