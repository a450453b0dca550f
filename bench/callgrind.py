"""Counting a process's instructions with callgrind for part of its life (`bench.instructions`).

The process runs under `valgrind --tool=callgrind --instr-atstart=no` (`VALGRIND`), so start-up
runs uninstrumented; `callgrind("-i", "on")` and `callgrind("-z")` start the count,
`callgrind("-d")` writes it to `<out file>.<n>`, `totals()` reads it back.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

VALGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
_TOTALS = re.compile(rb"^(?:totals|summary): (\d+)", re.M)


def callgrind(*args: str, pid: int | None = None) -> None:
    """`callgrind_control ARGS PID`. Without `pid`: this process, and only when it runs under
    callgrind for `bench.instructions` (`BENCH_CALLGRIND` set), else nothing."""
    if pid is None and os.environ.get("BENCH_CALLGRIND"):
        pid = os.getpid()
    if pid:
        subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def totals(path: Path) -> int:
    """Instructions (Ir) in one callgrind dump."""
    m = _TOTALS.search(path.read_bytes())
    if m is None:
        raise RuntimeError(f"no totals in {path}")
    return int(m.group(1))
