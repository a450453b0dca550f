"""This process's own state, held in memory (no Redis command, no system call a page pays for).

- ids (`new_id`, `pid`): `uuid.uuid4()` reads 16 bytes from `os.urandom` and builds a UUID
  object for every id; a page makes several (its children, the delivery tags of their
  messages). Here an id is 80 random bits drawn once per process (and again in a forked child)
  followed by a 48-bit counter: 32 hex characters like `uuid4().hex`, unique across processes
  and restarts with the same odds, never reused within a process. `pid()` is `os.getpid()`
  read once per process (and again in a forked child): the per-process caches a page looks
  into (the runtime, the Redis clients, the metrics aggregator, the gate) ask for it often.
- `gevent_patched()`: whether this process runs on gevent (what may block, what may run side
  by side).
- activity (`note_work`, `Watch`, `gather`): what this process did lately, for the idle
  back-off of its background loops (the owner heartbeat, the time-series sampler, the outbox
  drainer's claims). Idle means no task started since the loop last looked
  (`Watch.worked()`), as the worker's `task_prerun` signal tells it (`note_work()`,
  worker.py); the drainer also counts the entries it stores. Counting is one integer
  increment. A loop that waits longer while idle is woken by the next start (`Watch.wait`),
  back to its base pace at once. The outbox drainer gathers the entries that keep coming for
  a short window before one read takes them all (`gather`); a commit that leaves its run no
  task outstanding ends the window at once (`note_tasks_done`).
- `RankedSlots`: page slots and fetch slots that go to the most urgent page first (gevent
  workers). A gevent worker reserves one message per slot, and a message may carry a batch of
  up to `CHAINCRAWL_BATCH` pages, so hundreds of reserved pages can wait for its slots at
  once; first come, first served would let them hold back a more urgent run's page the broker
  had already put ahead of them. Measured (`tests/scheduling/test_priority.py`, 4 slots): a
  priority-9 page that arrived while a priority-1 run's 80 pages were reserved in four batches
  was fetched after all 80 of them; served by rank, after 27. The fetch slots
  (`CHAINCRAWL_FETCH_SLOTS`) are the same kind, so the urgent page does not queue again there.
"""

from __future__ import annotations

import heapq
import itertools
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# --- ids ------------------------------------------------------------------------------------

_state: list[object] = []
_PID = os.getpid()


def _reseed() -> None:
    global _PID
    _state[:] = [os.urandom(10).hex(), itertools.count()]
    _PID = os.getpid()


_reseed()
os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A fresh 32-hex-character id (what `uuid.uuid4().hex` gives, at a fraction of the cost);
    `next` on the C counter is atomic under the GIL, so threads never share a value."""
    prefix, counter = _state
    return f"{prefix}{next(counter) & 0xFFFFFFFFFFFF:012x}"  # type: ignore[call-overload]


def pid() -> int:
    """This process's id, as `os.getpid()` (kept by a fork hook: no system call)."""
    return _PID


# --- gevent ---------------------------------------------------------------------------------


def gevent_patched() -> bool:
    """True once gevent monkey-patched `threading` (the gevent pool does it at start). Asked
    without importing gevent: a threads or prefork worker never loads it."""
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey is not None and monkey.is_module_patched("threading"))


# --- activity -------------------------------------------------------------------------------

_started = 0  # tasks started in this process (or anything else that counts as work)
_wakers: list[threading.Event] = []  # set by the next start: loops backed off for now
_tasks_done = threading.Event()  # set by a commit that left its run no task: gathering ends


def note_work() -> None:
    """A task starts in this process (worker.py, `task_prerun`), or other work is done that
    ends the back-off (the outbox drainer stored entries)."""
    global _started
    _started += 1
    if _wakers:
        for event in list(_wakers):
            event.set()


def started() -> int:
    """Tasks started in this process so far."""
    return _started


class Watch:
    """One loop's view: `worked()` says whether a task started since its last call; `wait()`
    waits, ending early at the next start."""

    def __init__(self) -> None:
        self._seen = _started
        self.wake = threading.Event()  # set by the next start during `wait`, or by `stop`

    def worked(self) -> bool:
        """Whether a task started since the last call (or since the watch was made)."""
        now = _started
        moved, self._seen = now != self._seen, now
        return moved

    def wait(self, timeout: float, stop: threading.Event | None = None) -> None:
        """Wait up to `timeout` seconds; a task starting meanwhile (or since the last
        `worked()`), `stop` set or `wake` set by another thread ends the wait early."""
        self.wake.clear()
        _wakers.append(self.wake)
        try:
            if _started != self._seen or (stop is not None and stop.is_set()):
                return
            self.wake.wait(timeout)
        finally:
            _wakers.remove(self.wake)


def note_tasks_done() -> None:
    """A commit in this process left its run with no task outstanding (its last items are in
    the outbox): a drainer gathering entries (`gather`) reads and stores them now. Also ends a
    gathering window for a stopping drainer."""
    _tasks_done.set()


def gather(timeout: float, stop: threading.Event | None = None) -> None:
    """Wait up to `timeout` seconds for more outbox entries to come; a run's tasks done in this
    process (`note_tasks_done`, since the last gather too) ends the wait early, as does `stop`
    set before it began."""
    if stop is not None and stop.is_set():
        return
    _tasks_done.wait(timeout)
    _tasks_done.clear()


# --- ranked slots -----------------------------------------------------------------------------


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

    def pass_on(self) -> None:
        """Release, and when the slot went straight to a waiter, yield to it once before going
        on: a fetch slot given back as a response is read lets the next request be sent
        before the caller parses that response (it would wait a page's CPU otherwise)."""
        handed = bool(self._waiting)
        self.release()
        if handed:
            import gevent  # a waiter exists only where gevent runs (acquire's Event)

            gevent.sleep(0)

    @contextmanager
    def slot(self, rank: int = 0) -> Iterator[None]:
        """`with slots.slot(rank):` holds one slot for the block."""
        self.acquire(rank)
        try:
            yield
        finally:
            self.release()
