"""What this process did lately, for the idle back-off of its background loops (no Redis command).

A worker's background loops (the owner heartbeat, the time-series sampler, the outbox
drainer's claims) each ask less of Redis while their process is idle. Idle here means: no
task started since the loop last looked (`Watch.worked()`), as the worker's `task_prerun`
signal tells it (`note_work()`, worker.py); the drainer also counts the entries it stores.
Counting is one integer increment: the page path pays nothing else. A loop that waits longer
while idle can ask to be woken by the next start (`Watch.wake`), so that it is back to its
base pace at once, not at the end of its longer wait.

The outbox drainer gathers the entries that keep coming for a short window before one read
takes them all (`gather`); a commit that leaves its run no task outstanding ends the window at
once (`note_tasks_done`), so a run's last items are stored without waiting it out.
"""

from __future__ import annotations

import threading

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
