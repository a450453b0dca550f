"""A parked message (lifecycle/lost.py) waits out its countdown in the worker, unacknowledged:
on a Redis broker it sits in kombu's `unacked` meanwhile, and kombu's visibility sweep gives
back whatever has been there longer than the visibility timeout, while the worker still holds
it. Both copies then ran and parked again: the copies of a parked task doubled every countdown
(148 parks in 93 s for 2 tasks, the integration tests' 6 s visibility timeout and the 10 s
countdown of before). The countdown is now held under the visibility timeout, as every
retry's (`lifecycle.policy.countdown_cap`).

With the real broker and kombu's own sweep; the time a message was taken is written into
kombu's index (its clock) instead of waiting it out."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis
from kombu import Connection, Consumer, Producer, Queue
from kombu.transport import redis as kredis

from config import Settings
from lifecycle.lost import PARK_SECONDS, park_seconds

VISIBILITY = 6  # the integration tests' CHAINCRAWL_VISIBILITY_TIMEOUT


@pytest.fixture
def broker(redis_url: str, key_prefix: str) -> Iterator[tuple[Connection, str]]:
    prefix = f"{key_prefix}:q:"
    opts = {"global_keyprefix": prefix, "visibility_timeout": VISIBILITY}
    conn = Connection(redis_url, transport_options=opts)
    try:
        yield conn, prefix
    finally:
        conn.release()


def _take(conn: Connection) -> tuple[kredis.Channel, Any]:
    """One message of queue `p`, held unacknowledged (as a worker holds a countdown's)."""
    ch = cast(kredis.Channel, conn.channel())
    ch.basic_qos(0, 1, False)
    held: list[Any] = []
    Consumer(ch, [Queue("p", routing_key="p")], callbacks=[lambda _b, m: held.append(m)],
             accept=["json"]).consume()  # fmt: skip
    for _ in range(50):
        if held:
            break
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.2)
    assert held, "nothing taken"
    return ch, held[0]


def _sweep(ch: kredis.Channel, rds: redis.Redis, prefix: str, tag: str, held_for: float) -> int:
    """kombu's visibility sweep, the message taken `held_for` s ago -> the queue's length."""
    rds.zadd(f"{prefix}unacked_index", {tag: time.time() - held_for})
    ch.qos.restore_visible(num=100, interval=1)
    return int(rds.llen(f"{prefix}p"))


def test_a_parked_message_is_not_given_back_while_its_worker_waits_out_the_countdown(
    broker: tuple[Connection, str], rds: redis.Redis
) -> None:
    conn, prefix = broker
    wait = park_seconds(Settings(visibility_timeout=VISIBILITY))
    assert wait < VISIBILITY < PARK_SECONDS
    Producer(conn.channel()).publish({"page": 1}, routing_key="p", serializer="json")
    ch, msg = _take(conn)
    tag = str(msg.delivery_tag)
    # held a whole countdown, and a second late (the timer's lateness, a busy worker)
    assert _sweep(ch, rds, prefix, tag, wait + 1) == 0
    assert rds.hexists(f"{prefix}unacked", tag)  # still the worker's, run once at its ETA
    msg.ack()


def test_a_countdown_past_the_visibility_timeout_made_a_second_copy(
    broker: tuple[Connection, str], rds: redis.Redis
) -> None:
    """The cause: the 10 s countdown under a 6 s visibility timeout. The sweep puts the
    message back in the queue while the worker still holds it; another consumer takes the
    copy, and at the ETA both run (and both park again)."""
    conn, prefix = broker
    Producer(conn.channel()).publish({"page": 1}, routing_key="p", serializer="json")
    ch, msg = _take(conn)
    assert _sweep(ch, rds, prefix, str(msg.delivery_tag), PARK_SECONDS) == 1
    other = conn.clone()
    try:
        _, copy = _take(other)  # a second delivery of the same message, marked redelivered
        assert copy.payload == msg.payload == {"page": 1}
        assert copy.delivery_info.get("redelivered"), copy.delivery_info
        copy.ack()
    finally:
        other.release()
    msg.ack()


def test_the_park_countdown_stays_under_the_visibility_timeout() -> None:
    assert park_seconds(Settings(visibility_timeout=3600)) == PARK_SECONDS
    assert park_seconds(Settings(visibility_timeout=6)) == 3.0
    assert park_seconds(Settings(visibility_timeout=1)) == 1.0  # the floor
    # the retries' backoff cap is not the park's: a page's retries may be short, a loss long
    assert park_seconds(Settings(visibility_timeout=3600, retry_backoff_max=1)) == PARK_SECONDS
