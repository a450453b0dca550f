"""benchsite pc: the bench page sets (the demo's pc pages, the shop) with the benchmark's parse
work (bench/workload.py)."""
