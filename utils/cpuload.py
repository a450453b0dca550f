"""How much of a core this process wants: the CPU it used plus the time its threads waited for one.

Why: batch sizing (`ledger.publish.batch_size`) packs several pages into one message only when the
worker is CPU-bound, and one page per message otherwise, because a latency-bound worker has the
CPU to spare and a batch runs its pages one after the other in one slot. The CPU share alone
cannot tell "latency-bound" from "CPU-bound on a shared machine": two workers on two cores,
beside Redis and the page server, each got 0.6-0.8 of a core, read as latency-bound, sent
four times the messages per page and paid twice the CPU per page for them (the scaling
benchmark: 1 worker 1.76 ms/page, 2 workers 3.5). Linux counts the time a thread was runnable but
waited on a run queue (`run_delay`, second field of `/proc/<pid>/task/<tid>/schedstat`,
CONFIG_SCHED_INFO); CPU + wait is what the process would have used with a core of its own.
Where the kernel does not say, the wait reads 0 and the meter is the plain CPU share.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

TASKS = "/proc/self/task"


def run_queue_wait() -> float | None:
    """Seconds all live threads of this process have waited for a CPU so far, or None where
    the kernel does not count it. Threads that exited take their share with them (callers
    clamp a negative delta), which is why this is only read over short windows."""
    total = 0
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return None
    seen = False
    for tid in tids:
        try:
            with open(f"{TASKS}/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
            seen = True
        except (OSError, IndexError, ValueError):
            continue  # the thread exited between the listing and the read
    return total / 1e9 if seen else None


class CpuMeter:
    """Share of one core this process wanted over the last `window` seconds (all threads).

    Read often (every page ticks it): within 1/5 of a window a new burst shows (a CPU-bound
    crawl's first publishes decide whether its subtrees run batched), and a window spanning
    an idle spell reads 0 (it says nothing about the burst starting now). The run-queue wait
    is read only when a window rolls (a file per thread) and added to the CPU share until the
    next roll."""

    def __init__(
        self,
        window: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
        waited: Callable[[], float | None] = run_queue_wait,
    ) -> None:
        self.window = window
        self._clock, self._cpu, self._waited = clock, cpu, waited
        self._start = self._cpu_start = 0.0
        self._wait_start: float | None = None
        self.cpu_share = 0.0  # CPU used over the last (or current) window, in cores
        self.wait_share = 0.0  # run-queue wait over the last full window, in cores
        self._last = 0.0
        self._lock = threading.Lock()

    def demand(self) -> float:
        """CPU share + run-queue wait share: near 1 for a CPU-bound single-threaded worker
        whatever else runs on its cores, well below 1 for a latency-bound one. Threads that
        find another one updating the window get the last reading: unlocked, a thread that
        read the clocks just before another rolled the window computed shares below zero
        (the threads pool then fell back to one page per message a third of the time)."""
        if not self._lock.acquire(blocking=False):
            return self._last
        try:
            now = self._clock()
            span = now - self._start
            if span >= self.window:  # roll the window
                cpu, waited = self._cpu(), self._waited()
                fresh = span < 5 * self.window
                self.cpu_share = (cpu - self._cpu_start) / span if fresh else 0.0
                prev = self._wait_start
                self.wait_share = (
                    max(0.0, waited - prev) / span
                    if fresh and waited is not None and prev is not None
                    else 0.0
                )
                self._start, self._cpu_start, self._wait_start = now, cpu, waited
            elif span >= self.window / 5:  # the window so far
                self.cpu_share = (self._cpu() - self._cpu_start) / span
            self._last = self.cpu_share + self.wait_share
            return self._last
        finally:
            self._lock.release()
