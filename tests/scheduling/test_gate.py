"""The redis gate against a real Redis, in this process: token spacing, caps, lease expiry;
each test on one Redis and on a Redis Cluster (`new_client`), where every scope of a site
shares its slot.

No assertion rests on how fast this machine runs: rates are per minute where a request must
wait (what it would wait shows as `Throttled`, past a small `max_sleep`), lease expiry moves
the leases' deadlines in Redis (`let_time_pass`), and the one real spacing test checks only
what no load can break (no request before its slot)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import cast

import pytest
from redis.crc import key_slot

from config import Settings
from exceptions import Throttled
from scheduling.gate import RedisGate, politeness_report
from scheduling.limits import parse_limits
from scheduling.throttle import Throttle


@pytest.fixture
def make_gate(redis_url: str, key_prefix: str, new_client):
    """make_gate(limits): a gate with a client of its own, as each worker has."""
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix)

    def make(limits: str, **kw) -> RedisGate:
        return RedisGate(parse_limits(limits), settings=settings, client=new_client(), **kw)

    return make


def let_time_pass(g: RedisGate, scope: str, seconds: float) -> None:
    """As if `seconds` had gone by on Redis's clock for the leases of `scope` (scores in µs)."""
    key = g.key(scope, "leases")
    leases = cast(list[tuple[bytes, float]], g.r.zrange(key, 0, -1, withscores=True))
    if leases:
        g.r.zadd(key, {m: score - seconds * 1e6 for m, score in leases}, xx=True)


def test_tokens_are_spaced_across_threads_and_gates(make_gate) -> None:
    """Two gates (as two workers would have) and 8 threads share 40/s: no request goes before
    its slot, so the 80 take at least 79/40 s however the threads are scheduled."""
    gates = [make_gate("s=40/s"), make_gate("s=40/s")]
    stamps: list[float] = []
    lock = threading.Lock()
    t0 = time.monotonic()

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
    assert len(stamps) == 80
    assert stamps[-1] - t0 >= 79 / 40, stamps[-1] - t0  # at most 40/s, whatever the load


def test_burst_lets_idle_time_through_then_spaces(make_gate) -> None:
    g = make_gate("s=10/m,burst=5", max_sleep=0.05)  # any wait past 50 ms raises Throttled
    for _ in range(5):
        g.before_request("s", "s.p.e")  # five back to back after idle time: no wait
    with pytest.raises(Throttled) as err:
        g.before_request("s", "s.p.e")
    assert err.value.retry_after > 3  # the sixth waits for its slot, 6 s after the first


def test_long_wait_raises_throttled_and_reserves_nothing(make_gate) -> None:
    g = make_gate("s=2/m", max_sleep=1)
    r = g.r
    g.before_request("s", "s.p.e")  # its slot is now; the next one is 30 s away
    tat = r.get(g.key("s", "tat"))
    with pytest.raises(Throttled) as err:
        g.before_request("s", "s.p.e")
    assert err.value.retry_after > 20
    assert r.get(g.key("s", "tat")) == tat  # a refused request reserved nothing
    sec, usec = r.time()
    slot = sec * 1_000_000 + usec + 500_000
    r.set(g.key("s", "tat"), slot)  # as if 29.5 s had gone by: the slot within max_sleep
    g.before_request("s", "s.p.e")  # so it sleeps until its slot instead of raising
    sec, usec = r.time()
    assert sec * 1_000_000 + usec >= slot  # not before it


def test_site_and_endpoint_limits_both_hold(make_gate) -> None:
    """A request passes every scope at once: the slower endpoint limit wins for it."""
    g = make_gate("s=60/m,burst=10; s.p.slow=2/m", max_sleep=0.05)
    g.before_request("s", "s.p.slow")
    with pytest.raises(Throttled) as err:
        g.before_request("s", "s.p.slow")  # the endpoint's next slot: 30 s away
    assert err.value.retry_after > 20
    for _ in range(6):
        g.before_request("s", "s.p.fast")  # only the site limit, with room for all six


def test_concurrency_cap_and_release(make_gate) -> None:
    g = make_gate("s=2", retry=0.5)
    assert g.admit("s", "s.p.e", "t1") == 0
    assert g.admit("s", "s.p.e", "t2") == 0
    wait = g.admit("s", "s.p.e", "t3")
    assert 0.25 <= wait <= 0.75
    assert g.admit("s", "s.p.e", "t1") == 0  # a redelivered task keeps its own lease
    g.release("s", "s.p.e", "t1")
    assert g.admit("s", "s.p.e", "t3") == 0


def test_caps_are_all_or_nothing(make_gate) -> None:
    g = make_gate("s=3; s.p.slow=1")
    assert g.admit("s", "s.p.slow", "a") == 0
    assert g.admit("s", "s.p.slow", "b") > 0  # endpoint cap full: site lease not taken either
    assert g.admit("s", "s.p.fast", "c") == 0
    assert g.admit("s", "s.p.fast", "d") == 0
    assert g.admit("s", "s.p.fast", "e") > 0  # site cap (3) full
    assert {m.decode() for m in g.r.zrange(g.key("s", "leases"), 0, -1)} == {"a", "c", "d"}


def test_expired_lease_is_purged(make_gate) -> None:
    """A task that never releases (its worker was killed) loses its slot after the lease TTL."""
    g = make_gate("s=1,lease=60s")
    assert g.admit("s", "s.p.e", "dead") == 0
    assert g.admit("s", "s.p.e", "live") > 0
    let_time_pass(g, "s", 59)
    assert g.admit("s", "s.p.e", "live") > 0
    let_time_pass(g, "s", 2)
    assert g.admit("s", "s.p.e", "live") == 0
    assert [m.decode() for m in g.r.zrange(g.key("s", "leases"), 0, -1)] == ["live"]


def test_requests_renew_the_running_tasks_lease(make_gate) -> None:
    g = make_gate("s=1,lease=60s")
    assert g.admit("s", "s.p.e", "long") == 0
    for _ in range(3):  # 120 s of work, a request every 40 s
        let_time_pass(g, "s", 40)
        g.before_request("s", "s.p.e")
    let_time_pass(g, "s", 40)
    assert g.admit("s", "s.p.e", "other") > 0  # still held: renewed by each request
    g.release("s", "s.p.e", "long")
    assert g.admit("s", "s.p.e", "other") == 0


def test_admit_refuses_while_the_rate_backlog_is_long(make_gate) -> None:
    """A task is not admitted to sit in a worker slot waiting for a token far away."""
    g = make_gate("s=5/s", max_sleep=0.3)
    r = g.r
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


def test_caps_are_shared_by_two_gates_over_every_scope_of_the_site(make_gate) -> None:
    """Two gates (two workers) share the site's and the endpoint's caps; every scope's keys
    are on the site's slot, so the one admit script takes them all, on a cluster too."""
    limits = "s=3,100/s; s.p=2; s.p.e=1,50/s"
    a, b = make_gate(limits), make_gate(limits)
    keys = [a.key(scope, kind) for scope in ("s", "s.p", "s.p.e") for kind in ("leases", "tat")]
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert a.admit("s", "s.p.e", "t1") == 0
    assert b.admit("s", "s.p.e", "t2") > 0  # s.p.e holds 1: t1's, taken through the other gate
    assert b.admit("s", "s.p.x", "t3") == 0
    assert a.admit("s", "s.p.y", "t4") > 0  # s.p holds 2: t1's and t3's
    a.release("s", "s.p.e", "t1")
    assert b.admit("s", "s.p.e", "t2") == 0
    assert {m.decode() for m in a.r.zrange(a.key("s", "leases"), 0, -1)} == {"t2", "t3"}


def test_a_rate_spaces_the_requests_of_two_gates(make_gate) -> None:
    """A request through one gate reserves the slot every scope's rate allows; the next one,
    through another gate, finds its slot a minute away and is re-queued, reserving nothing."""
    limits = "s=1/m; s.p.e=2/m"
    a, b = make_gate(limits, max_sleep=0.5), make_gate(limits, max_sleep=0.5)
    a.before_request("s", "s.p.e")  # idle until now: its slot is now
    tats = [a.r.get(a.key(scope, "tat")) for scope in ("s", "s.p.e")]
    assert all(tats)
    with pytest.raises(Throttled) as err:
        b.before_request("s", "s.p.e")
    assert err.value.retry_after > 30  # the site's slot: a minute after the first
    assert [b.r.get(b.key(scope, "tat")) for scope in ("s", "s.p.e")] == tats
    assert b.admit("s", "s.p.e", "t") > 30  # nor is a task admitted to wait for it


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.integration)])
def state_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    """The state store's URL: the private Redis, then a Redis Cluster (`redis+cluster://`)."""
    return request.getfixturevalue("redis_cluster").url if request.param == "cluster" else redis_url


def test_the_report_reads_every_scope_and_throttled_site(
    state_url: str, redis_url: str, key_prefix: str
) -> None:
    """`control.sh limits`: leases and reserved slots of every scope, the adaptive delay of
    every site, read from wherever their keys live (on a cluster: several sites' slots)."""
    s = Settings(redis_url=state_url, broker_url=redis_url, key_prefix=key_prefix,
                 limits="s=2,1/m; s.p.e=1; t=3",
                 throttle=True, throttle_start_delay=0.0)  # fmt: skip
    gate = RedisGate(parse_limits(s.limits), settings=s, throttle=Throttle(None, s))
    for site in ("s", "t"):
        assert gate.admit(site, f"{site}.p.e", f"{site}-task") == 0
        gate.before_request(site, f"{site}.p.e")
    report = politeness_report(s)
    rows = {r["scope"]: r for r in report["limits"]}
    assert [rows[n]["in_flight"] for n in ("s", "s.p.e", "t")] == [1, 1, 1]
    assert rows["s"]["backlog"] > 30  # the next slot: a minute after the first request
    assert [r["site"] for r in report["throttle"]["sites"]] == ["s", "t"]
