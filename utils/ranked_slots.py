"""Page slots and fetch slots that go to the most urgent page first (gevent workers).

A gevent worker reserves one message per slot, and a message may carry a batch of up to
`CHAINCRAWL_BATCH` pages, so hundreds of reserved pages can wait for its slots at once. First
come, first served at the slots would let those pages hold back a more urgent run's page that
the broker had already put ahead of them. Measured (`tests/scheduling/test_priority.py`, 4
slots): a priority-9 page that arrived while a priority-1 run's 80 pages were reserved in four
batches was fetched after all 80 of them; served by rank, after 27. The fetch slots
(`CHAINCRAWL_FETCH_SLOTS`, below the page slots) are the same kind, so the urgent page does not
queue again there behind the pages already holding page slots.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class RankedSlots:
    """A counting semaphore for greenlets whose waiters are served highest rank first, then in
    arrival order. A released slot passes straight to the next waiter, so a newcomer never
    takes it from under one that has waited; a waiter killed just after a slot passed to it
    passes that slot on instead of leaking it."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"RankedSlots needs at least one slot, got {size}")
        self.size = size
        self._free = size
        self._waiting: list[tuple[int, int, Any]] = []  # heap of (-rank, arrival, event)
        self._arrival = itertools.count()

    @property
    def free(self) -> int:
        return self._free

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def acquire(self, rank: int = 0, timeout: float | None = None) -> bool:
        """Take a slot, waiting behind higher ranks and earlier arrivals of the same rank;
        False when `timeout` seconds passed first (the request deadline of a fetch slot)."""
        if self._free > 0:  # free slots and waiters never coexist: release hands over
            self._free -= 1
            return True
        from gevent.event import Event

        entry = (-rank, next(self._arrival), Event())
        heapq.heappush(self._waiting, entry)
        try:
            entry[2].wait(timeout)
        except BaseException:  # killed while waiting (a batch being cancelled, shutdown)
            if entry[2].is_set():
                self.release()  # the slot had just passed to us: pass it on
            else:
                self._drop(entry)
            raise
        if entry[2].is_set():
            return True
        self._drop(entry)  # timed out, still waiting: nothing was handed over
        return False

    def _drop(self, entry: tuple[int, int, Any]) -> None:
        self._waiting.remove(entry)
        heapq.heapify(self._waiting)

    def release(self) -> None:
        if self._waiting:
            heapq.heappop(self._waiting)[2].set()
        elif self._free >= self.size:
            raise ValueError("RankedSlots released more often than acquired")
        else:
            self._free += 1

    @contextmanager
    def slot(self, rank: int = 0) -> Iterator[None]:
        """`with slots.slot(rank):` holds one slot for the block."""
        self.acquire(rank)
        try:
            yield
        finally:
            self.release()
