"""broker.kombu_guard in one process: kombu's own consumer on a private Redis (no Celery).

The worker-level tests are `test_a_malformed_broker_message_does_not_kill_the_worker`
(tests/torture/test_crash_paths.py) and the Redis restart torture (tests/torture/test_redis_restart.py)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.transport import redis as kredis

from broker import kombu_guard
from config import reset_settings
from tests.conditions import wait_for
from utils.redis import reset_clients
from utils.servers import RedisServer

pytestmark = pytest.mark.integration

GARBAGE = [
    b"\x00\xffnot json",
    b"[1, 2]",
    b'{"hello": "world"}',
    b'{"body": "", "properties": {"delivery_tag": "x"}}',  # no delivery_info
    b'{"body": "!!not base64!!", "properties": {"delivery_tag": "y", "body_encoding": "base64", '
    b'"delivery_info": {"exchange": "", "routing_key": "g"}}}',
]


@pytest.fixture
def broker(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Connection]:
    """A kombu connection as the worker configures it; the state store on the same Redis."""
    monkeypatch.setenv("CHAINCRAWL_REDIS_URL", redis_url)
    monkeypatch.setenv("CHAINCRAWL_KEY_PREFIX", key_prefix)
    reset_settings()
    reset_clients()
    kombu_guard.apply()
    conn = Connection(redis_url, transport_options={"global_keyprefix": f"{key_prefix}:q:"})
    try:
        yield conn
    finally:
        conn.release()
        monkeypatch.undo()
        reset_settings()
        reset_clients()


def consumer(conn: Connection, got: list[Any], ack: bool = True) -> Any:
    ch = conn.channel()

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        if ack:
            message.ack()

    c = Consumer(ch, [Queue("g", routing_key="g")], callbacks=[on_message], accept=["json"])
    c.consume()
    return ch


def holding_consumer(conn: Connection, got: list[Any], held: list[Any]) -> Any:
    """A channel with one prefetch slot consuming `g`: each body goes to `got`, its message to
    `held`, unacknowledged (the slot stays taken until the test settles it)."""
    ch = cast(kredis.Channel, conn.channel())
    ch.basic_qos(0, 1, False)

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        held.append(message)

    Consumer(ch, [Queue("g", routing_key="g")], callbacks=[on_message], accept=["json"]).consume()
    return ch


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own, which it may stop and start again."""
    kombu_guard.apply()
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()


def drain_until(conn: Connection, cond: Any, rounds: int = 50) -> None:
    for _ in range(rounds):
        if cond():
            return
        with contextlib.suppress(TimeoutError):  # socket.timeout: nothing this round
            conn.drain_events(timeout=0.2)
    assert cond()


def test_malformed_payloads_are_skipped_kept_and_counted(
    broker: Connection, rds: redis.Redis, key_prefix: str
) -> None:
    got: list[Any] = []
    ch = consumer(broker, got)
    before = kombu_guard.counts["malformed"]
    for g in GARBAGE:
        rds.lpush(f"{key_prefix}:q:g", g)  # popped from the right: before the good one
    Producer(ch).publish({"n": 1}, routing_key="g", serializer="json")
    drain_until(broker, lambda: got)  # no exception out of the consumer's loop
    assert got == [{"n": 1}]
    assert kombu_guard.counts["malformed"] - before == len(GARBAGE)
    kept = [json.loads(x) for x in reversed(rds.lrange(f"{key_prefix}:broker:malformed", 0, -1))]
    assert [k["payload"] for k in kept] == [
        GARBAGE[0].decode(errors="replace"),
        *(json.dumps(json.loads(g)) for g in GARBAGE[1:]),
    ]
    assert kept[0]["queue"] == "?" and kept[0]["error"].startswith("not JSON")
    assert all(k["queue"] == "g" and k["error"].startswith("not a message") for k in kept[1:])
    metrics = rds.hgetall(f"{key_prefix}:metrics:broker")
    assert metrics[b"malformed"] == b"5" and metrics[b"malformed:g"] == b"4"
    assert rds.llen(f"{key_prefix}:q:g") == 0


def test_closing_a_channel_after_its_connection_was_released_is_a_connection_error(
    broker: Connection, rds: redis.Redis, key_prefix: str
) -> None:
    """A worker exiting on a Redis restart, deterministically: a channel holding an unacknowledged message is closed after
    its transport lost its client (what Celery's reconnect does in some orders). kombu used to
    raise AttributeError ('NoneType' has no attribute 'hostname'); now a connection error,
    which `maybe_close_channel` ignores, and the message stays in `unacked`."""
    got: list[Any] = []
    ch = consumer(broker, got, ack=False)
    Producer(ch).publish({"n": 2}, routing_key="g", serializer="json")
    drain_until(broker, lambda: got)
    assert rds.hlen(f"{key_prefix}:q:unacked") == 1
    ch._disconnect_pools()  # as redis Channel.close does before restoring
    ch.connection.client = None  # as Connection._do_close_transport does
    with pytest.raises(redis.ConnectionError, match="already closed"):
        ch._connparams()
    broker.maybe_close_channel(ch)  # used to raise AttributeError: the worker exited
    assert ch.closed
    assert rds.hlen(f"{key_prefix}:q:unacked") == 1  # back after the visibility timeout


def test_the_guard_checks_the_kombu_it_patches(monkeypatch: pytest.MonkeyPatch) -> None:
    kombu_guard.apply()
    kombu_guard._check()  # the installed kombu passes (through our wrappers)

    def _connparams(self: Any, asynchronous: bool = False) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(kredis.Channel, "_connparams", _connparams)
    with pytest.raises(kombu_guard.KombuGuardError, match="_connparams no longer contains"):
        kombu_guard._check()
    monkeypatch.delattr(kredis.Channel, "_brpop_read")
    with pytest.raises(kombu_guard.KombuGuardError, match="_brpop_read missing"):
        kombu_guard._check()


def test_a_saturated_consumer_waits_for_an_ack_not_for_its_poll_timeout(
    broker: Connection,
) -> None:
    """gevent/solo workers drain with `drain_events(timeout=2.0)`. With the QoS full kombu used
    to wait the whole timeout on the other sockets (here a fanout subscription, as Celery's
    remote control has): a slot freed meanwhile stayed idle. The guard waits for an ack instead
    (then only looks at the other sockets, without blocking); an ack wakes it at once."""
    got: list[Any] = []
    held: list[Any] = []  # not acked: the one slot stays taken
    ch = holding_consumer(broker, got, held)
    Consumer(
        ch, [Queue("bcast", exchange=Exchange("bc", type="fanout"))], accept=["json"]
    ).consume()
    producer = Producer(ch)
    for n in (1, 2, 3):
        producer.publish({"n": n}, routing_key="g", serializer="json")
    drain_until(broker, lambda: got)
    poller = cast(kredis.Transport, broker.transport).cycle
    assert poller is not None
    timeouts: list[float | None] = []
    real_poll = poller.poller.poll

    def spy(timeout: float | None = None) -> Any:
        timeouts.append(timeout)
        return real_poll(timeout)

    woken: list[bool] = []

    class SpyEvent(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            woken.append(super().wait(timeout))
            return woken[-1]

    kombu_guard._freed[0] = SpyEvent()
    poller.poller.poll = spy
    try:
        assert not ch.qos.can_consume()
        with contextlib.suppress(TimeoutError):  # nothing acked: the wait runs out
            broker.drain_events(timeout=0.3)
        assert woken == [False] and timeouts == [0]  # no blocking poll while full
        assert got == [{"n": 1}]
        # a task finishing elsewhere (a greenlet; here a thread) acks while the drain waits
        timer = threading.Timer(0.05, held.pop().ack)
        timer.start()
        with contextlib.suppress(TimeoutError):
            broker.drain_events(timeout=2.0)  # the wait ends with the ack
        timer.join()
        assert woken[1] is True  # woken by the ack, not by its timeout
        drain_until(broker, lambda: len(got) == 2)
        assert got[1] == {"n": 2}
    finally:
        poller.poller.poll = real_poll
        kombu_guard._freed[0] = None


@pytest.mark.parametrize("settle", ["ack", "reject"])
def test_a_failed_ack_reconnects_instead_of_leaving_its_slot_taken(
    settle: str, own_redis: RedisServer
) -> None:
    """An ack (or a requeueing reject: a task's Reject on a network error) that fails while
    Redis is down leaves its message in the QoS: kombu frees the slot only after Redis answered.
    A consumer whose every slot leaked so sends no BRPOP and never learns that its connection
    died: the gevent workers of the long Redis-restart torture stalled so. With the guard the
    next drain raises a connection error (Celery reconnects), and closing the channel
    restores the message."""
    conn = Connection(own_redis.url)
    try:
        got: list[Any] = []
        held: list[Any] = []
        ch = holding_consumer(conn, got, held)
        producer = Producer(ch)
        for n in (1, 2):
            producer.publish({"n": n}, routing_key="g", serializer="json")
        drain_until(conn, lambda: got)
        own_redis.stop()  # SIGTERM: the append-only log is written out
        message = held.pop()
        with pytest.raises(redis.ConnectionError):
            if settle == "ack":
                message.ack()
            else:
                message.reject(requeue=True)
        assert not ch.qos.can_consume()  # the slot leaked
        own_redis.start(timeout=30)
        with pytest.raises(redis.ConnectionError, match="an ack failed"):
            for _ in range(10):  # without the guard: TimeoutError on every round, for ever
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.3)
        # what Celery does on a connection error: close, connect again, consume again
        with contextlib.suppress(Exception):
            conn.release()
        conn = Connection(own_redis.url)
        got.clear()
        consumer(conn, got)
        drain_until(conn, lambda: len(got) == 2)
        assert sorted(b["n"] for b in got) == [1, 2]  # the leaked message came back
    finally:
        with contextlib.suppress(Exception):
            conn.release()


def test_a_busy_synloop_consumer_still_restores_messages_past_the_visibility_timeout(
    own_redis: RedisServer,
) -> None:
    """kombu's `get` sweeps `unacked` only after a poll that found nothing; the event loop has
    a timer for it, gevent/solo workers do not. A message abandoned in `unacked` (its holder
    hung, or its requeue failed while Redis was down) must come back while the consumer is
    kept busy by a full queue, within a few visibility timeouts."""
    opts = {"visibility_timeout": 1, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
    hung, busy = Connection(own_redis.url, transport_options=opts), Connection(own_redis.url,
                                                                           transport_options=opts)  # fmt: skip
    try:
        held: list[Any] = []
        ch = holding_consumer(hung, held, [])
        producer = Producer(ch)
        producer.publish({"n": "abandoned"}, routing_key="g", serializer="json")
        drain_until(hung, lambda: held)  # delivered to `hung`, which never acks it
        for n in range(150):
            producer.publish({"n": n}, routing_key="g", serializer="json")
        got: list[Any] = []

        def work(body: Any, message: Any) -> None:
            got.append(body)
            time.sleep(0.02)  # ~3 s of work in all: every poll finds a message
            message.ack()

        bch = cast(kredis.Channel, busy.channel())
        bch.basic_qos(0, 1, False)
        Consumer(bch, [Queue("g", routing_key="g")], callbacks=[work], accept=["json"]).consume()
        before = kombu_guard.counts["restore_sweeps"]
        drain_until(busy, lambda: {"n": "abandoned"} in got or len(got) > 150, rounds=400)
        assert {"n": "abandoned"} in got
        assert got.index({"n": "abandoned"}) < 150  # came back while the queue was still full
        assert kombu_guard.counts["restore_sweeps"] > before
    finally:
        for c in (hung, busy):
            with contextlib.suppress(Exception):
                c.release()


def test_acks_share_one_redis_client_per_channel(broker: Connection) -> None:
    """kombu builds a `redis.Redis` for each ack outside a poll; the guard keeps one per channel
    (and pool), so a hundred acks build at most one client, and they all reach Redis."""
    got: list[Any] = []
    ch = consumer(broker, got)
    for n in range(100):
        Producer(ch).publish({"n": n}, routing_key="g", serializer="json")
    built: list[Any] = []
    original = kombu_guard.inspect.unwrap(cast(Any, kredis.Channel)._create_client)

    def counting(self: Any, asynchronous: bool = False) -> Any:
        built.append(asynchronous)
        return original(self, asynchronous=asynchronous)

    counting.__wrapped__ = original  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kredis.Channel, "_create_client", counting)
        kombu_guard._patch_client_reuse()  # the guard around the counting constructor
        drain_until(broker, lambda: len(got) == 100, rounds=200)
    assert sorted(x["n"] for x in got) == list(range(100))
    assert built.count(False) <= 1, f"{built.count(False)} clients built for 100 acks"
    assert not ch.client.hlen(ch.unacked_key)  # every ack reached Redis


def test_a_long_brpop_is_unblocked_at_close_and_loses_nothing(
    redis_url: str, key_prefix: str, rds: redis.Redis
) -> None:
    """An idle consumer's BRPOP waits `brpop_timeout` (here 60 s) on the server, and closing
    its channel (a warm shutdown, a reconnect) unblocks it (`CLIENT UNBLOCK`) instead of
    waiting it out: the close takes seconds at most. Unblocked, the BRPOP returns as a
    timeout: a message sent afterwards is still in the queue for the next consumer."""
    kombu_guard.apply()
    opts = {"global_keyprefix": f"{key_prefix}:q:", "brpop_timeout": 60}
    conn = Connection(redis_url, transport_options=opts)
    got: list[Any] = []
    try:
        ch: Any = consumer(conn, got)  # kombu's internals, not in its type hints
        assert ch.brpop_timeout == 60
        with contextlib.suppress(TimeoutError):  # the BRPOP is sent and stays in flight
            conn.drain_events(timeout=0.3)
        assert ch._in_poll
        # this channel's connection only: other tests' consumers share the Redis
        host, port = ch._in_poll._sock.getsockname()[:2]
        mine = f"{host}:{port}"

        def blocked() -> list[dict[str, Any]]:
            return [
                c
                for c in rds.client_list()
                if c.get("cmd") == "brpop" and "b" in c.get("flags", "") and c["addr"] == mine
            ]

        assert len(blocked()) == 1
        before = kombu_guard.counts["unblocked"]
        started = time.monotonic()
        conn.release()  # closes the channel
        assert time.monotonic() - started < 5  # kombu alone: the BRPOP's 60 s
        assert kombu_guard.counts["unblocked"] == before + 1
        wait_for(lambda: not blocked(), timeout=10, what="no BRPOP left blocked")
    finally:
        with contextlib.suppress(Exception):
            conn.release()
    assert got == []
    sender = Connection(redis_url, transport_options=opts)
    try:
        Producer(sender.channel()).publish({"n": 1}, routing_key="g", serializer="json")
        assert rds.llen(f"{key_prefix}:q:g") == 1  # not popped by the unblocked BRPOP
        consumer(sender, got)
        drain_until(sender, lambda: got)
        assert got == [{"n": 1}]
    finally:
        sender.release()


def test_a_queue_consumed_during_a_long_brpop_is_served_at_once(
    redis_url: str, key_prefix: str, rds: redis.Redis
) -> None:
    """A worker's start: mingle's reply queue is consumed first, its BRPOP sent with the long
    timeout (here 60 s), then the task queues. The BRPOP in flight does not name them; the
    guard unblocks it when a queue is added, so a message sent to the new queue is delivered
    on the next polls, not after the 60 s (the first crawl after `start` waited up to 10 s)."""
    kombu_guard.apply()
    opts = {"global_keyprefix": f"{key_prefix}:q:", "brpop_timeout": 60}
    conn = Connection(redis_url, transport_options=opts)
    got: list[Any] = []
    try:
        ch: Any = consumer(conn, got)  # consumes `g`
        with contextlib.suppress(TimeoutError):  # the BRPOP on `g` alone is in flight
            conn.drain_events(timeout=0.3)
        assert ch._in_poll
        before = kombu_guard.counts["unblocked"]

        def on_message(body: Any, message: Any) -> None:
            got.append(body)
            message.ack()

        Consumer(
            ch, [Queue("h", routing_key="h")], callbacks=[on_message], accept=["json"]
        ).consume()
        assert kombu_guard.counts["unblocked"] == before + 1
        sender = Connection(redis_url, transport_options=opts)
        try:
            Producer(sender.channel()).publish({"n": 2}, routing_key="h", serializer="json")
        finally:
            sender.release()
        drain_until(conn, lambda: got, rounds=25)  # kombu alone: nothing before the 60 s
        assert got == [{"n": 2}]
    finally:
        conn.release()


def test_a_brpop_whose_client_id_is_unknown_keeps_kombus_short_timeout(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that refuses `CLIENT ID` (an ACL): close could not unblock the BRPOP, so it
    is sent with kombu's 1 s, and close waits that, not the 60 s asked for."""
    kombu_guard.apply()
    monkeypatch.setattr(kombu_guard, "_brpop_client_id", lambda channel: None)
    opts = {"global_keyprefix": f"{key_prefix}:q:", "brpop_timeout": 60}
    conn = Connection(redis_url, transport_options=opts)
    try:
        consumer(conn, [])
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.2)
        before = kombu_guard.counts["unblocked"]
        started = time.monotonic()
        conn.release()
        assert time.monotonic() - started < 5
        assert kombu_guard.counts["unblocked"] == before  # nothing to unblock with
    finally:
        with contextlib.suppress(Exception):
            conn.release()
