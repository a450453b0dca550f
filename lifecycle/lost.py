"""A message whose state lives on a lost slot range (`utils.slots`): parked, not requeued.

Requeued at once, such a message comes straight back: every slot of every worker would spin
through it, a warning and a traceback a delivery, while the runs on the surviving masters
wait behind it. Parked instead: sent again with a countdown (`PARK_SECONDS`, the message
held by the broker or the worker until then, no slot of the worker held) and the delivery
acknowledged once the new one is out, as a retry is. Nothing of the run's state changed (its
slots do not answer), so the redelivery finds the task as it was: committed once or not at
all, the outbox untouched.

The worker's log says it once an outage: one warning line naming the slots and the nodes
when the first message is parked, one when a page commits again after it; Celery's own
retry line for each parked message is held back, and so are the lines of the worker's other
parts (drainer, sweeper, heartbeat) about the lost nodes, however long the loss
(`utils.outage.OutageFilter`): the outage is this one, not one of Redis. Counted:
`lost_slots` (outages, one a worker process an outage) and `parked_lost` (messages) in
the `metrics:cluster` hash.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from config import get_settings
from monitor.metrics import aggregator
from utils.outage import OUTAGE, Outage
from utils.redis import get_redis
from utils.slots import LostRange, reason

# the errors of a state store that may mean a lost slot range (`utils.slots.lost_now` tells)
STATE_STORE_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
)
PARK_SECONDS = 10.0  # a parked message's countdown: the slots' return is seen within it

log = logging.getLogger("chaincrawl.redis")


class LostOutage:
    """This process's view of lost slots: since when messages are parked, how many."""

    def __init__(self, outage: Outage = OUTAGE) -> None:
        self.outage = outage
        self.lock = threading.Lock()
        self.since: float | None = None
        self.parked = 0

    def parked_one(self, task: str, ranges: list[LostRange]) -> None:
        """A message parked: the first of an outage says so (one line) and counts it."""
        with self.lock:
            self.parked += 1
            first = self.since is None
            if first:
                self.since = time.monotonic()
        counts = {"parked_lost": 1, "lost_slots": 1 if first else 0}
        _count(counts)
        if first:
            # the lines the worker's other parts would log about the lost nodes are held
            # back (utils.outage), and an outage they began before the range was flagged
            # lost ends with this one
            self.outage.absorb({n for r in ranges for n in (r.master, *r.replicas)})
            log.warning(
                "%s: %s; the runs on those slots are paused, their messages parked (sent again "
                "every %.0fs, not acknowledged until they run); one line when they are served",
                task,
                reason(ranges),
                PARK_SECONDS,
            )

    def served(self) -> None:
        """A page committed: ends the outage, with one line, if there was one."""
        if self.since is None:  # the common case, without the lock
            return
        with self.lock:
            if self.since is None:
                return
            took, n = time.monotonic() - self.since, self.parked
            self.since, self.parked = None, 0
        log.warning("lost slots served again after %.1fs (%d message(s) parked meanwhile)", took, n)


LOST = LostOutage()


def _count(counts: dict[str, int]) -> None:
    s = get_settings()
    aggregator().start(get_redis(s.redis_url), s.metrics_flush_interval)
    aggregator().add((s.key("metrics", "cluster"),), counts)
