"""Holding (external_interface/resources/holding.py): a process keeps a member's Redis lease for
a few requests and lends it locally. Exclusive under concurrency (threads of one process, and
two processes' holdings), bounded by requests and by time, a ban applied at once, a killed
process's members back by lease expiry, idle and shutdown returns, and the Redis calls a
request saved. Real Redis (the session's server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from config import ROOT
from exceptions import LoginRequired
from external_interface.resources import holding
from external_interface.resources.base import Outcome, OutgoingRequest
from external_interface.resources.cookie import CookieProvider
from external_interface.resources.pool import Pool, PoolConfig
from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.models import Event, ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.rules import Verdict
from tests.conditions import wait_for


@pytest.fixture(autouse=True)
def _fresh_holdings() -> Any:
    holding.set_enabled(True)  # the directory's conftest turns it off for the engine's tests
    holding.forget()
    yield
    holding.forget()


def make(rds: redis.Redis, prefix: str, n: int = 0, **cfg: Any) -> Pool:
    config = PoolConfig(**{"hold_requests": 4, "hold_seconds": 10, "hold_idle": 10, "hold_wait": 0,
                           **cfg})  # fmt: skip
    pool = Pool("cookie", "shop", rds=rds, prefix=prefix, config=config, held=True)
    for i in range(n):
        pool.add({"cookies": {"session": f"secret-{i}"}}, f"c{i}")
    return pool


def held_of(pool: Pool) -> holding.Holding:
    h = holding.holdings()
    return next(x for x in h if x.pool.base == pool.base and x.pool._rds is pool._rds)


def test_a_member_serves_one_request_at_a_time_across_threads_and_processes(
    rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    """Two holdings (two clients: two processes' worth) and 6 threads each: a member is never
    lent to two requests at once, and every use is counted once."""
    first = make(rds, key_prefix, 3)
    other = redis.Redis.from_url(redis_url)
    second = make(other, key_prefix)
    in_use: set[str] = set()
    clash: list[str] = []
    done: Counter[str] = Counter()
    lock = threading.Lock()

    def work(pool: Pool) -> None:
        n = 0
        while n < 25:
            co = pool.checkout()
            if co.lease is None:
                continue
            mid = co.lease.id
            with lock:
                if mid in in_use:
                    clash.append(mid)
                in_use.add(mid)
            with lock:
                in_use.discard(mid)
                done[mid] += 1
            pool.release(co.lease, Verdict.NEUTRAL)
            n += 1

    threads = [threading.Thread(target=work, args=(p,)) for p in (first, second) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not clash
    assert sum(done.values()) == 12 * 25
    for p in (first, second):
        held_of(p).return_all()
    assert first.lent() == []
    assert sum(first.uses(m) or 0 for m in first.ids()) == 12 * 25  # summed, none lost
    other.close()


def test_bounded_by_requests_then_written_in_one_call(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 1, hold_requests=3)
    h = None
    for i in range(3):
        co = pool.checkout()
        assert co.lease is not None and co.lease.id == "c0" and co.local == (i > 0)
        assert co.lease.uses == i
        h = held_of(pool)
        pool.release(co.lease, Verdict.OK)
        if i < 2:  # still held: in Redis it is lent, no use written yet
            assert pool.lent() == ["c0"] and pool.uses("c0") == 0
    assert h is not None and h.calls == 2  # one checkout, one return for three requests
    assert pool.lent() == [] and pool.uses("c0") == 3
    assert pool.score("c0") == 5 + 3  # the score moved by the three successes' sum


def test_bounded_by_time_below_half_the_lease_ttl(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 1, hold_seconds=100, lease_ttl=1.0)
    co = pool.checkout()
    assert co.lease is not None
    pool.release(co.lease, Verdict.OK)
    assert pool.lent() == ["c0"]
    # hold_seconds 100 is cut to half the 1 s TTL: the reaper gives it back well before expiry
    wait_for(lambda: pool.lent() == [], 5, "the held member back at its time bound")
    assert pool.uses("c0") == 1 and pool.counters().get("reclaimed", 0) == 0


def test_a_ban_is_applied_at_once_and_the_member_never_serves_again(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 2)
    co = pool.checkout()
    assert co.lease is not None
    mid = co.lease.id
    pool.release(co.lease, Verdict.OK)
    again = pool.checkout()
    assert again.lease is not None and again.lease.id == mid and again.local
    assert pool.release(again.lease, Verdict.BANNED)[0] == "retired"
    assert mid not in pool.members() and mid in pool.retired()
    assert mid not in held_of(pool).held()
    nxt = pool.checkout()
    assert nxt.lease is not None and nxt.lease.id != mid


def test_the_provider_raises_on_a_ban_of_a_held_session(rds: redis.Redis, key_prefix: str) -> None:
    prov = CookieProvider(
        "shop", rds=rds, prefix=key_prefix, config=PoolConfig(hold_requests=4, hold_idle=10)
    )
    prov.pool.add({"cookies": {"s": "x"}}, "c0")
    task = type("T", (), {"avoid": set()})()
    req = OutgoingRequest("GET", "http://shop/")
    prov.prepare(req, task)
    prov.feedback(req, Outcome(0.01, status=200), task)
    req = OutgoingRequest("GET", "http://shop/")
    prov.prepare(req, task)  # the same session, lent from the holding
    with pytest.raises(LoginRequired):
        prov.feedback(req, Outcome(0.01, status=401), task)
    assert prov.pool.members() == set() and "c0" in prov.pool.retired()


def test_idle_members_go_back(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 2, hold_idle=0.3)
    co = pool.checkout()
    assert co.lease is not None
    pool.release(co.lease, Verdict.OK)
    assert pool.lent() == [co.lease.id]
    wait_for(lambda: pool.lent() == [], 5, "the idle member back in the pool")
    assert pool.uses(co.lease.id) == 1 and len(held_of(pool)) == 0


def test_shutdown_returns_everything(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 2)
    a, b = pool.checkout(), pool.checkout()
    assert a.lease is not None and b.lease is not None
    pool.release(a.lease, Verdict.OK)  # held, idle
    assert sorted(pool.lent()) == ["c0", "c1"]
    assert holding.return_all() == 1  # the idle one now; b is in flight
    assert pool.lent() == [b.lease.id]
    pool.release(b.lease, Verdict.OK)  # in flight at shutdown: back with its feedback
    assert pool.lent() == [] and pool.uses("c0") == 1 and pool.uses("c1") == 1


CRASH = """
import sys, time
import redis
from external_interface.resources.pool import Pool, PoolConfig
from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.models import Event, ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.rules import Verdict
cfg = PoolConfig(hold_requests=8, hold_seconds=10, hold_idle=10, lease_ttl=1.0)
pool = Pool("cookie", "shop", rds=redis.Redis.from_url(sys.argv[1]), prefix=sys.argv[2],
            config=cfg, held=True)
co = pool.checkout()
pool.release(co.lease, Verdict.OK)
print(co.lease.id, flush=True)
time.sleep(60)
"""


def test_a_killed_process_s_members_come_back_by_lease_expiry(
    rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 1, hold_requests=1)
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH, redis_url, key_prefix],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().decode().strip() == "c0"
        assert pool.lent() == ["c0"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_for(lambda: (pool.reclaim(), pool.lent() == [])[1], 10, "the lease expired")
    co = pool.checkout()
    assert co.lease is not None and co.lease.id == "c0"


def test_hold_requests_1_is_a_checkout_and_a_return_per_request(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 2, hold_requests=1)
    for _ in range(4):
        co = pool.checkout()
        assert co.lease is not None and not co.local
        pool.release(co.lease, Verdict.OK)
        assert pool.lent() == []
    assert holding.holdings() == [] and (pool.uses("c0") or 0) + (pool.uses("c1") or 0) == 4


def calls(rds: redis.Redis) -> int:
    """Commands the server ran so far, scripts' own included (INFO commandstats)."""
    return sum(int(v["calls"]) for v in rds.info("commandstats").values())


def test_holding_cuts_the_redis_commands_a_request(rds: redis.Redis, key_prefix: str) -> None:
    spent = {}
    for n in (1, 8):
        pool = make(rds, f"{key_prefix}{n}", 4, hold_requests=n)
        before = calls(rds)
        for _ in range(64):
            co = pool.checkout()
            assert co.lease is not None
            pool.release(co.lease, Verdict.OK)
        holding.return_all()
        spent[n] = calls(rds) - before
    assert spent[8] * 4 < spent[1], spent


def test_a_held_proxy_s_successes_reach_the_global_score_in_one_call(
    rds: redis.Redis, key_prefix: str
) -> None:
    """`record(times=n)` is n successes (haipproxy's rule applied n times), and the channel's
    holding writes them with the proxy's return."""
    one, many = GlobalPool(rds, key_prefix), GlobalPool(rds, key_prefix + "m")
    for gp in (one, many):
        gp.admit(ProxyAddress.parse("http://127.0.0.1:9"), 0.05)
    for _ in range(12):
        one.record("127.0.0.1:9", Event.SUCCESS, 0.1)
    many.record("127.0.0.1:9", Event.SUCCESS, 0.1, times=12)
    score = one.score("127.0.0.1:9")
    assert score is not None and score > 15 and many.score("127.0.0.1:9") == score

    gp = GlobalPool(rds, key_prefix + "h")
    gp.admit(ProxyAddress.parse("http://127.0.0.1:9"), 0.05)
    ch = ChannelPool("shop", gp, held=True)
    ch.refill()
    held = ch.holding()
    assert held is not None
    for _ in range(3):
        lease = ch.checkout()
        assert lease is not None
        assert held.note(lease, successes=1, last_elapsed=0.1)
        ch.release(lease, Event.SUCCESS)
    assert gp.score("127.0.0.1:9") == 5  # still held: nothing written yet
    held.return_all()
    assert gp.score("127.0.0.1:9") == 8 and ch.idle() == [("127.0.0.1:9", 3)]


def test_an_empty_pool_is_asked_once_in_a_moment(rds: redis.Redis, key_prefix: str) -> None:
    """Tasks waiting for an empty pool: the first asks Redis, the next ones within
    `EMPTY_FOR` are told to wait without a call; a member back in the pool ends that."""
    pool = make(rds, key_prefix, 1, hold_requests=2)
    a = pool.checkout()
    assert a.lease is not None
    h = held_of(pool)
    assert pool.checkout().lease is None and h.calls == 2
    nothing = pool.checkout()
    assert nothing.lease is None and nothing.wait is not None and h.calls == 2
    pool.release(a.lease, Verdict.OK)  # held: the one member is lent from here again
    again = pool.checkout()
    assert again.lease is not None and again.local and h.calls == 2
    pool.release(again.lease, Verdict.OK)  # its second request: back to the pool
    assert h.calls == 3 and pool.checkout().lease is not None


def test_a_take_with_nothing_free_waits_for_a_member_busy_here(
    rds: redis.Redis, key_prefix: str
) -> None:
    """The pool empty and the one member held here in use: a second request waits (up to
    `hold_wait`) for it to come back from its request and gets it from here, no Redis call;
    with nothing held here it does not wait at all."""
    pool = make(rds, key_prefix, 1, hold_wait=5)
    a = pool.checkout()
    assert a.lease is not None
    h = held_of(pool)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(pool.checkout()))
    t.start()
    wait_for(lambda: h.waited == 1, 5, "the second checkout waiting")
    assert not got  # waiting for the member in use
    pool.release(a.lease, Verdict.OK)
    t.join(5)
    assert got and got[0].lease is not None and got[0].lease.id == a.lease.id and got[0].local
    assert h.calls == 2  # the first checkout and the empty pool's answer: none for the wait
    empty = make(rds, f"{key_prefix}:other", 0, hold_wait=5)
    start = time.monotonic()
    assert empty.checkout().lease is None and time.monotonic() - start < 1
    assert held_of(empty).waited == 0


def test_a_take_that_waits_gives_up_after_hold_wait(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 1, hold_wait=0.3)
    assert pool.checkout().lease is not None
    start = time.monotonic()
    co = pool.checkout()
    assert co.lease is None and 0.25 <= time.monotonic() - start < 2
    assert held_of(pool).waited == 1


def test_a_pool_found_empty_again_and_again_is_believed_longer_each_time(
    rds: redis.Redis, key_prefix: str
) -> None:
    """Each "nothing ready" in a row doubles how long it is believed (0.2 s, then 0.4, 0.8,
    at most 1 s): a pool the fleet keeps drained is asked about once a second a process, not
    five times; a checkout that lends starts again at 0.2 s."""
    pool = make(rds, key_prefix, 1)
    a = pool.checkout()
    assert a.lease is not None
    h = held_of(pool)
    spans = []
    for _ in range(5):
        h._empty_until = 0.0  # the last answer's belief over
        assert pool.checkout().lease is None
        spans.append(round(h._empty_until - time.monotonic(), 1))
    assert spans == [0.2, 0.4, 0.8, 1.0, 1.0] and h.calls == 6
    pool.release(a.lease, Verdict.OK)  # held here: lent again from here, no call
    pool.release(pool.checkout().lease, Verdict.OK)  # type: ignore[arg-type]
    holding.return_all()  # back to the pool: the next checkout lends from Redis
    h.closing = False
    assert pool.checkout().lease is not None
    h._empty_until = 0.0
    assert pool.checkout().lease is None
    assert round(h._empty_until - time.monotonic(), 1) == 0.2
