"""What xray knows about ATen operators, in one place: which ones a dump may never make it run
(safety.py), how a recorded call is rebuilt, its op resolved safely and its inputs materialized
(rebuild.py), which calls produce values their inputs do not determine (nondeterminism.py), and which read no
value of their inputs (reads.py).
Shared by xray-gen, xray-replay and compare's recomputation."""
