"""A Redis outage in a worker's log: one warning line when it starts, one when Redis answers
again, nothing in between and no traceback.

Every part of a worker that talks to Redis (Celery's consumer, the outbox drainer, the
sweeper, the task-set beat, the series sampler, the owner heartbeat) logs its own failure
each time it retries, some with a traceback: a ten-second outage made dozens of lines. The
`OutageFilter` on the worker's log handlers recognises those records by the exception they
carry (a Redis or kombu connection error, as an argument or as `exc_info`): the first of an
outage becomes one line without its traceback, the others are held back (counted). The first
success after it (`answered()`, or Celery's "Connected to" line) logs the recovery.

A command run by hand (the CLI, the outbox's `--status` and `--requeue-dead`) says the same on
stderr: `stderr_notify` gives `utils.redis.be_patient` its lines, defined here once.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import kombu.exceptions
import redis
from celery.exceptions import Reject

from utils.redis import Notify, NotReplicated, failed_node
from utils.slots import known_ranges, lost_node

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,  # BusyLoadingError included
    redis.TimeoutError,
    kombu.exceptions.OperationalError,
    ConnectionError,
    # a cluster that refuses while its nodes agree again (a restarted master rejoining) or
    # does not cover a slot yet: an outage of the same kind, waited out (a lost slot range
    # is told apart before: lifecycle/lost.py)
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
)
_CELERY_NOTICE = "In Celery 5.1 we introduced an optional breaking change"
_MARK = "_chaincrawl_outage"  # the decision, kept on the record for the process's other handlers

log = logging.getLogger("chaincrawl.redis")


def first_line(error: BaseException) -> str:
    """An error's first line (its type's name if it says nothing): a server's reply or a
    cluster's error can run to several lines, and what a user reads of it is one."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def stderr_notify(startup: str, wait: float) -> Notify:
    """`notify` for `utils.redis.be_patient` in a command run by hand: one line on stderr when
    Redis stops answering (or loads its data), naming the node (on a cluster the one that
    failed, not the startup node `startup`) and the wait, and one when it answers again."""
    said = [startup]

    def notify(error: Exception | None) -> None:
        if error is not None:
            said[0] = failed_node(error) or startup
        where = said[0]
        if error is None and where != startup:
            line = f"Redis Cluster answers again ({where} failed over, or back)"
        elif error is None:
            line = f"Redis at {where} answers again"
        elif isinstance(error, redis.BusyLoadingError):
            line = (
                f"Redis at {where} is loading, waiting… (up to {wait:.0f}s: CHAINCRAWL_REDIS_WAIT)"
            )
        else:
            line = (
                f"Redis at {where} does not answer ({first_line(error)}), waiting… (up to "
                f"{wait:.0f}s: CHAINCRAWL_REDIS_WAIT)"
            )
        print(line, file=sys.stderr)

    return notify


class Outage:
    """This process's view of Redis: answering, or away since `since`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        self.held = 0  # records held back during the current outage
        self.node = ""  # the node the outage's first error named ("" if none)
        self.held_lost = 0  # records about a lost slot range's nodes held back, ever

    def failed(self, exc: BaseException) -> bool:
        """A connection error: True for the first of an outage (to be said), else False."""
        with self._lock:
            if self.since is None:
                self.since, self.held, self.node = time.monotonic(), 0, failed_node(exc)
                return True
            self.held += 1
            return False

    def absorb(self, nodes: set[str]) -> None:
        """A lost slot range was said (lifecycle/lost.py): an outage begun on one of its
        `nodes` (the cluster had not flagged the range yet: it looked like a failover) is
        part of it and ends with it, without a line of its own."""
        with self._lock:
            if self.since is not None and self.node in nodes:
                self.since = None

    def answered(self, at: float | None = None) -> None:
        """Redis answered: ends the outage, with one line, if there was one. `at` (monotonic):
        when the caller last read everything it reads (a cluster drainer: every run's
        stream); older than the outage, it is no sign the failed node's slots are served
        (a loop that only waited, or read the other masters), and the outage goes on. An
        outage begun on a node of a slot range since seen lost goes on while the range is
        lost: it ends with the range's own line (`absorb`), or here once it is served."""
        if self.since is None:  # the common case, without the lock
            return
        with self._lock:
            if self.since is None or lost_node(self.node):
                return
            if at is not None and at < self.since:
                return
            took, held = time.monotonic() - self.since, self.held
            self.since = None
        log.warning(
            "Redis answers again after %.1fs (%d more error(s) about it not logged)", took, held
        )


OUTAGE = Outage()


def connection_error(record: logging.LogRecord) -> BaseException | None:
    """The connection error a record is about, if any (a write its replicas did not confirm
    is none: Redis answers)."""
    if record.exc_info and isinstance(record.exc_info[1], CONNECTION_ERRORS):
        return None if isinstance(record.exc_info[1], NotReplicated) else record.exc_info[1]
    args = record.args if isinstance(record.args, tuple) else ()
    found = (a for a in args if isinstance(a, CONNECTION_ERRORS))
    return next((a for a in found if not isinstance(a, NotReplicated)), None)


def requeued_quietly(record: logging.LogRecord) -> bool:
    """Celery's line (with a traceback) for a task that requeued its message because the
    state store did not answer or its replicas did not confirm: the task's own line said so
    already, once an outage (base_task.py, lifecycle/commits.py `requeue_unreplicated`)."""
    exc = record.exc_info[1] if record.exc_info else None
    return isinstance(exc, Reject) and isinstance(getattr(exc, "reason", None), CONNECTION_ERRORS)


def parked_quietly(record: logging.LogRecord) -> bool:
    """Celery's retry line for a message parked because its slots are lost: the worker's own
    line said so already, once an outage (lifecycle/lost.py)."""
    args = record.args
    if not isinstance(args, dict) or "retry:" not in str(record.msg):
        return False
    return "SlotsLost(" in str(args.get("exc", ""))


def _about_lost_range(exc: BaseException) -> bool:
    """An error from a node of a slot range this process saw lost (or the cluster's refusal
    while one is): the lost range's outage, not one of Redis. Without this, every part of a
    worker that meets the lost node (drainer, sweeper, heartbeat...) began an outage of its
    own and the next success ended it: a pair of lines every few seconds for as long as the
    range stayed lost."""
    if lost_node(failed_node(exc)):
        return True
    refused = redis.exceptions.ClusterDownError, redis.exceptions.SlotNotCoveredError
    return isinstance(exc, refused) and bool(known_ranges())


class OutageFilter(logging.Filter):
    """On a log handler: the first record of an outage as one line, the rest held back."""

    def __init__(self, outage: Outage = OUTAGE) -> None:
        super().__init__()
        self.outage = outage

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, _MARK, None)
        if decided is not None:
            return bool(decided)
        keep = True
        if record.name == "py.warnings" and _CELERY_NOTICE in str(record.args or record.msg):
            setattr(record, _MARK, False)  # Celery's notice at each lost connection that 6.0
            return False  # will cancel late-ack tasks: 8 lines about a setting left on purpose
        if requeued_quietly(record) or parked_quietly(record):
            setattr(record, _MARK, False)
            return False
        exc = connection_error(record)
        consumer = record.name.startswith("celery.worker.consumer")
        if exc is None and consumer and str(record.msg).startswith("Connection to broker lost"):
            exc = ConnectionError("the connection to the broker was lost")
        if exc is not None and _about_lost_range(exc):
            self.outage.held_lost += 1  # said once by the task that parks (lifecycle/lost.py)
            keep = False
        elif exc is not None:
            keep = self.outage.failed(exc)
            if keep:  # one line, no traceback
                record.msg = (
                    "Redis does not answer (%s: %s); this worker waits and retries, "
                    "one line when it answers again"
                )
                record.args = (type(exc).__name__, first_line(exc).rstrip("."))
                record.exc_info, record.exc_text, record.stack_info = None, None, None
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        elif consumer and str(record.msg).startswith("Connected to"):
            self.outage.answered()
        setattr(record, _MARK, keep)
        return keep


def install(logger: logging.Logger | None = None, outage: Outage = OUTAGE) -> None:
    """Put the filter on the logger's handlers (the root's: every record passes them)."""
    target = logger or logging.getLogger()
    for h in target.handlers:
        if not any(isinstance(f, OutageFilter) for f in h.filters):
            h.addFilter(OutageFilter(outage))
