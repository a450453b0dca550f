"""The redis gate against a real Redis, in this process: token spacing, caps, lease expiry."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from config import Settings
from exceptions import Throttled
from scheduling.ratelimit import RedisGate, parse_limits


@pytest.fixture
def make_gate(redis_url: str, key_prefix: str):
    client = redis.Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix)

    def make(limits: str, **kw) -> RedisGate:
        return RedisGate(parse_limits(limits), settings=settings, client=client, **kw)

    yield make
    client.close()


def test_tokens_are_spaced_across_threads_and_gates(make_gate) -> None:
    """Two gates (as two workers would have) and 8 threads share 40/s: requests go at 40/s."""
    gates = [make_gate("s=40/s"), make_gate("s=40/s")]
    stamps: list[float] = []
    lock = threading.Lock()

    def hammer(g: RedisGate) -> None:
        for _ in range(10):
            g.before_request("s", "s.p.e")
            with lock:
                stamps.append(time.monotonic())

    threads = [threading.Thread(target=hammer, args=(gates[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stamps.sort()
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    assert len(stamps) == 80
    assert 36 <= rate <= 44, rate


def test_burst_lets_idle_time_through_then_spaces(make_gate) -> None:
    g = make_gate("s=10/s,burst=5")
    t0 = time.monotonic()
    for _ in range(5):
        g.before_request("s", "s.p.e")
    assert time.monotonic() - t0 < 0.1  # five back to back after idle time
    g.before_request("s", "s.p.e")
    assert time.monotonic() - t0 >= 0.08  # the sixth waits for its slot


def test_long_wait_raises_throttled_and_reserves_nothing(make_gate, redis_url) -> None:
    g = make_gate("s=2/s", max_sleep=0.3)
    r = redis.Redis.from_url(redis_url)
    g.before_request("s", "s.p.e")  # its slot is now; the next one is 0.5 s away
    tat = r.get(g.key("s", "tat"))
    with pytest.raises(Throttled) as err:
        g.before_request("s", "s.p.e")
    assert err.value.retry_after > 0.3
    assert r.get(g.key("s", "tat")) == tat  # a refused request reserved nothing
    time.sleep(0.25)
    t0 = time.monotonic()
    g.before_request("s", "s.p.e")  # 0.25 s away now: within max_sleep, so it sleeps
    assert 0.15 <= time.monotonic() - t0 <= 0.4


def test_site_and_endpoint_limits_both_hold(make_gate) -> None:
    """A request passes every scope at once: the slower endpoint limit wins for it."""
    g = make_gate("s=100/s; s.p.slow=10/s")
    t0 = time.monotonic()
    for _ in range(6):
        g.before_request("s", "s.p.slow")
    assert time.monotonic() - t0 >= 0.45
    t1 = time.monotonic()
    for _ in range(6):
        g.before_request("s", "s.p.fast")  # only the site limit
    assert time.monotonic() - t1 < 0.2


def test_concurrency_cap_and_release(make_gate) -> None:
    g = make_gate("s=2", retry=0.5)
    assert g.admit("s", "s.p.e", "t1") == 0
    assert g.admit("s", "s.p.e", "t2") == 0
    wait = g.admit("s", "s.p.e", "t3")
    assert 0.25 <= wait <= 0.75
    assert g.admit("s", "s.p.e", "t1") == 0  # a redelivered task keeps its own lease
    g.release("s", "s.p.e", "t1")
    assert g.admit("s", "s.p.e", "t3") == 0


def test_caps_are_all_or_nothing(make_gate, redis_url) -> None:
    g = make_gate("s=3; s.p.slow=1")
    assert g.admit("s", "s.p.slow", "a") == 0
    assert g.admit("s", "s.p.slow", "b") > 0  # endpoint cap full: site lease not taken either
    assert g.admit("s", "s.p.fast", "c") == 0
    assert g.admit("s", "s.p.fast", "d") == 0
    assert g.admit("s", "s.p.fast", "e") > 0  # site cap (3) full
    r = redis.Redis.from_url(redis_url)
    assert {m.decode() for m in r.zrange(g.key("s", "leases"), 0, -1)} == {"a", "c", "d"}


def test_expired_lease_is_purged(make_gate, redis_url) -> None:
    """A task that never releases (its worker was killed) loses its slot after the lease TTL."""
    g = make_gate("s=1,lease=400ms")
    assert g.admit("s", "s.p.e", "dead") == 0
    assert g.admit("s", "s.p.e", "live") > 0
    time.sleep(0.45)
    assert g.admit("s", "s.p.e", "live") == 0
    r = redis.Redis.from_url(redis_url)
    assert [m.decode() for m in r.zrange(g.key("s", "leases"), 0, -1)] == ["live"]


def test_requests_renew_the_running_tasks_lease(make_gate) -> None:
    g = make_gate("s=1,10/s,lease=400ms")
    assert g.admit("s", "s.p.e", "long") == 0
    for _ in range(4):  # 0.6 s of work, a request every 0.15 s
        time.sleep(0.15)
        g.before_request("s", "s.p.e")
    assert g.admit("s", "s.p.e", "other") > 0  # still held: renewed by each request
    g.release("s", "s.p.e", "long")
    assert g.admit("s", "s.p.e", "other") == 0


def test_admit_refuses_while_the_rate_backlog_is_long(make_gate, redis_url) -> None:
    """A task is not admitted to sit in a worker slot waiting for a token far away."""
    g = make_gate("s=5/s", max_sleep=0.3)
    r = redis.Redis.from_url(redis_url)
    sec, usec = r.time()
    r.set(g.key("s", "tat"), sec * 1_000_000 + usec + 2_000_000)  # 2 s of reserved slots
    wait = g.admit("s", "s.p.e", uuid.uuid4().hex)
    assert 1.8 <= wait <= 2.5
    r.delete(g.key("s", "tat"))
    assert g.admit("s", "s.p.e", uuid.uuid4().hex) == 0


def test_unlimited_endpoints_touch_nothing(make_gate) -> None:
    g = make_gate("other=1/s")
    assert g.admit("s", "s.p.e", "x") == 0
    g.before_request("s", "s.p.e")
    g.release("s", "s.p.e", "x")
