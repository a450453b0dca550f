from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import pinning
from bench.compare import scale_base


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
