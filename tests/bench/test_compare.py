from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import pinning
from bench.compare import Row, scale_base, scale_pairs


@pytest.mark.parametrize(
    ("system", "base"),
    [
        ("chaincrawl x2", "chaincrawl x1"),
        ("chaincrawl [threads] x2", "chaincrawl [threads] x1"),
        ("chaincrawl x2 on 2 cores", "chaincrawl x1 on 1 core"),
        ("cc+proto(batch) [threads] x4 on 4 cores", "cc+proto(batch) [threads] x1 on 1 core"),
        ("chaincrawl x1 on 1 core", "chaincrawl x1 on 1 core"),
        ("scrapy", "scrapy"),
    ],
)
def test_scale_rows_divide_by_their_own_one_worker_row(system: str, base: str) -> None:
    assert scale_base(system) == base


def test_scale_pairs_divide_each_repeat_by_its_own_partner_and_flag_a_noisy_run() -> None:
    def row(system: str, runs: list[tuple[float, float]]) -> Row:
        return Row("scale", system, "replay",
                   [{"pages_per_s": p, "cpu_ms_per_page": c} for p, c in runs])  # fmt: skip

    rows = [
        row("chaincrawl x1", [(1000, 1.0), (900, 1.02)]),
        row("chaincrawl x2", [(1700, 1.0), (1800, 1.01)]),
        row("chaincrawl x1 on 1 core", [(800, 1.0), (800, 1.0), (700, 1.0)]),
        row("chaincrawl x2 on 2 cores", [(1600, 1.0), (1300, 1.3), (1650, 1.0)]),
    ]
    unpinned, pinned = scale_pairs(rows)
    assert unpinned.split(": ", 1)[1] == "pairs 1.70x 2.00x, median 1.85x"
    assert "chaincrawl x2 on 2 cores: pairs 2.00x 1.62x 2.36x, median 2.00x" in pinned
    assert pinned.endswith("by >10 %: x2 on 2 cores run 2 1.30 ms")


@pytest.mark.skipif(not pinning.supported(), reason="no sched_setaffinity here")
def test_pinned_covers_threads_and_children_and_is_undone() -> None:
    import threading

    ready, done = threading.Event(), threading.Event()
    seen: dict[str, set[int]] = {}

    def thread() -> None:  # started before pinning: must be moved too
        ready.set()
        done.wait(10)
        seen["thread"] = os.sched_getaffinity(0)

    t = threading.Thread(target=thread)
    t.start()
    ready.wait(10)
    code = "import os,sys; print(sorted(os.sched_getaffinity(0))); sys.stdin.read()"
    before = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert before.stdout is not None
        assert before.stdout.readline()  # running, so pinning finds it as a child
        cores = pinning.allowed()
        first = cores[0]
        with pinning.pinned(1):
            assert os.sched_getaffinity(0) == {first}
            assert os.sched_getaffinity(before.pid) == {first}
            done.set()
            t.join(10)
            once = "import os; print(sorted(os.sched_getaffinity(0)))"
            after = subprocess.run([sys.executable, "-c", once], capture_output=True, text=True)
            assert after.stdout.strip() == f"[{first}]"  # started while pinned: inherits it
        assert seen["thread"] == {first}
        assert os.sched_getaffinity(0) == set(cores)
        assert os.sched_getaffinity(before.pid) == set(cores)
    finally:
        done.set()
        before.kill()
        before.wait()


@pytest.mark.skipif(not pinning.supported(), reason="no sched_setaffinity here")
def test_pinning_to_more_cores_than_allowed_is_refused() -> None:
    n = len(pinning.allowed()) + 1
    with pytest.raises(ValueError, match=f"cannot pin to {n} cores"), pinning.pinned(n):
        pass


def test_loop_ms_measures_cpu_time_of_a_fixed_loop() -> None:
    from bench.compare import loop_ms

    small, big = loop_ms(20_000), loop_ms(400_000)
    assert 0 < small < big  # CPU time grows with the work, whatever the machine's speed
