"""`LimitedFetcher`: at most N requests in flight per worker process, the most urgent run's first."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

from exceptions import (
    FetchTimeout,
)
from external_interface.fetch.base import Fetcher, FetchRequest
from external_interface.fetch.response import Response
from utils.process import RankedSlots


class LimitedFetcher:
    """At most `slots` requests of this process in flight, whatever the number of task slots.

    A task slot also parses, commits, acks and takes its next message, a few ms in which its
    "request slot" sits idle: with 16 task slots and 250 ms pages that gap alone costs 1-2 % of
    the 64 pages/s bound. With more task slots than fetch slots (`-c 20`, 16 fetch slots) the
    next request starts the moment one ends, as Scrapy's CONCURRENT_REQUESTS counts downloads
    only, and the site still never sees more than `slots` at once. Waiting for a slot counts
    against the request's own deadline (a task's time limit does not fire under threads or
    gevent)."""

    def __init__(self, inner: Fetcher, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"fetch slots must be at least 1, got {slots}")
        self.inner = inner
        self.slots = slots
        self._sem: Any = None  # made at first use: after gevent
        self._ranked = False  # the slots go by FetchRequest.rank (gevent)
        self._made = threading.Lock()  # patched `threading` (a real lock would block the hub)

    def _semaphore(self) -> Any:
        if self._sem is None:
            with self._made:
                if self._sem is None:
                    sem = _bounded_semaphore(self.slots)
                    self._ranked = isinstance(sem, RankedSlots)
                    self._sem = sem
        return self._sem

    def fetch(self, req: FetchRequest) -> Response:
        sem = self._semaphore()
        t0 = time.monotonic()
        wait = max(0.0, req.timeout)
        got = sem.acquire(req.rank, wait) if self._ranked else sem.acquire(timeout=wait)
        if not got:
            raise FetchTimeout(
                f"no fetch slot free within {req.timeout:.1f} s ({self.slots} requests in "
                f"flight) for {req.url}"
            )
        try:
            waited = time.monotonic() - t0
            if waited > 0.001:
                req = replace(req, timeout=max(0.001, req.timeout - waited))
            resp = self.inner.fetch(req)
        except BaseException:
            sem.release()
            raise
        if self._ranked:  # the next request goes out before this response is parsed
            sem.pass_on()
        else:
            sem.release()
        return resp


def _bounded_semaphore(n: int) -> Any:
    """Ranked greenlet slots once gevent patched `threading` (utils/process.py): the
    stdlib semaphore is built on a Condition whose every acquire and release goes through the
    hub (three trips per request); these count in place, wake a waiter directly, and let the
    most urgent run's request go first. Threads: the stdlib semaphore, first come first served
    (a threads worker's page slots are its threads, already taken in the broker's order)."""
    from utils.process import gevent_patched

    if gevent_patched():
        return RankedSlots(n)
    return threading.BoundedSemaphore(n)
