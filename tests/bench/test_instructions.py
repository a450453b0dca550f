"""The instruction counts of `bench.instructions`: a dump's total is read back, and a process
under callgrind counts only between switching instrumentation on and its dump."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.callgrind import VALGRIND, totals
from bench.chaincrawl_bench import ROOT

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
    reason="valgrind (callgrind) not installed",
)

LOOP = """
import sys
from bench.callgrind import callgrind
sum(range(2_000_000))  # start-up work: not counted
callgrind("-i", "on")
callgrind("-z")
sum(range(int(sys.argv[1])))
callgrind("-d")
callgrind("-i", "off")
sum(range(2_000_000))  # after the dump: not in it
"""


def test_totals_reads_a_dumps_instruction_count(tmp_path: Path) -> None:
    dump = tmp_path / "cg.out.1"
    dump.write_bytes(
        b"# callgrind format\nevents: Ir\nsummary: 123456\n\nfn=(1) f\n0 5\ntotals: 123456\n"
    )
    assert totals(dump) == 123456
    (tmp_path / "empty").write_bytes(b"# callgrind format\n")
    with pytest.raises(RuntimeError, match="no totals"):
        totals(tmp_path / "empty")


@needs_valgrind
def test_only_the_work_between_on_and_the_dump_is_counted(tmp_path: Path) -> None:
    counts = []
    for n in (1_000_000, 2_000_000):
        out = tmp_path / f"loop{n}.out"
        subprocess.run(
            [*VALGRIND, f"--callgrind-out-file={out}", sys.executable, "-c", LOOP, str(n)],
            cwd=ROOT, env={**os.environ, "BENCH_CALLGRIND": "1", "PYTHONPATH": str(ROOT)},
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        counts.append(totals(Path(f"{out}.1")))
    small, big = counts
    # the loop dominates and doubles; the 2M-step loops before and after are left out
    assert 1.8 < big / small < 2.2, counts
