"""benchsite pc: the demo's pc pages with the benchmark's parse work (bench/workload.py)."""
