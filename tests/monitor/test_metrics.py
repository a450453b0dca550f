"""monitor/metrics.py's per-process aggregator: one flush thread, sums written per interval."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from monitor.metrics import Aggregator


def flush_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "metrics-flush" and t.is_alive()]


def test_one_flush_thread_however_often_started_and_a_new_one_after_stop(
    rds: redis.Redis, key_prefix: str
) -> None:
    """Every task calls start(): it must neither start a second thread nor ask the running one
    for its state (under gevent that was a trip through the hub per call)."""
    key = f"{key_prefix}:metrics:test"
    agg = Aggregator()
    before = len(flush_threads())
    try:
        for _ in range(1000):
            agg.start(rds, 0.05)
        assert len(flush_threads()) == before + 1
        agg.add((key,), {"succeeded": 3})
        deadline = time.monotonic() + 5
        while rds.hget(key, "succeeded") != b"3" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rds.hget(key, "succeeded") == b"3"
    finally:
        agg.stop(rds)
    assert len(flush_threads()) == before
    agg.start(rds, 0.05)  # started again after a stop
    try:
        assert len(flush_threads()) == before + 1
    finally:
        agg.stop(rds)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_flush_thread_that_died_is_replaced(rds: redis.Redis, key_prefix: str) -> None:
    """The flag that replaced `is_alive()` is cleared however the thread ends."""
    agg = Aggregator()
    died = threading.Event()
    real_flush = agg.flush

    def flush_once_fatally(client: object) -> None:
        if not died.is_set():
            died.set()
            raise SystemExit  # past the loop's `except Exception`: the thread ends
        real_flush(client)

    agg.flush = flush_once_fatally  # type: ignore[method-assign]
    agg.add((f"{key_prefix}:metrics:test",), {"n": 1})
    agg.start(rds, 0.02)
    first = agg._thread
    assert first is not None
    first.join(5)
    assert died.is_set() and not first.is_alive() and agg._running == 0
    agg.start(rds, 0.02)  # the next task's call starts a working thread again
    try:
        assert agg._thread is not first and agg._thread is not None and agg._thread.is_alive()
        deadline = time.monotonic() + 5
        while rds.hget(f"{key_prefix}:metrics:test", "n") != b"1" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rds.hget(f"{key_prefix}:metrics:test", "n") == b"1"
    finally:
        agg.stop(rds)


GEVENT_STARTS = """
from gevent import monkey; monkey.patch_all()
import sys, greenlet, redis
from gevent.hub import Hub
from monitor.metrics import Aggregator
client = redis.Redis.from_url(sys.argv[1])
agg = Aggregator()
agg.start(client, 60)
trips = []
greenlet.settrace(lambda ev, args: trips.append(ev) if isinstance(args[1], Hub) else None)
for _ in range(1000):
    agg.start(client, 60)
greenlet.settrace(None)
agg.stop(client)
print(len(trips))
"""


def test_under_gevent_starting_the_running_thread_never_waits(redis_url: str) -> None:
    """`Thread.is_alive()` took a lock through the hub: 1000 calls were 1000 hub trips."""
    import subprocess
    import sys

    from config import ROOT

    out = subprocess.run([sys.executable, "-c", GEVENT_STARTS, redis_url], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "0", out.stdout + out.stderr[-2000:]


def _calls(client: redis.Redis) -> dict[str, int]:
    return {k: int(v["calls"]) for k, v in client.info("commandstats").items()}


def test_a_flush_adds_like_hincrby_in_one_script_call(rds: redis.Redis, key_prefix: str) -> None:
    """Every pending hash in one call (one HMGET and one HSET a hash inside it): fields add to
    what is there, new ones start at 0, big sums stay exact, zeros are not written."""
    task, site = f"{key_prefix}:metrics:task:a.b", f"{key_prefix}:metrics:site:a"
    rds.hset(task, mapping={"succeeded": 5, "bytes": 2**40})
    agg = Aggregator()
    agg.add((task, site), {"succeeded": 2, "bytes": 2**50, "http:200": 2, "failed": 0})
    agg.add((task,), {"latency_le:+Inf": 1})
    before = _calls(rds)
    agg.flush(rds)
    after = _calls(rds)
    assert after["cmdstat_eval"] - before.get("cmdstat_eval", 0) == 1
    assert "cmdstat_hincrby" not in after or after["cmdstat_hincrby"] == before["cmdstat_hincrby"]
    assert rds.hgetall(task) == {
        b"succeeded": b"7",
        b"bytes": str(2**40 + 2**50).encode(),
        b"http:200": b"2",
        b"latency_le:+Inf": b"1",
    }
    assert rds.hgetall(site) == {
        b"succeeded": b"2",
        b"bytes": str(2**50).encode(),
        b"http:200": b"2",
    }
    assert not agg.pending()
    agg.flush(rds)  # nothing pending: nothing sent
    assert _calls(rds)["cmdstat_eval"] == after["cmdstat_eval"]


def test_a_flush_on_a_cluster_writes_each_hash_on_its_own_slot(
    redis_cluster: object, key_prefix: str
) -> None:
    """The metric keys are untagged (spread over the slots): one script call a hash."""
    from utils.redis import get_redis

    client = get_redis(redis_cluster.url)  # type: ignore[attr-defined]
    keys = [f"{key_prefix}:metrics:task:t{i}" for i in range(6)]
    agg = Aggregator()
    for k in keys:
        agg.add((k,), {"succeeded": 3, "items": 4})
    agg.flush(client)
    for k in keys:
        assert client.hgetall(k) == {b"succeeded": b"3", b"items": b"4"}
