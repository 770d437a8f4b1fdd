"""What xray knows about ATen operators, in one place: which ones a dump may never make it run
(safety.py), how a recorded call is rebuilt, its op resolved safely and its inputs materialized
(rebuild.py), and which calls produce values their inputs do not determine (nondeterminism.py).
Shared by xray-gen, xray-replay and compare's recomputation."""
