"""A message whose state lives on a lost slot range (`utils.slots`): parked, not requeued.

Requeued at once, such a message comes straight back: every slot of every worker would spin
through it, a warning and a traceback a delivery, while the runs on the surviving masters
wait behind it. Parked instead: sent again with a countdown (`park_seconds`, the message
held by the broker or the worker until then, no slot of the worker held) and the delivery
acknowledged once the new one is out, as a retry is. The countdown stays under the broker's
visibility timeout (half of it), as every retry's (`lifecycle.policy.countdown_cap`): a
Redis broker holds a countdown message in `unacked` while the worker waits for it, and
kombu's visibility sweep gives back any message held longer while the worker still holds
it, so each park ran twice and the copies of a parked task doubled every countdown
(measured: 148 parks in 93 s for 2 tasks under a 6 s visibility timeout and a 10 s
countdown). Nothing of the run's state changed (its
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
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis

from config import Settings, get_settings
from ledger.state import RunState
from monitor.metrics import aggregator
from utils.keyspace import Keyspace
from utils.outage import OUTAGE, Outage
from utils.redis import failed_node, get_redis
from utils.slots import LostRange, SlotsLost, concerning, lost_now, reason
from utils.wire import TaskMeta

# the errors of a state store that may mean a lost slot range (`utils.slots.lost_now` tells)
STATE_STORE_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
)
PARK_SECONDS = 10.0  # a parked message's longest countdown: the slots' return is seen within it
SURPLUS_MARGIN = 1.0  # a park's own message comes back a countdown after it, never sooner

log = logging.getLogger("chaincrawl.redis")

# a delivery's count taken back (never below 0): `uncount_delivery`
_UNCOUNT = """local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n > 0 then return redis.call('DECR', KEYS[1]) end
return 0"""


def park_seconds(s: Settings | None = None) -> float:
    """A parked message's countdown: `PARK_SECONDS`, under the broker's visibility timeout
    (half of it, at least 1 s, as `countdown_cap`; not the retries' backoff cap), or kombu
    gives the waiting message back while the worker holds it and both copies park again
    (the module docstring)."""
    return min(PARK_SECONDS, max(1.0, 0.5 * (s or get_settings()).visibility_timeout))


class LostOutage:
    """This process's view of lost slots: since when messages are parked, how many."""

    def __init__(self, outage: Outage = OUTAGE) -> None:
        self.outage = outage
        self.lock = threading.Lock()
        self.since: float | None = None
        self.parked = 0
        self.dropped = 0  # surplus copies acknowledged without a new message (`surplus`)
        self._last: dict[str, float] = {}  # task id -> when this process last parked it

    def surplus(self, tid: str, now: float | None = None, countdown: float = PARK_SECONDS) -> bool:
        """A delivery of task `tid` that meets its lost slots less than a countdown after
        this process parked the same task: the message that park sent is still waiting for
        its countdown, so this one is a surplus copy (a redelivery of a message parked
        before, a re-send): acknowledged without a new message. Each park of a copy sends
        one, so the copies of a task never die out and any duplication multiplied over a
        long loss (206 parks in 77 s for 2 tasks; 1,250 copies of each waiting in a
        worker). Else the park is noted (True once a countdown for each task id).

        The cause of those copies was a countdown longer than the visibility timeout (see
        the module docstring); this stays as a guard against the copies other causes make
        in one process (a delivery held past the visibility timeout, a sweeper's re-send)."""
        if not tid:
            return False
        now = time.monotonic() if now is None else now
        with self.lock:
            last = self._last.get(tid)
            window = countdown - min(SURPLUS_MARGIN, countdown / 4)
            if last is not None and now - last < window:
                self.dropped += 1
                return True
            self._last[tid] = now
            if len(self._last) > 10_000:  # the parks older than two countdowns are done with
                self._last = {t: at for t, at in self._last.items() if now - at < 2 * PARK_SECONDS}
        return False

    def parked_one(
        self, task: str, ranges: list[LostRange], countdown: float = PARK_SECONDS
    ) -> None:
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
                countdown,
            )

    def served(self) -> None:
        """A page committed: ends the outage, with one line, if there was one."""
        if self.since is None:  # the common case, without the lock
            return
        with self.lock:
            if self.since is None:
                return
            took, n, dropped = time.monotonic() - self.since, self.parked, self.dropped
            self.since, self.parked, self.dropped = None, 0, 0
            self._last.clear()
        log.warning(
            "lost slots served again after %.1fs (%d message(s) parked meanwhile%s)",
            took,
            n,
            f", {dropped} surplus copies dropped" if dropped else "",
        )


LOST = LostOutage()


def _count(counts: dict[str, int]) -> None:
    s = get_settings()
    aggregator().start(get_redis(s.redis_url), s.metrics_flush_interval)
    aggregator().add((s.key("metrics", "cluster"),), counts)


def lost_for_message(
    client: Any, error: BaseException, tasks: Iterable[tuple[str, Mapping[str, Any] | None]]
) -> list[LostRange]:
    """The lost slot ranges a state-store `error` met by a message concerns (its tasks: each
    task's name and wire metadata; a batch has several): those of the node the error came
    from, of its tasks' runs and sites, or all of them when the cluster refuses every
    command (`utils.slots.concerning`). [] when no range is lost, or the error is about
    another node while one is (a failover elsewhere): the message is requeued as in any
    outage, not parked for the lost range's whole length."""
    ranges = lost_now(client, error)
    if not ranges:
        return []
    cause = error.__cause__ if isinstance(error, SlotsLost) and error.__cause__ else error
    ks = Keyspace(get_settings().key_prefix)
    keys: list[str] = []
    for task, wire in tasks:
        rid = TaskMeta.from_wire(wire).run_id
        if rid:
            keys.append(ks.run(rid))
        keys.append(ks.site(task.split(".", 1)[0]))
    return concerning(ranges, keys, failed_node(cause), cause)


def parked_meta(wire: Mapping[str, Any] | None) -> TaskMeta:
    """The metadata a parked message is sent again with: the park counted as a wait, not as
    a retry (Celery's retry number goes up by one), so a long loss spends none of the page's
    retries (`lifecycle.page.fail_page`: retries used = retries - waits)."""
    meta = TaskMeta.from_wire(wire)
    meta.waits += 1
    return meta


def uncount_delivery(state: RunState, rid: str, tid: str, attempt: int) -> None:
    """A message requeued, not acknowledged, because the state store could not take its
    change (a node that did not answer, replicas that did not confirm it): its delivery
    counted by `begin` is taken back, so the redelivery is not charged as a worker's death
    (`CHAINCRAWL_MAX_REDELIVERIES`, `redelivered`). Without it each Redis restart in the
    middle of a page charged that page once, and a few of them dead-lettered it as
    `PoisonMessage`. With the store not answering, the key waits in the process and is
    taken back before its next delivery here begins (`uncount_pending`): the store that
    refused the commit refuses that begin too, until it is back."""
    key = state.deliveries_key(rid, tid, attempt)
    with _UNCOUNT_LOCK:
        _UNCOUNTED[key] = _UNCOUNTED.get(key, 0) + 1  # one a requeue: the same message may
    uncount_pending(lambda: state)  # be begun and requeued again before Redis is back


def uncount_pending(state: Callable[[], RunState]) -> None:
    """Take back the deliveries this process's requeues left counted (nothing at all when
    none: the common case, once a page). A redelivery that began elsewhere meanwhile has
    seen one delivery too many (counted `redelivered`); the count never goes below 0."""
    if not _UNCOUNTED:
        return
    r = state().r
    for key in list(_UNCOUNTED):
        with _UNCOUNT_LOCK:
            n = _UNCOUNTED.pop(key, 0)
        for i in range(n):
            try:
                r.eval(_UNCOUNT, 1, key)
            except STATE_STORE_ERRORS:
                with _UNCOUNT_LOCK:  # still away: the next delivery here tries again
                    _UNCOUNTED[key] = _UNCOUNTED.get(key, 0) + n - i
                return


# delivery counters of requeued messages not taken back yet, each with its requeues
_UNCOUNTED: dict[str, int] = {}
_UNCOUNT_LOCK = threading.Lock()
