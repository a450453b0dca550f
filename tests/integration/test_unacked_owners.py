"""broker.owners: a dead worker's unacknowledged messages come back in seconds, not
after the visibility timeout.

First with kombu's own consumer in this process (the tags follow kombu's bookkeeping), then
with real workers, one of them SIGKILLed while it holds pages, the visibility timeout at 600 s:
without the owners the run would wait those 600 s."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis
from kombu import Connection, Consumer, Producer, Queue
from kombu.transport import redis as kredis

import chains
from broker import kombu_guard, owners
from chains.broker_scan import message_ids
from config import get_settings, reset_settings
from tests.testsite import chains as tchains
from utils.redis import get_redis, reset_clients

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Connection, str]]:
    """A kombu connection with the worker's key prefix, and that prefix."""
    monkeypatch.setenv("CHAINCRAWL_REDIS_URL", redis_url)
    monkeypatch.setenv("CHAINCRAWL_KEY_PREFIX", key_prefix)
    reset_settings()
    reset_clients()
    kombu_guard.apply()
    prefix = f"{key_prefix}:q:"
    conn = Connection(redis_url, transport_options={"global_keyprefix": prefix})
    try:
        yield conn, prefix
    finally:
        owners.stop()
        conn.release()
        monkeypatch.undo()
        reset_settings()
        reset_clients()


class _App:
    """What `owners.restorer` needs of a Celery app."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def connection_for_write(self) -> Connection:
        return self.conn.clone()


def _take(conn: Connection, n: int) -> tuple[list[Any], list[Any]]:
    """Consume `n` messages of queue `o` without acknowledging them: (bodies, messages)."""
    ch = cast(kredis.Channel, conn.channel())
    ch.basic_qos(0, n, False)
    got: list[Any] = []
    held: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        held.append(message)

    Consumer(ch, [Queue("o", routing_key="o")], callbacks=[on_message], accept=["json"]).consume()
    for _ in range(50):
        if len(got) >= n:
            break
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.2)
    assert len(got) == n, got
    return got, held


def test_a_dead_owners_messages_are_restored_and_a_live_ones_are_not(
    broker: tuple[Connection, str], rds: redis.Redis
) -> None:
    conn, prefix = broker
    owner_hash = f"{prefix}{owners.OWNER_HASH}"
    who = owners.start(rds, prefix, ttl=2.0, hostname="t1")
    assert rds.exists(f"{prefix}{owners.ALIVE}{who}")
    producer = Producer(conn.channel())
    for i in range(3):
        producer.publish({"n": i}, routing_key="o", serializer="json")
    _, held = _take(conn, 3)
    tags = {m.delivery_tag for m in held}
    assert {k.decode() for k in cast("list[bytes]", rds.hkeys(owner_hash))} == tags
    assert set(owners.held(rds, prefix)) == {who}
    assert owners.holds()  # this process knows it holds some (its heartbeat keeps its pace)
    held[0].ack()  # kombu's ack removes the tag too
    assert rds.hlen(owner_hash) == 2 and rds.hlen(f"{prefix}unacked") == 2

    # alive: nothing to restore
    assert owners.orphans(rds, prefix, ttl=0, confirm=0) == {}
    # a broker Redis up for less than the TTL declares nobody dead (heartbeats coming back)
    rds.delete(f"{prefix}{owners.ALIVE}{who}")
    owners.stop()
    assert owners.orphans(rds, prefix, ttl=10**9, confirm=0) == {}

    found = owners.orphans(rds, prefix, ttl=0, confirm=0)
    assert {w: sorted(t) for w, t in found.items()} == {who: sorted(tags - {held[0].delivery_tag})}
    restore = owners.restorer(_App(conn))
    assert restore(found[who]) == 2
    assert restore(found[who]) == 0  # restored once, whoever gets there second
    assert not owners.holds()
    assert rds.hlen(owner_hash) == 0 and rds.hlen(f"{prefix}unacked") == 0
    # back in the queue (newest restored first, as kombu does, so the oldest is taken first;
    # two taken in the same instant tie, so the order is not checked), marked redelivered
    again, msgs = _take(conn, 2)
    assert sorted(b["n"] for b in again) == [1, 2]
    assert all(m.delivery_info.get("redelivered") for m in msgs), [m.delivery_info for m in msgs]


def test_a_killed_workers_pages_are_run_by_another_within_seconds(
    start_worker, test_site: Any
) -> None:
    """Two workers, visibility timeout 600 s; one is SIGKILLed while it holds 5 s pages. The
    other, started after the kill, restores them once the dead one's heartbeat is 3 s old and
    runs them: the run ends long before the visibility timeout, every page succeeded once
    (those the dead worker held ran twice). The kill comes first, however long the second
    worker then takes to start on a loaded machine, so the doomed one still holds its pages."""
    env = {
        "CHAINCRAWL_VISIBILITY_TIMEOUT": "600",
        "CHAINCRAWL_DEAD_WORKER_AFTER": "3",
        "CHAINCRAWL_SWEEP_INTERVAL": "1",
        "CHAINCRAWL_BATCH": "1",
    }
    doomed = start_worker(concurrency=4, name="doomed", **env)
    key = f"owners{int(time.time())}"
    run = chains.run(
        tchains.probe(f"/flaky/{{entry_id}}-{key}?fails=0&delay=5"), seeds=[{"per": 8}]
    )
    deadline = time.monotonic() + 60
    while sum(test_site.hits[f"flaky:e1-{i}-{key}"] for i in range(8)) < 4:
        assert time.monotonic() < deadline, run.progress().totals
        time.sleep(0.05)
    doomed.kill()  # within its pages' 5 s: it holds 4 of them, unacknowledged
    t_kill = time.monotonic()
    survivor = start_worker(concurrency=8, name="survivor", **env)
    p = run.wait(timeout=240)
    took = time.monotonic() - t_kill
    assert p.complete, p.totals
    probe = p.steps["local.probe"]
    assert probe["succeeded"] == 8 and probe["failed"] == 0, probe
    hits = [test_site.hits[f"flaky:e1-{i}-{key}"] for i in range(8)]
    assert sorted(hits) == [1] * 4 + [2] * 4, hits  # the 4 the dead worker ran, run again
    log = survivor.text()
    assert "is gone (no heartbeat for 3s): 4 of its 4 unacknowledged messages restored" in log, log[
        -3000:
    ]
    restored = get_redis().hget(get_settings().key("metrics", "broker"), "dead_worker_restored")
    assert int(cast(bytes, restored)) >= 4
    print(f"\nrun complete {took:.1f}s after the kill (visibility timeout 600 s)")
    assert took < 300  # seconds, where the visibility timeout alone would take 600


def test_a_clean_exit_is_no_death_and_a_stopped_heartbeat_is(rds: redis.Redis) -> None:
    prefix = f"reg{int(time.time() * 1000)}:q:"
    who = owners.start(rds, prefix, ttl=60.0, hostname="clean")
    try:
        assert owners.registered(rds, prefix) == {who}
        owners.leave()
        assert owners.registered(rds, prefix) == set()
        owners._beat.beat()  # type: ignore[union-attr]  # beats go on, unregistered
        assert owners.registered(rds, prefix) == set()
        assert rds.exists(f"{prefix}{owners.ALIVE}{who}")
    finally:
        owners.stop()
    killed = owners.start(rds, prefix, ttl=0.3, hostname="killed")
    owners.stop()  # as SIGKILL: no leave, the beats stop
    time.sleep(0.5)
    assert owners.orphans(rds, prefix, ttl=0, confirm=0) == {killed: []}
    owners.forget(rds, prefix, [killed])
    assert owners.orphans(rds, prefix, ttl=0, confirm=0) == {}


_THIEF = """
import sys, time
from config import get_settings
from broker import owners
from utils.redis import get_redis
s = get_settings()
r = get_redis(s.broker_url)
owners.start(r, s.broker_key_prefix, s.dead_worker_after, "thief")
key, tid = sys.argv[1], sys.argv[2]
while True:  # BRPOP, as kombu's consumer; killed before it would record the message
    _, raw = r.brpop([key])
    if tid.encode() in raw:
        print("popped", flush=True)
        time.sleep(3600)
    r.lpush(key, raw)
"""


# the stall rule far away (600 s): what finds a loss within seconds is the event that caused it
QUICK_SWEEP = {
    "CHAINCRAWL_VISIBILITY_TIMEOUT": "600",
    "CHAINCRAWL_SWEEP_INTERVAL": "1",
    "CHAINCRAWL_SWEEP_STALL": "600",
}


def _run_and_its_seed(tag: str) -> tuple[Any, str, str, Any]:
    """A 3-page probe run just started: (handle, its seed's task id, the broker list holding
    the seed's message, the broker client)."""
    from chains.sweeper import message_ids
    from ledger.state import RunState

    key = f"{tag}{int(time.time())}"
    run = chains.run(tchains.probe(f"/flaky/{{entry_id}}-{key}?fails=0"), seeds=[{"per": 3}])
    s = get_settings()
    broker = get_redis(s.broker_url)
    (seed,) = RunState(get_redis(), s).ledger(run.run_id)
    seed_queue = next(
        k.decode()
        for k in broker.scan_iter(match=f"{s.broker_key_prefix}*", _type="list")
        if any(seed in message_ids(raw) for raw in broker.lrange(k, 0, -1))
    )
    return run, seed, seed_queue, broker


def test_a_message_lost_with_a_killed_worker_is_resent_within_seconds(
    start_worker, cc_env: dict[str, str], tmp_path: Any, test_site: Any
) -> None:
    """A message lost with its worker: a worker process pops the run's seed (BRPOP) and is SIGKILLed before
    it records it. Its heartbeat stops; the next worker's sweeper declares it dead and checks
    every run's ledger at once: the seed is re-sent and the run ends in seconds, where before
    it waited `CHAINCRAWL_SWEEP_STALL` (600 s here) after its last commit."""
    from tests.procs import LoggedProc

    env = {**QUICK_SWEEP, "CHAINCRAWL_DEAD_WORKER_AFTER": "2"}
    run, seed, seed_queue, _ = _run_and_its_seed("thief")
    thief = LoggedProc([sys.executable, "-c", _THIEF, seed_queue, seed],
                       {**cc_env, **env}, tmp_path / "thief.log")  # fmt: skip
    thief.ready_marker = b"popped"
    try:
        thief.wait_ready(30)
    finally:
        thief.kill()
    t_kill = time.monotonic()
    w = start_worker(concurrency=4, name="heir", **env)
    p = run.wait(timeout=60)
    took = time.monotonic() - t_kill
    assert p.complete, p.totals
    assert p.steps["local.probe"]["succeeded"] == 3, p.steps
    assert p.totals.get("resent") == 1, p.totals
    log = w.text()
    assert "thief" in log and "re-sent (a worker died)" in log, log[-3000:]
    print(f"\nrun complete {took:.1f}s after the kill (sweep stall 600 s)")
    assert took < 300  # seconds, where the visibility timeout alone would take 600


def test_a_message_lost_with_a_dropped_connection_is_resent_within_seconds(
    start_worker, cc_env: dict[str, str]
) -> None:
    """A message lost without a death: the run's seed is gone from the broker (as when Redis popped it
    for a worker's BRPOP whose connection then dropped), and the worker stays alive. Its
    consumer reconnects after we cut its BRPOP connection (CLIENT KILL); the drop has the
    sweeper check every run at once: the seed is re-sent and the run ends in seconds, where
    before only the stall rule (600 s here) found it."""
    from chains.sweeper import message_ids

    run, seed, seed_queue, broker = _run_and_its_seed("drop")
    for raw in broker.lrange(seed_queue, 0, -1):
        if seed in message_ids(raw):
            broker.lrem(seed_queue, 1, raw)  # popped for a reply that never arrived
    w = start_worker(concurrency=4, name="dropped", **QUICK_SWEEP)
    time.sleep(3)
    assert run.progress().outstanding == 1, "nothing finds the loss before the drop"
    cut = 0
    for c in broker.client_list():
        if c.get("cmd") in ("brpop", "blpop"):
            broker.client_kill_filter(_id=c["id"])
            cut += 1
    assert cut, "no consumer connection blocked in BRPOP"
    t_cut = time.monotonic()
    p = run.wait(timeout=60)
    took = time.monotonic() - t_cut
    assert p.complete and p.steps["local.probe"]["succeeded"] == 3, p.totals
    assert p.totals.get("resent") == 1, p.totals
    log = w.text()
    assert "the broker connection dropped" in log and "re-sent (" in log, log[-3000:]
    print(f"\nrun complete {took:.1f}s after the connection was cut (sweep stall 600 s)")
    assert took < 300  # seconds, where the visibility timeout alone would take 600


def test_two_live_workers_take_back_a_dead_ones_batches_once_and_count_each_page_once(
    start_worker, test_site: Any
) -> None:
    """As above with batch messages (4 pages each) and two survivors, each with a sweeper:
    the dead worker's batches are restored by one of them, once (kombu's restore is a
    transaction on `unacked`), and their redeliveries, run entry by entry, count each page
    once: every page succeeded once in the run's counts, whatever ran twice."""
    env = {
        "CHAINCRAWL_VISIBILITY_TIMEOUT": "600",
        "CHAINCRAWL_DEAD_WORKER_AFTER": "3",
        "CHAINCRAWL_SWEEP_INTERVAL": "1",
        "CHAINCRAWL_BATCH": "4",
        "CHAINCRAWL_BATCH_BACKLOG": "1",  # the root's 16 children always go 4 to a message
    }
    metric = get_settings().key("metrics", "broker")
    before = int(cast("bytes | None", get_redis().hget(metric, "dead_worker_restored")) or 0)
    doomed = start_worker(concurrency=2, name="doomed", **env)
    key = f"batches{int(time.time())}"
    run = chains.run(
        tchains.probe(f"/flaky/{{entry_id}}-{key}?fails=0&delay=5"), seeds=[{"per": 16}]
    )
    deadline = time.monotonic() + 60
    while sum(test_site.hits[f"flaky:e1-{i}-{key}"] for i in range(16)) < 2:
        assert time.monotonic() < deadline, run.progress().totals
        time.sleep(0.05)
    s = get_settings()
    unacked = get_redis(s.broker_url).hvals(f"{s.broker_key_prefix}unacked")
    # it holds batch messages (their ids: the batch's own and its 4 pages')
    assert max(len(message_ids(raw)) for raw in unacked) == 5
    doomed.kill()  # within its pages' 5 s: it holds its batches, unacknowledged
    survivors = [start_worker(concurrency=4, name=f"survivor{i}", **env) for i in range(2)]
    p = run.wait(timeout=240)
    assert p.complete, p.totals
    probe = p.steps["local.probe"]
    assert probe["succeeded"] == 16 and probe["failed"] == 0, probe
    hits = [test_site.hits[f"flaky:e1-{i}-{key}"] for i in range(16)]
    assert all(1 <= h <= 2 for h in hits) and 2 in hits, hits  # the dead one's, run again
    said = [
        line for w in survivors for line in w.text().splitlines() if "is gone (no heartbeat" in line
    ]
    assert len(said) == 1, said  # one survivor restored them, the other found nothing left
    restored = int(cast(bytes, get_redis().hget(metric, "dead_worker_restored"))) - before
    n = int(said[0].split("s): ")[1].split(" of")[0])
    assert n >= 1 and restored == n, (said, restored)
