"""lifecycle.lost with utils.outage: a long lost slot range is one warning line in a worker's
log and one when it ends, however many of the worker's parts meet the lost nodes meanwhile
(docs/cluster.md, "A lost slot range")."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis
from redis.crc import key_slot

import lifecycle.lost
import utils.slots
from config import Settings, get_settings
from lifecycle.lost import LostOutage, lost_for_message
from utils.keyspace import Keyspace
from utils.outage import Outage, OutageFilter
from utils.slots import LostRange, SlotsLost
from utils.wire import TaskMeta

LOST = [LostRange(5461, 10922, "127.0.0.1:17102", ("127.0.0.1:17105",))]
REFUSED = redis.ConnectionError("Error 111 connecting to 127.0.0.1:17102. Connection refused.")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def worker_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Lines, Outage, LostOutage]]:
    """A worker's log handler with its filter, the process's outage views, no Redis."""
    monkeypatch.setattr(lifecycle.lost, "_count", lambda counts: None)
    monkeypatch.setattr(utils.slots._cache, "ranges", [])
    outage = Outage()
    handler = Lines()
    handler.addFilter(OutageFilter(outage))
    logger = logging.getLogger("chaincrawl.redis")
    # as a worker's: an earlier test in this process may have disabled the logger (a logging
    # config with disable_existing_loggers), raised its level, left a filter on it or
    # logging.disable()d warnings
    was = (logger.disabled, logger.level, logging.root.manager.disable)
    monkeypatch.setattr(logger, "filters", [])
    logger.disabled = False
    logger.setLevel(logging.INFO)
    logging.disable(logging.NOTSET)
    logger.addHandler(handler)
    try:
        yield handler, outage, LostOutage(outage)
    finally:
        logger.removeHandler(handler)
        logger.disabled = was[0]
        logger.setLevel(was[1])
        logging.disable(was[2])


def _drainer_error(exc: Exception) -> None:
    """What the outbox drainer (and the sweeper, the heartbeat...) logs on each failure."""
    logging.getLogger("chaincrawl.redis").warning("outbox drainer: redis error %s; retrying", exc)


def test_a_long_lost_range_is_one_line_and_one_when_it_ends(
    worker_log: tuple[Lines, Outage, LostOutage],
) -> None:
    handler, outage, lost = worker_log
    _drainer_error(REFUSED)  # before the cluster flags the range lost: a failover, it seems
    utils.slots._cache.ranges = LOST  # the cluster flags it; a task parks its message
    lost.parked_one("site.page", LOST)
    for _ in range(50):  # a long loss: every part of the worker meets the lost node again
        _drainer_error(REFUSED)  # and succeeds with the other masters in between
        outage.answered()
        _drainer_error(redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"))
        lost.parked_one("site.page", LOST)
    utils.slots._cache.ranges = []
    lost.served()
    assert len(handler.lines) == 3, handler.lines
    assert handler.lines[0].startswith("Redis does not answer (ConnectionError: Error 111")
    assert handler.lines[1].startswith("site.page: slots 5461-10922 lost: 127.0.0.1:17102 and")
    assert handler.lines[2].startswith("lost slots served again after ")
    assert handler.lines[2].endswith("(51 message(s) parked meanwhile)")
    assert outage.since is None and outage.held_lost == 100


def test_another_outage_after_the_range_returned_is_said_again(
    worker_log: tuple[Lines, Outage, LostOutage],
) -> None:
    handler, outage, lost = worker_log
    utils.slots._cache.ranges = LOST
    lost.parked_one("site.page", LOST)
    utils.slots._cache.ranges = []
    lost.served()
    _drainer_error(REFUSED)  # the same node, no range lost any more: an outage of its own
    outage.answered()
    assert [line.split(" (")[0] for line in handler.lines[2:]] == [
        "Redis does not answer",
        "Redis answers again after 0.0s",
    ]


def test_the_other_masters_answering_does_not_end_an_outage_on_a_lost_node(
    worker_log: tuple[Lines, Outage, LostOutage],
) -> None:
    """The drainer meets the lost master before the cluster flags it, then succeeds on the
    others before any task of this process parks: no end line until the range is served."""
    handler, outage, _ = worker_log
    _drainer_error(REFUSED)
    utils.slots._cache.ranges = LOST  # flagged, seen by the drainer's own look
    for _ in range(20):
        outage.answered()
        _drainer_error(REFUSED)
    assert len(handler.lines) == 1, handler.lines
    utils.slots._cache.ranges = []  # served again
    outage.answered()
    assert len(handler.lines) == 2 and handler.lines[1].startswith("Redis answers again after")


def test_a_loop_that_read_nothing_since_the_failure_does_not_end_it(
    worker_log: tuple[Lines, Outage, LostOutage],
) -> None:
    """Before the cluster flags anything: the cluster drainer's polls that only waited (its
    last full read older than the failure) are no sign the node is back; a full read is."""
    handler, outage, _ = worker_log
    before = time.monotonic()
    _drainer_error(REFUSED)
    for _ in range(20):
        outage.answered(before)
    assert len(handler.lines) == 1, handler.lines
    outage.answered(time.monotonic())
    assert len(handler.lines) == 2 and handler.lines[1].startswith("Redis answers again after")


def _rid(inside: bool) -> str:
    """A run id whose keys are (or are not) on the lost range of `LOST`."""
    ks = Keyspace(get_settings().key_prefix)
    return next(
        rid
        for rid in (f"r{n}" for n in range(10_000))
        if LOST[0].holds(key_slot(ks.run(rid).encode())) == inside
    )


def _task() -> str:
    """A task whose site's keys are not on the lost range."""
    ks = Keyspace(get_settings().key_prefix)
    site = next(
        s
        for s in (f"s{n}" for n in range(10_000))
        if not LOST[0].holds(key_slot(ks.site(s).encode()))
    )
    return f"{site}.page"


@pytest.mark.parametrize(
    ("error", "inside", "parked"),
    [
        # a failover of another master while the range is lost: requeued, not parked
        (redis.ConnectionError("Error 111 connecting to 127.0.0.1:17101. Refused."), False, False),
        (REFUSED, False, True),  # the lost master itself: whatever the keys
        (redis.TimeoutError("Timeout reading from socket"), True, True),  # the run's slot
        (redis.TimeoutError("Timeout reading from socket"), False, False),
        (redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"), False, True),
        (redis.exceptions.SlotNotCoveredError('Slot "6000" is not covered'), False, True),
        (redis.exceptions.SlotNotCoveredError('Slot "17" is not covered'), False, False),
    ],
)
def test_a_message_is_parked_only_for_a_lost_range_its_error_concerns(
    monkeypatch: pytest.MonkeyPatch, error: Exception, inside: bool, parked: bool
) -> None:
    """An error of the state store while some range is lost parks the message only when it
    concerns the message: its node, its run's or site's slots, or the whole cluster refusing;
    any error parked every message while a range was lost, also a failover elsewhere's."""
    monkeypatch.setattr(lifecycle.lost, "lost_now", lambda client, exc: list(LOST))
    wire, task = TaskMeta(run_id=_rid(inside)).to_wire(), _task()
    got = lost_for_message(None, error, [(task, wire)])
    assert got == (LOST if parked else [])
    # a batch with an entry whose run is on the lost range: parked whole
    other = TaskMeta(run_id=_rid(True)).to_wire()
    assert lost_for_message(None, error, [(task, wire), (task, other)]) == LOST
    # the same error raised as `SlotsLost` by a patient client is judged by its cause
    try:
        raise SlotsLost(LOST) from error
    except SlotsLost as lost:
        assert lost_for_message(None, lost, [(task, wire)]) == got


def test_surplus_copies_of_a_parked_task_die_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each park of a copy sent one more, so copies of a parked task never died out and any
    duplication (a redelivery, a re-send) multiplied over a long loss (206 parks in 77 s for
    2 tasks; 1,250 copies of each waiting in a worker). A delivery that meets the lost slots
    less than a countdown after this process parked the same task is a surplus copy: it is
    acknowledged without a new message, and copies converge to one chain per task."""
    monkeypatch.setattr(lifecycle.lost, "_count", lambda counts: None)
    lost = LostOutage(Outage())
    step = lifecycle.lost.PARK_SECONDS
    assert not lost.surplus("t1", 100.0)  # parked: its message comes back after a countdown
    assert lost.surplus("t1", 103.0)  # a copy meanwhile (a redelivery): dropped
    assert not lost.surplus("t2", 103.0)  # another task is parked on its own
    assert not lost.surplus("t1", 100.0 + step)  # the park's own message: parked again
    # two chains of the same task a fraction of a countdown apart: one of them dies out
    chains, parks = [100.0 + step, 100.0 + step + 0.5 * step], 0
    for _ in range(20):
        nxt = []
        for at in sorted(chains):
            if not lost.surplus("t1", at + step):
                nxt.append(at + step)
                parks += 1
        chains = nxt
    assert len(chains) == 1 and parks == 20, (chains, parks)
    assert lost.dropped == 2  # the copy at 103 s, the second chain's first return


def test_a_shorter_countdown_narrows_the_surplus_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a short visibility timeout the countdown is shorter (`park_seconds`): a park's
    own message comes back sooner, and is parked again, not taken for a surplus copy."""
    monkeypatch.setattr(lifecycle.lost, "_count", lambda counts: None)
    lost = LostOutage(Outage())
    wait = lifecycle.lost.park_seconds(Settings(visibility_timeout=6))
    assert wait == 3.0
    assert not lost.surplus("t1", 100.0, countdown=wait)
    assert lost.surplus("t1", 102.0, countdown=wait)  # a copy within the countdown: dropped
    assert not lost.surplus("t1", 100.0 + wait, countdown=wait)  # the park's own message


def test_a_batchs_delivery_counter_is_on_its_runs_slot(
    rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    """On a slot of its own, the counter of a batch whose run is served could be on a lost
    range: every delivery of the batch failed at its begin and was parked for the whole loss.
    On its pages' run's slot it goes with the run (a batch of several runs keeps its own)."""
    from ledger.state import RunState

    state = RunState(rds, Settings(redis_url=redis_url, key_prefix=key_prefix))
    key = state.batch_deliveries_key(["r1", "r1"], "b1")
    assert key_slot(key.encode()) == key_slot(state.run_key("r1").encode())
    _, n = state.begin_many([("r1", "t1", 0), ("r1", "t2", 0)], batch_id="b1")
    assert n == 1 and rds.get(key) == b"1"
    assert state.batch_deliveries_key(["r1", "r2"], "b1") == state.deliveries_key("", "b1", 0)
