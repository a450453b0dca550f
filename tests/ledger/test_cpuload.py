"""The CPU-demand meter (ledger/publish.py): the CPU a process wants (used + waited for), which
sizes the worker's batches."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ledger.publish import CpuMeter, run_queue_wait


def fake_meter() -> tuple[CpuMeter, dict[str, float]]:
    clock = {"wall": 1000.0, "cpu": 50.0, "wait": 7.0}
    meter = CpuMeter(  # binary fractions of a second: exact window arithmetic
        0.125, clock=lambda: clock["wall"], cpu=lambda: clock["cpu"], waited=lambda: clock["wait"]
    )
    return meter, clock


def test_a_burst_shows_within_its_first_window_and_an_idle_spell_reads_zero() -> None:
    """Batch sizing reads the meter: after an idle spell it must read the new burst within a
    fraction of its window, not the stale share of the last one (a CPU-bound crawl read 0 and
    stayed at one page per message)."""
    meter, clock = fake_meter()

    def run(seconds: float, share: float) -> float:
        clock["wall"] += seconds
        clock["cpu"] += seconds * share
        return meter.demand()

    assert run(10, 0.0) == 0.0  # after idling: nothing known yet
    assert run(0.03, 1.0) == pytest.approx(1.0)  # 30 ms into a burst it shows
    assert run(0.125, 1.0) == pytest.approx(1.0)
    assert run(0.125, 0.2) == pytest.approx(0.2)  # latency-bound: no batches
    assert run(2.0, 0.0) == 0.0  # a window spanning an idle spell says nothing


def test_time_spent_waiting_for_a_core_counts_as_wanted() -> None:
    """A CPU-bound worker sharing its cores gets 0.6 of one and waits the rest: it wants 1."""
    meter, clock = fake_meter()

    def run(seconds: float, share: float, waiting: float) -> float:
        clock["wall"] += seconds
        clock["cpu"] += seconds * share
        clock["wait"] += seconds * waiting
        return meter.demand()

    run(10, 0.0, 0.0)
    assert run(0.125, 0.6, 0.4) == pytest.approx(1.0)
    assert meter.cpu_share == pytest.approx(0.6) and meter.wait_share == pytest.approx(0.4)
    # within the next window: the CPU so far plus the last window's wait
    assert run(0.0625, 0.5, 0.5) == pytest.approx(0.9)
    assert run(0.0625, 0.3, 0.0) == pytest.approx(0.4 + 0.25)  # rolled: the halves averaged
    assert run(5.0, 0.0, 0.0) == 0.0  # idle again: neither share carries over


def test_without_schedstat_the_meter_is_the_cpu_share() -> None:
    clock = {"wall": 0.0, "cpu": 0.0}
    meter = CpuMeter(  # binary fractions of a second: exact window arithmetic
        0.125, clock=lambda: clock["wall"], cpu=lambda: clock["cpu"], waited=lambda: None
    )
    meter.demand()
    clock["wall"] += 0.1
    clock["cpu"] += 0.07
    assert meter.demand() == pytest.approx(0.7) and meter.wait_share == 0.0


def test_a_thread_that_exits_never_makes_the_wait_negative() -> None:
    meter, clock = fake_meter()
    clock["wall"] += 10
    meter.demand()
    clock["wall"] += 0.125
    clock["cpu"] += 0.0625
    clock["wait"] -= 3.0  # a thread with 3 s of waiting is gone from the sum
    assert meter.demand() == pytest.approx(0.5)


@pytest.mark.skipif(run_queue_wait() is None, reason="the kernel does not count run-queue waits")
def test_a_busy_process_on_oversubscribed_cores_reads_as_wanting_a_whole_core() -> None:
    """The real thing: with more busy processes than cores, this busy loop gets a fraction of a
    core; the meter still reads about one core, the CPU share alone well under it."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        time.sleep(0.2)  # the hogs are running
        meter = CpuMeter(0.3)
        meter.demand()
        end = time.monotonic() + 0.35
        while time.monotonic() < end:
            pass
        wanted = meter.demand()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert meter.cpu_share < 0.75, meter.cpu_share  # a third of a core or so
    assert wanted > 0.85, (meter.cpu_share, meter.wait_share)


def test_threads_reading_it_together_never_see_a_negative_share() -> None:
    """The threads pool asks from 16 threads at once, and a window roll reads a file per
    thread (the GIL is released meanwhile). Unlocked, a thread that read the clocks just
    before another rolled the window computed a negative share; a third of the readings fell
    below the batching threshold and the pool sent one page per message."""
    import threading

    def slow_wait() -> float:
        time.sleep(0.0005)  # the /proc reads: other threads run meanwhile
        return 0.0

    meter = CpuMeter(0.002, waited=slow_wait)
    seen: list[float] = []
    lock = threading.Lock()

    def hammer() -> None:
        mine = []
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            mine.append(meter.demand())
            sum(range(200))  # some CPU between readings
        with lock:
            seen.extend(mine)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) > 1000
    assert min(seen) >= 0.0, sorted(seen)[:5]


def test_the_window_so_far_reads_the_cpu_clock_at_most_every_twentieth_of_a_window() -> None:
    """Every page asks the meter; the process's CPU clock (a system call over every thread) is
    read once per 1/20 of a window at most, the reading in between kept."""
    clock = {"wall": 1000.0, "cpu": 50.0}
    reads = [0]

    def cpu() -> float:
        reads[0] += 1
        return clock["cpu"]

    meter = CpuMeter(0.125, clock=lambda: clock["wall"], cpu=cpu, waited=lambda: 7.0)
    meter.demand()  # the first window starts
    clock["wall"] += 0.03125  # a quarter in: past the fifth, so the window so far is read
    clock["cpu"] += 0.03125
    start = reads[0]
    assert meter.demand() == pytest.approx(1.0)
    assert reads[0] == start + 1
    for _ in range(10):  # ten asks within 1/20 of the window: no further read, same answer
        clock["wall"] += 0.0004
        assert meter.demand() == pytest.approx(1.0)
    assert reads[0] == start + 1
    clock["wall"] += 0.00625  # past 1/20 of the window since the read: read again
    clock["cpu"] += 0.0
    assert meter.demand() < 1.0
    assert reads[0] == start + 2
